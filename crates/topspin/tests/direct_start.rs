//! A call on a quiet connection is started and written by its caller, not by the connection's
//! task (client/conn.rs `start_direct`), and its caller reads the reply too while the call is
//! the connection's only one (connection/mod.rs `read_inline`). What the task would have done
//! on the way must still happen: the call's deadline is enforced by the client even when the
//! server never answers (the task is woken to arm its timer), calls started while others are
//! open all arrive, and whatever arrives while a caller reads for itself — or after it stops —
//! is read by someone.

mod common;

use common::*;
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::{Channel, Code, Request};

#[tokio::test]
async fn a_caller_reading_its_own_reply_sees_the_connection_close() {
    let ch = Channel::connect(fake_server(true).await).await.unwrap();
    let err = within(10, unary(&ch, UNARY, "x")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
}

/// Lone calls mixed with calls from other tasks, deadlines passing, callers that give up and
/// streams (see `common::lone_calls_mixed`); `tests/inline_reads.rs` runs the same with the
/// spin off, where lone calls' callers read their replies themselves.
#[test]
fn lone_calls_mix_with_everything_else() {
    lone_calls_mixed();
}

#[tokio::test]
async fn a_directly_started_call_still_times_out_when_the_server_never_answers() {
    let ch = Channel::connect(fake_server(false).await).await.unwrap();
    // The first call finds the connection quiet: its caller writes it.
    for i in 0..3 {
        let err = within(
            10,
            ch.unary(
                RawCodec,
                UNARY,
                Request::new(bytes("lost")).with_timeout(Duration::from_millis(100 + 50 * i)),
            ),
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    }
}

#[tokio::test]
async fn calls_started_while_others_are_open_all_complete() {
    each_transport(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.channel().await;
        for round in 0..20 {
            let calls = (0..32).map(|i| {
                let ch = ch.clone();
                async move {
                    let body = format!("{round}-{i}");
                    assert_eq!(unary(&ch, UNARY, &body).await.unwrap(), bytes(&body));
                }
            });
            within(10, futures_util::future::join_all(calls)).await;
        }
        server.stop().await;
    })
    .await;
}
