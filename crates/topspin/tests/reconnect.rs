//! A dropped connection fails calls in flight with UNAVAILABLE; the next call reconnects — over
//! every transport with an address (a `Channel::from_stream` cannot reconnect).

mod common;

use common::*;
use std::time::Duration;
use topspin::Code;

#[tokio::test]
async fn in_flight_calls_fail_and_the_next_call_reconnects() {
    each_transport(&[(Transport::Stream, STREAM_NO_ADDRESS)], |t| async move {
        let probe = Probe::default();
        let server = serve(standard(probe.clone()), t).await;
        let addr = server.addr.clone();
        let ch = server
            .connect_with(|e| e.backoff(Duration::from_millis(10), Duration::from_millis(50)))
            .await
            .unwrap();
        let call = tokio::spawn({
            let ch = ch.clone();
            async move { unary(&ch, SLOW, "in flight").await }
        });
        within(5, probe.started.notified()).await;
        // Kill the server without grace.
        within(5, server.shutdown(Duration::ZERO)).await;
        let err = within(5, call).await.unwrap().unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
        assert!(!err.message().is_empty());
        // While nothing listens, calls fail fast with UNAVAILABLE naming the address.
        let err = unary(&ch, UNARY, "x").await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable);
        assert!(err.message().contains(&addr.to_string()), "{err}");
        // A new server on the same address: the channel reconnects (after its backoff).
        let restarted = serve_at(standard(Probe::default()), t, &server.bound).await;
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
        restarted.stop().await;
    })
    .await;
}

#[tokio::test]
async fn lazy_channel_connects_on_first_call_and_backs_off() {
    each_transport(&[(Transport::Stream, STREAM_NO_ADDRESS)], |t| async move {
        let addr = unbound_addr(t);
        let ch = endpoint_for(t, dial_addr(t, &addr)).connect_lazy();
        // Nothing listens yet.
        let e1 = unary(&ch, UNARY, "x").await.unwrap_err();
        assert_eq!(e1.code(), Code::Unavailable);
        assert!(e1.message().contains("could not connect"), "{e1}");
        // The next attempt is throttled by backoff: it fails fast without trying.
        let e2 = unary(&ch, UNARY, "x").await.unwrap_err();
        assert!(e2.message().contains("next connection attempt in"), "{e2}");
        let server = serve_at(standard(Probe::default()), t, &addr).await;
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
    })
    .await;
}

#[tokio::test]
async fn a_connection_that_drops_fails_calls_in_flight_with_the_reason() {
    each_transport(&[(
        Transport::Stream,
        "a stream's connection runs on a task of its own, not the server's: aborting serve() leaves it up",
    )], |t| async move {
        let probe = Probe::default();
        let server = serve(standard(probe.clone()), t).await;
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
    })
    .await;
}
