//! A dropped connection fails calls in flight with UNAVAILABLE; the next call reconnects.

mod common;

use common::*;
use std::time::Duration;
use topspin::{Channel, Code, Endpoint};

#[tokio::test]
async fn in_flight_calls_fail_and_the_next_call_reconnects() {
    let probe = Probe::default();
    let server = serve(builder(probe.clone()), Transport::Tcp).await;
    let addr = server.addr.clone();
    let ch = Endpoint::new(addr.clone())
        .unwrap()
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let call = tokio::spawn({
        let ch = ch.clone();
        async move { unary(&ch, SLOW, "in flight").await }
    });
    within(5, probe.started.notified()).await;
    // Kill the server without grace.
    within(5, server.handle.shutdown(Duration::ZERO)).await;
    let err = within(5, call).await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(!err.message().is_empty());
    // While nothing listens, calls fail fast with UNAVAILABLE naming the address.
    let err = unary(&ch, UNARY, "x").await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains(&addr.to_string()), "{err}");
    // A new server on the same address: the channel reconnects (after its backoff).
    let restarted = builder(Probe::default()).bind(addr.clone()).await.unwrap();
    let handle = restarted.shutdown_handle();
    tokio::spawn(restarted.serve());
    within(10, async {
        loop {
            match unary(&ch, UNARY, "again").await {
                Ok(b) => break assert_eq!(b, bytes("again")),
                Err(e) => {
                    assert_eq!(e.code(), Code::Unavailable, "{e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    })
    .await;
    handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn lazy_channel_connects_on_first_call_and_backs_off() {
    let addr = listen_addr(Transport::Unix);
    let ch = Channel::lazy(addr.clone()).unwrap();
    // Nothing listens yet.
    let e1 = unary(&ch, UNARY, "x").await.unwrap_err();
    assert_eq!(e1.code(), Code::Unavailable);
    assert!(e1.message().contains("could not connect"), "{e1}");
    // The next attempt is throttled by backoff: it fails fast without trying.
    let e2 = unary(&ch, UNARY, "x").await.unwrap_err();
    assert!(e2.message().contains("next connection attempt in"), "{e2}");
    let server = serve_at(builder(Probe::default()), &addr).await;
    within(10, async {
        loop {
            match unary(&ch, UNARY, "up").await {
                Ok(b) => break assert_eq!(b, bytes("up")),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await;
    server.stop().await;
}

async fn serve_at(b: topspin::ServerBuilder, addr: &str) -> TestServer {
    let server = b.bind(addr).await.unwrap();
    let addr = server.local_addr().clone();
    let handle = server.shutdown_handle();
    let task = tokio::spawn(server.serve());
    TestServer { addr, handle, task }
}

#[tokio::test]
async fn a_connection_that_drops_fails_calls_in_flight_with_the_reason() {
    let probe = Probe::default();
    let server = serve(builder(probe.clone()), Transport::Unix).await;
    let ch = server.channel().await;
    let call = tokio::spawn({
        let ch = ch.clone();
        async move { unary(&ch, SLOW, "dropped").await }
    });
    within(5, probe.started.notified()).await;
    // Aborting the server drops every connection at once, as a crash would.
    server.task.abort();
    let err = within(5, call).await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("closed"), "says why: {err}");
}
