//! Deadlines: sent to the server, enforced on both sides, over every transport.

mod common;

use common::*;
use std::time::{Duration, Instant};
use topspin::codec::RawCodec;
use topspin::{Code, Request};

#[tokio::test]
async fn expired_deadline_fails_the_call_and_cancels_the_handler() {
    each_client(&[], |t| async move {
        let probe = Probe::default();
        let server = serve(standard(probe.clone()), t).await;
        let ch = server.client().await;
        let started = Instant::now();
        let err = ch
            .unary(
                SLOW,
                Request::new(bytes("slow-1")).with_timeout(Duration::from_millis(200)),
            )
            .await
            .unwrap_err();
        if t == Transport::TonicClient && err.code() == Code::Cancelled {
            // tonic's client ends a call at its deadline itself, in its own words, when its
            // timer beats the face's DEADLINE_EXCEEDED.
            assert_eq!(err.message(), "Timeout expired", "{err}");
        } else {
            assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
        }
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(5),
            "{took:?}"
        );
        // The server cancels its handler too.
        within(5, async {
            while !probe
                .cancelled
                .lock()
                .unwrap()
                .contains(&"slow-1".to_string())
            {
                probe.cancelled_notify.notified().await;
            }
        })
        .await;
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn handler_sees_the_remaining_time() {
    each_client(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.client().await;
        let r = ch
            .unary(
                HEADERS,
                Request::new(bytes("x")).with_timeout(Duration::from_secs(10)),
            )
            .await
            .unwrap();
        let ms: u64 = r
            .metadata()
            .get_str("remaining-ms")
            .unwrap()
            .parse()
            .unwrap();
        assert!(ms > 5_000 && ms <= 10_000, "{ms}");
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn endpoint_default_timeout_applies() {
    each_transport(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server
            .connect_with(|e| e.timeout(Duration::from_millis(100)))
            .await
            .unwrap();
        let err = unary(&ch, SLOW, "slow-2").await.unwrap_err();
        assert_eq!(err.code(), Code::DeadlineExceeded);
        // Fast calls are unaffected.
        assert_eq!(unary(&ch, UNARY, "quick").await.unwrap(), bytes("quick"));
        server.stop().await;
    })
    .await;
}

/// Connecting and the handshake count inside the call's deadline: a server that accepts and
/// never answers cannot hold a call with a 300 ms timeout for the 10 s handshake timeout.
#[tokio::test]
async fn connecting_counts_inside_the_deadline() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = silent.local_addr().expect("addr");
    let accepted = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s); // accept, then say nothing
        }
    });
    let channel = topspin::Channel::lazy(format!("tcp://{addr}")).expect("lazy");
    let t0 = std::time::Instant::now();
    let err = channel
        .unary(
            RawCodec,
            UNARY,
            Request::new(bytes::Bytes::from_static(b"x")).with_timeout(Duration::from_millis(300)),
        )
        .await
        .expect_err("no handshake");
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(err.message().contains("connecting"), "{err}");
    // Generous: the point is 0.3 s, not the 10 s handshake timeout.
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    accepted.abort();
}
