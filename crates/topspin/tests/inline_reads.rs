//! With the spin off (one CPU, or `TOPSPIN_SPIN=0` as here), the caller of a connection's
//! only unary call reads the reply itself instead of the connection's task
//! (connection/mod.rs `read_inline`, route.rs). Whatever arrives while it reads for itself —
//! or after it stops — must still be read by someone: every call ends as it should, and
//! promptly.
//!
//! One test function, so that the environment is set before anything reads it.

mod common;

use common::*;
use std::time::Duration;
use topspin::{Channel, Code, Request};

#[test]
fn callers_that_read_their_own_replies() {
    // Read once per process, before the first connection; nothing else runs yet.
    std::env::set_var("TOPSPIN_SPIN", "0");
    lone_calls_mixed();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // The server hangs up while the caller reads for itself.
        let ch = Channel::connect(fake_server(true).await).await.unwrap();
        let err = within(10, unary(&ch, UNARY, "x")).await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
        // The server never answers: the deadline still ends the call.
        let ch = Channel::connect(fake_server(false).await).await.unwrap();
        for i in 0..3 {
            let err = within(
                10,
                ch.unary(
                    topspin::codec::RawCodec,
                    UNARY,
                    Request::new(bytes("lost")).with_timeout(Duration::from_millis(50 + 50 * i)),
                ),
            )
            .await
            .unwrap_err();
            assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
        }
    });
}
