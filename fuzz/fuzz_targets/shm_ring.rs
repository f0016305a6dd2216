//! The shared-memory transport's rings against a hostile peer: the peer's head, tail, closed
//! and waiting words and the ring's bytes come from the input, in rounds, with the server
//! reading and writing between them. Checks that nothing panics (no access outside the
//! mapping: ASan) and that bad indices are only ever `InvalidData`. Input layout:
//! `topspin::fuzzing::shm_ring`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| topspin::fuzzing::shm_ring(data));
