//! The gRPC face's wire parsing, as a peer reaches it: `grpc-timeout` values, metadata read
//! from HTTP/2 headers, and the one message deframer as the server's face and the client mode
//! use it (each charging a memory budget), with compressed messages (gzip, zstd) under small
//! limits. Checks that nothing panics, every message stays within its limit, the budget is given
//! back whole, and a chunk's credit never exceeds its bytes and leaves a rest exactly when a
//! message is under way. Input layout: `topspin::fuzzing::grpc_wire`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| topspin::fuzzing::grpc_wire(data));
