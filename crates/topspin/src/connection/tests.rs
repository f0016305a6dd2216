//! Every call kind over the stream transport (`tokio::io::duplex`), through the same connection
//! loop the socket transport uses; the socket transport is covered by `tests/` over real TCP
//! and Unix sockets.

use crate::codec::RawCodec;
use crate::transport::stream::StreamTransport;
use crate::transport::PeerAddr;
use crate::{Channel, Code, Endpoint, Request, Response, Server, Status, Streaming};
use bytes::Bytes;
use futures_util::StreamExt;
use std::time::Duration;

async fn pair(buffer: usize) -> (Channel, crate::ShutdownHandle) {
    let server = Server::builder()
        .unary("/t.S/Echo", RawCodec, |r: Request<Bytes>| async move {
            match r.get_ref().as_ref() {
                b"fail" => Err(Status::not_found("no such thing")),
                _ => Ok(Response::new(r.into_inner())),
            }
        })
        .unary("/t.S/Slow", RawCodec, |r: Request<Bytes>| async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(Response::new(r.into_inner()))
        })
        .server_streaming("/t.S/Count", RawCodec, |r: Request<Bytes>| async move {
            let n = r.get_ref()[0];
            let items = (0..n).map(|i| Ok(Bytes::from(vec![i; 3])));
            Ok(Response::new(futures_util::stream::iter(items)))
        })
        .client_streaming(
            "/t.S/Sum",
            RawCodec,
            |r: Request<Streaming<Bytes>>| async move {
                let mut s = r.into_inner();
                let mut total = 0u64;
                while let Some(m) = s.message().await? {
                    total += m.len() as u64;
                }
                Ok(Response::new(Bytes::from(total.to_string())))
            },
        )
        .streaming(
            "/t.S/Chat",
            RawCodec,
            |r: Request<Streaming<Bytes>>| async move {
                let s = r.into_inner();
                Ok(Response::new(
                    s.map(|m| m.map(|b| [&b[..], b"!"].concat().into())),
                ))
            },
        )
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind");
    let (a, b) = tokio::io::duplex(buffer);
    tokio::spawn(server.serve_transport(StreamTransport::new(a, PeerAddr::Stream)));
    let shutdown = server.shutdown_handle();
    tokio::spawn(server.serve());
    let endpoint = Endpoint::new("tcp://in-memory:1").expect("endpoint");
    let channel = Channel::over_transport(StreamTransport::new(b, PeerAddr::Stream), endpoint)
        .await
        .expect("handshake over the duplex pipe");
    (channel, shutdown)
}

#[tokio::test]
async fn every_call_kind_over_a_duplex_pipe() {
    // A small pipe: large messages must go through many partial reads and writes.
    let (ch, shutdown) = pair(1024).await;

    let r = ch
        .unary(RawCodec, "/t.S/Echo", Bytes::from_static(b"hi"))
        .await;
    assert_eq!(r.expect("unary").into_inner(), Bytes::from_static(b"hi"));

    let err = ch
        .unary(RawCodec, "/t.S/Echo", Bytes::from_static(b"fail"))
        .await
        .expect_err("status");
    assert_eq!(err.code(), Code::NotFound);

    let big = Bytes::from(vec![7u8; 3 * 1024 * 1024]);
    let r = ch.unary(RawCodec, "/t.S/Echo", big.clone()).await;
    assert_eq!(r.expect("3 MiB unary").into_inner(), big);

    let mut s = ch
        .server_streaming(RawCodec, "/t.S/Count", Bytes::from_static(&[5]))
        .await
        .expect("server streaming")
        .into_inner();
    let mut got = Vec::new();
    while let Some(m) = s.message().await.expect("item") {
        got.push(m[0]);
    }
    assert_eq!(got, vec![0, 1, 2, 3, 4]);

    let reqs = futures_util::stream::iter((0..10).map(|_| Bytes::from_static(b"abcd")));
    let r = ch
        .client_streaming(RawCodec, "/t.S/Sum", Request::new(reqs))
        .await
        .expect("client streaming");
    assert_eq!(r.into_inner(), Bytes::from_static(b"40"));

    let reqs = futures_util::stream::iter([&b"a"[..], b"b", b"c"].map(Bytes::from_static));
    let mut s = ch
        .streaming(RawCodec, "/t.S/Chat", Request::new(reqs))
        .await
        .expect("bidi")
        .into_inner();
    let mut got = Vec::new();
    while let Some(m) = s.message().await.expect("item") {
        got.push(m);
    }
    assert_eq!(got, [&b"a!"[..], b"b!", b"c!"].map(Bytes::from_static));

    let err = ch
        .unary(
            RawCodec,
            "/t.S/Slow",
            Request::new(Bytes::new()).with_timeout(Duration::from_millis(50)),
        )
        .await
        .expect_err("deadline");
    assert_eq!(err.code(), Code::DeadlineExceeded);

    // Many calls at once on one pipe.
    let calls = (0..200u32).map(|i| {
        let ch = ch.clone();
        async move {
            let m = Bytes::from(i.to_le_bytes().to_vec());
            let r = ch.unary(RawCodec, "/t.S/Echo", m.clone()).await;
            assert_eq!(r.expect("concurrent").into_inner(), m);
        }
    });
    futures_util::future::join_all(calls).await;

    shutdown.shutdown(Duration::from_secs(1)).await;
    let err = ch
        .unary(RawCodec, "/t.S/Echo", Bytes::from_static(b"late"))
        .await
        .expect_err("closed");
    assert_eq!(err.code(), Code::Unavailable);
}

#[tokio::test]
async fn an_expired_deadline_is_not_sent() {
    let (ch, _shutdown) = pair(64 * 1024).await;
    let err = ch
        .unary(
            RawCodec,
            "/t.S/Echo",
            Request::new(Bytes::from_static(b"x")).with_timeout(Duration::ZERO),
        )
        .await
        .expect_err("expired before it was sent");
    assert_eq!(err.code(), Code::DeadlineExceeded);
}
