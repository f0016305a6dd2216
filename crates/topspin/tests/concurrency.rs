//! Many calls in flight on one channel, many channels at once, a pool of connections.

mod common;

use bytes::Bytes;
use common::*;
use futures_util::future::join_all;
use topspin::{Channel, Endpoint};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_calls_on_one_channel() {
    for t in BOTH {
        let server = serve(builder(Probe::default()), t).await;
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
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_channels_at_once() {
    let server = serve(builder(Probe::default()), Transport::Tcp).await;
    let addr = server.addr.clone();
    let clients = (0..100).map(|i| {
        let addr = addr.clone();
        tokio::spawn(async move {
            let ch = Channel::connect(addr).await.unwrap();
            for j in 0..10 {
                let body = format!("{i}/{j}");
                assert_eq!(unary(&ch, UNARY, &body).await.unwrap(), Bytes::from(body));
            }
        })
    });
    for r in within(60, join_all(clients)).await {
        r.unwrap();
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_spreads_calls_over_connections() {
    let server = serve(builder(Probe::default()), Transport::Unix).await;
    let ch = Endpoint::new(server.addr.clone())
        .unwrap()
        .connections(4)
        .connect()
        .await
        .unwrap();
    let calls = (0..200).map(|i| {
        let ch = ch.clone();
        async move { unary(&ch, HEADERS, &i.to_string()).await }
    });
    for r in within(30, join_all(calls)).await {
        r.unwrap();
    }
    server.stop().await;
}
