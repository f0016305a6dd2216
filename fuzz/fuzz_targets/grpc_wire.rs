//! The gRPC face's wire parsing, as a peer reaches it: `grpc-timeout` values, metadata read
//! from HTTP/2 headers, and the message deframers of the server (charging a memory budget) and
//! of the client mode, with compressed messages (gzip, zstd) under small limits. Checks that
//! nothing panics, every message stays within its limit, the budget is given back whole, and
//! the client's credit never exceeds the bytes it got. Input layout: `topspin::fuzzing::grpc_wire`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| topspin::fuzzing::grpc_wire(data));
