//! Peers that advertise INITIAL_CALL_WINDOW = 0 or MAX_CONCURRENT_CALLS = 0, over TCP
//! (protocol.md §7, §9; spec-review rows 1 and 5).

mod common;

use bytes::Bytes;
use common::*;
use futures_util::stream;
use std::time::{Duration, Instant};
use topspin::codec::RawCodec;
use topspin::{Code, Config, Endpoint, Request};

/// Every call kind, once each, with bodies of `size` bytes (large ones are split).
async fn every_kind(ch: &topspin::Channel, size: usize) {
    let body = "x".repeat(size);
    assert_eq!(
        within(10, unary(ch, UNARY, &body)).await.unwrap(),
        bytes(&body)
    );
    let mut s = within(
        10,
        ch.server_streaming(RawCodec, SERVER_STREAM, Request::new(bytes("20:3000"))),
    )
    .await
    .unwrap()
    .into_inner();
    let mut n = 0;
    while let Some(m) = within(10, s.message()).await.unwrap() {
        assert_eq!(m.len(), 3000);
        n += 1;
    }
    assert_eq!(n, 20);
    let parts = stream::iter(["a", "bc", "", "def"].map(bytes));
    let r = within(
        10,
        ch.client_streaming(RawCodec, CLIENT_STREAM, Request::new(parts)),
    )
    .await
    .unwrap();
    assert_eq!(r.into_inner(), bytes("abcdef"));
    let (tx, requests) = feed();
    let mut replies = within(10, ch.streaming(RawCodec, BIDI, Request::new(requests)))
        .await
        .unwrap()
        .into_inner();
    for i in 0..10 {
        tx.send(Bytes::from(format!("m{i}"))).unwrap();
        let got = within(10, replies.message()).await.unwrap().unwrap();
        assert_eq!(got, Bytes::from(format!("echo:m{i}")));
    }
    drop(tx);
    assert_eq!(within(10, replies.message()).await.unwrap(), None);
}

/// Regression: with a window of 0 the server ended every unary call at once with INTERNAL
/// "flow control: wait for the peer to grant credit", and the client failed its unary request
/// the same way. The receiver now grants the first credit and senders wait.
#[tokio::test]
async fn calls_work_when_either_side_advertises_window_zero() {
    let zero = Config::default()
        .with_initial_call_window(0)
        .with_max_frame_size(16 * 1024);
    for (server_cfg, client_cfg) in [
        (zero.clone(), Config::default()),
        (Config::default(), zero.clone()),
        (zero.clone(), zero.clone()),
    ] {
        let server = serve(builder(Probe::default()).config(server_cfg), Transport::Tcp).await;
        let ch = Endpoint::new(server.addr.clone())
            .unwrap()
            .config(client_cfg)
            .connect()
            .await
            .unwrap();
        every_kind(&ch, 10).await;
        every_kind(&ch, 100_000).await; // split messages too
        server.stop().await;
    }
}

/// Regression: a client that saw MAX_CONCURRENT_CALLS = 0 queued new calls for ever (the
/// deadline only started when the CALL was sent). It now fails them with UNAVAILABLE at once.
#[tokio::test]
async fn a_server_that_takes_no_calls_fails_them_with_unavailable() {
    let server = serve(
        builder(Probe::default()).config(Config::default().with_max_concurrent_calls(0)),
        Transport::Tcp,
    )
    .await;
    let ch = server.channel().await;
    let t0 = Instant::now();
    let err = within(5, unary(&ch, UNARY, "hi")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("max_concurrent_calls is 0"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(4));
    server.stop().await;
}
