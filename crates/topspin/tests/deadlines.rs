//! Deadlines: sent to the server, enforced on both sides.

mod common;

use common::*;
use std::time::{Duration, Instant};
use topspin::codec::RawCodec;
use topspin::{Code, Endpoint, Request};

#[tokio::test]
async fn expired_deadline_fails_the_call_and_cancels_the_handler() {
    for t in BOTH {
        let probe = Probe::default();
        let server = serve(builder(probe.clone()), t).await;
        let ch = server.channel().await;
        let started = Instant::now();
        let err = ch
            .unary(
                RawCodec,
                SLOW,
                Request::new(bytes("slow-1")).with_timeout(Duration::from_millis(200)),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
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
    }
}

#[tokio::test]
async fn handler_sees_the_remaining_time() {
    let server = serve(builder(Probe::default()), Transport::Tcp).await;
    let ch = server.channel().await;
    let r = ch
        .unary(
            RawCodec,
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
}

#[tokio::test]
async fn endpoint_default_timeout_applies() {
    let server = serve(builder(Probe::default()), Transport::Unix).await;
    let ch = Endpoint::new(server.addr.clone())
        .unwrap()
        .timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let err = unary(&ch, SLOW, "slow-2").await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    // Fast calls are unaffected.
    assert_eq!(unary(&ch, UNARY, "quick").await.unwrap(), bytes("quick"));
    server.stop().await;
}
