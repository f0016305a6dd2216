//! Graceful shutdown: go-away, in-flight calls finish within the grace period, the rest end.

mod common;

use bytes::Bytes;
use common::*;
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::{Code, Request, Response, Server};

fn gated() -> (
    topspin::ServerBuilder,
    std::sync::Arc<tokio::sync::Notify>,
    std::sync::Arc<tokio::sync::Notify>,
) {
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let (s, r) = (started.clone(), release.clone());
    let b = Server::builder()
        .unary(UNARY, RawCodec, |req: Request<Bytes>| async move {
            Ok(Response::new(req.into_inner()))
        })
        .unary("/t.G/Gated", RawCodec, move |req: Request<Bytes>| {
            let (s, r) = (s.clone(), r.clone());
            async move {
                s.notify_one();
                r.notified().await;
                Ok(Response::new(req.into_inner()))
            }
        });
    (b, started, release)
}

#[tokio::test]
async fn in_flight_calls_finish_within_the_grace_period() {
    for t in BOTH {
        let (b, started, release) = gated();
        let server = serve(b, t).await;
        let ch = server.channel().await;
        let call = tokio::spawn({
            let ch = ch.clone();
            async move { unary(&ch, "/t.G/Gated", "in flight").await }
        });
        within(5, started.notified()).await;
        let handle = server.handle.clone();
        let shutdown = tokio::spawn(async move { handle.shutdown(Duration::from_secs(30)).await });
        // New calls are refused once the go-away arrives (no new connections are accepted).
        within(5, async {
            loop {
                match unary(&ch, UNARY, "new").await {
                    Err(e) => {
                        assert_eq!(e.code(), Code::Unavailable, "{e}");
                        break;
                    }
                    Ok(_) => tokio::task::yield_now().await,
                }
            }
        })
        .await;
        release.notify_one();
        assert_eq!(within(5, call).await.unwrap().unwrap(), bytes("in flight"));
        within(5, shutdown).await.unwrap();
        within(5, server.task).await.unwrap();
    }
}

#[tokio::test]
async fn calls_past_the_grace_period_end_unavailable() {
    let (b, started, _release) = gated();
    let server = serve(b, Transport::Tcp).await;
    let ch = server.channel().await;
    let call = tokio::spawn({
        let ch = ch.clone();
        async move { unary(&ch, "/t.G/Gated", "stuck").await }
    });
    within(5, started.notified()).await;
    within(5, server.handle.shutdown(Duration::from_millis(200))).await;
    let err = within(5, call).await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("shut down"), "{err}");
    within(5, server.task).await.unwrap();
}

#[tokio::test]
async fn serve_with_shutdown_stops_on_a_signal() {
    let (b, _, _) = gated();
    let server = b.bind(listen_addr(Transport::Unix)).await.unwrap();
    let addr = server.local_addr().clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.serve_with_shutdown(
        async {
            let _ = rx.await;
        },
        Duration::from_secs(1),
    ));
    let ch = topspin::Channel::connect(addr).await.unwrap();
    assert_eq!(unary(&ch, UNARY, "hi").await.unwrap(), bytes("hi"));
    tx.send(()).unwrap();
    within(5, task).await.unwrap();
}
