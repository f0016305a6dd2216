//! Many calls in flight on one channel, many channels at once, a pool of connections, over
//! every transport.

mod common;

use bytes::Bytes;
use common::*;
use futures_util::future::join_all;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_calls_on_one_channel() {
    each_transport(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.channel().await;
        let calls = (0..1000).map(|i| {
            let ch = ch.clone();
            tokio::spawn(async move { unary(&ch, UNARY, &format!("call {i}")).await })
        });
        let out = within(60, join_all(calls)).await;
        for (i, r) in out.into_iter().enumerate() {
            assert_eq!(r.unwrap().unwrap(), Bytes::from(format!("call {i}")));
        }
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_channels_at_once() {
    each_transport(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let server = std::sync::Arc::new(server);
        let clients = (0..100).map(|i| {
            let server = server.clone();
            tokio::spawn(async move {
                let ch = server.channel().await;
                for j in 0..10 {
                    let body = format!("{i}/{j}");
                    assert_eq!(unary(&ch, UNARY, &body).await.unwrap(), Bytes::from(body));
                }
            })
        });
        for r in within(60, join_all(clients)).await {
            r.unwrap();
        }
        let Ok(server) = std::sync::Arc::try_unwrap(server) else {
            panic!("a client kept the server")
        };
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_spreads_calls_over_connections() {
    each_transport(&[(Transport::Stream, STREAM_NO_ADDRESS)], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.connect_with(|e| e.connections(4)).await.unwrap();
        let calls = (0..200).map(|i| {
            let ch = ch.clone();
            async move { unary(&ch, HEADERS, &i.to_string()).await }
        });
        for r in within(30, join_all(calls)).await {
            r.unwrap();
        }
        server.stop().await;
    })
    .await;
}
