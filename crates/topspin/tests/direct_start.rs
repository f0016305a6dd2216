//! A call on a quiet connection is started and written by its caller, not by the connection's
//! task (client/conn.rs `start_direct`). What the task would have done on the way must still
//! happen: the call's deadline is enforced by the client even when the server never answers
//! (the task is woken to arm its timer), and calls started while others are open all arrive.

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

/// A server that completes the handshake, then reads and ignores everything.
async fn black_hole() -> String {
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
                while matches!(sock.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    format!("tcp://{addr}")
}

#[tokio::test]
async fn a_directly_started_call_still_times_out_when_the_server_never_answers() {
    let ch = Channel::connect(black_hole().await).await.unwrap();
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
