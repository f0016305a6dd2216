//! The WebSocket carriage of a server: a valid upgrade request, then arbitrary bytes as the
//! client's frames (masking, opcodes, fragments, control frames, close codes), read through the
//! stream the topspin engine would read. Checks that nothing panics and the read ends.
//! Input layout: `topspin::fuzzing::websocket`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| topspin::fuzzing::websocket(data));
