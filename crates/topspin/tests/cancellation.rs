//! Dropping a call's future cancels it; the server's handler sees it promptly.

mod common;

use common::*;
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::Request;

#[tokio::test]
async fn dropping_a_unary_call_cancels_the_handler() {
    for t in BOTH {
        let probe = Probe::default();
        let server = serve(builder(probe.clone()), t).await;
        let ch = server.channel().await;
        let call = tokio::spawn({
            let ch = ch.clone();
            async move { unary(&ch, SLOW, "drop-me").await }
        });
        within(5, probe.started.notified()).await;
        call.abort(); // drops the call's future
        within(5, async {
            while !probe
                .cancelled
                .lock()
                .unwrap()
                .contains(&"drop-me".to_string())
            {
                probe.cancelled_notify.notified().await;
            }
        })
        .await;
        // The channel is unaffected.
        assert_eq!(unary(&ch, UNARY, "after").await.unwrap(), bytes("after"));
        server.stop().await;
    }
}

#[tokio::test]
async fn dropping_a_response_stream_cancels_the_call() {
    let server = serve(builder(Probe::default()), Transport::Tcp).await;
    let ch = server.channel().await;
    let mut s = ch
        .server_streaming(RawCodec, SERVER_STREAM, Request::new(bytes("1000000:10")))
        .await
        .unwrap()
        .into_inner();
    for _ in 0..10 {
        s.message().await.unwrap().unwrap();
    }
    drop(s);
    // The server stops producing and the connection keeps working.
    within(5, async {
        assert_eq!(unary(&ch, UNARY, "next").await.unwrap(), bytes("next"));
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn a_handler_can_watch_for_cancellation() {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let tx = std::sync::Mutex::new(Some(tx));
    let server = serve(
        topspin::Server::builder().unary(
            "/t.C/Watch",
            RawCodec,
            move |req: Request<bytes::Bytes>| {
                let c = req.cancellation().unwrap();
                let tx = tx.lock().unwrap().take();
                async move {
                    // Work spawned elsewhere learns of the cancellation through the handle.
                    tokio::spawn(async move {
                        c.cancelled().await;
                        if let Some(tx) = tx {
                            let _ = tx.send(());
                        }
                    });
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Ok(topspin::Response::new(req.into_inner()))
                }
            },
        ),
        Transport::Tcp,
    )
    .await;
    let ch = server.channel().await;
    let _ = ch
        .unary(
            RawCodec,
            "/t.C/Watch",
            Request::new(bytes("x")).with_timeout(Duration::from_millis(50)),
        )
        .await;
    within(5, rx).await.unwrap();
    server.stop().await;
}
