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
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use topspin::codec::RawCodec;
use topspin::{Channel, Code, Request};
use topspin_proto::frame::Frame;
use topspin_proto::preface::PREFACE;
use topspin_proto::Settings;

/// A server that completes the handshake, then reads and ignores everything — or, with
/// `hang_up`, reads a little and closes the connection.
async fn fake_server(hang_up: bool) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut hello = PREFACE.to_vec();
                hello.extend_from_slice(&Frame::Settings(Settings::default()).to_bytes());
                if sock.write_all(&hello).await.is_err() {
                    return;
                }
                let mut buf = vec![0u8; 64 * 1024];
                if hang_up {
                    let _ = sock.read(&mut buf).await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    return;
                }
                while matches!(sock.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    format!("tcp://{addr}")
}

#[tokio::test]
async fn a_caller_reading_its_own_reply_sees_the_connection_close() {
    let ch = Channel::connect(fake_server(true).await).await.unwrap();
    let err = within(10, unary(&ch, UNARY, "x")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
}

/// Lone calls (read by their callers) mixed with calls from other tasks, deadlines passing,
/// callers that give up and streams, on both runtimes and transports: every call ends as it
/// should, and promptly (a wake-up lost between a caller and the connection's task would
/// leave a call waiting for ever).
#[test]
fn lone_calls_read_by_their_callers_mix_with_everything_else() {
    for multi in [false, true] {
        let rt = if multi {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
        .unwrap();
        rt.block_on(async {
            for t in BOTH {
                let probe = Probe::default();
                let server = serve(builder(probe), t).await;
                let ch = server.channel().await;
                within(60, async {
                    for round in 0..40 {
                        // Alone: its caller reads the reply.
                        for i in 0..20 {
                            let body = format!("{round}.{i}");
                            assert_eq!(unary(&ch, UNARY, &body).await.unwrap(), bytes(&body));
                        }
                        // Another task's calls join while one is read by its caller.
                        let other = tokio::spawn({
                            let ch = ch.clone();
                            async move {
                                for i in 0..5 {
                                    let body = format!("other {round}.{i}");
                                    assert_eq!(
                                        unary(&ch, UNARY, &body).await.unwrap(),
                                        bytes(&body)
                                    );
                                }
                            }
                        });
                        for i in 0..5 {
                            let body = format!("mine {round}.{i}");
                            assert_eq!(unary(&ch, UNARY, &body).await.unwrap(), bytes(&body));
                        }
                        other.await.unwrap();
                        match round % 4 {
                            // A deadline passes while its caller reads for itself.
                            0 => {
                                let r = ch
                                    .unary(
                                        RawCodec,
                                        SLOW,
                                        Request::new(bytes("late"))
                                            .with_timeout(Duration::from_millis(20)),
                                    )
                                    .await
                                    .unwrap_err();
                                assert_eq!(r.code(), Code::DeadlineExceeded, "{r}");
                            }
                            // A caller gives up (its future is dropped) while reading for
                            // itself, possibly just after the reply woke it.
                            1 => {
                                let give_up = Duration::from_micros(50 + 100 * round as u64);
                                let _ =
                                    tokio::time::timeout(give_up, unary(&ch, UNARY, "maybe")).await;
                            }
                            // A stream in between.
                            2 => {
                                let mut s = ch
                                    .server_streaming(RawCodec, SERVER_STREAM, bytes("3"))
                                    .await
                                    .unwrap()
                                    .into_inner();
                                let mut n = 0;
                                while s.message().await.unwrap().is_some() {
                                    n += 1;
                                }
                                assert_eq!(n, 3);
                            }
                            _ => {
                                let e = unary(&ch, FAIL, "NOT_FOUND:gone").await.unwrap_err();
                                assert_eq!(e.code(), Code::NotFound);
                            }
                        }
                    }
                })
                .await;
                server.stop().await;
            }
        });
    }
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
    for t in BOTH {
        let server = serve(builder(Probe::default()), t).await;
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
    }
}
