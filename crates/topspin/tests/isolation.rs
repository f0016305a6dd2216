//! One call fails alone: a handler that panics ends its own call with INTERNAL, and the
//! connection and its other calls go on.

use bytes::Bytes;
use futures_util::StreamExt;
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::{Channel, Code, Request, Response, Server, Status, Streaming};

fn boom(b: &[u8]) -> Result<Bytes, Status> {
    if b == b"boom" {
        panic!("the handler panics on purpose");
    }
    Ok(Bytes::copy_from_slice(b))
}

async fn server() -> Channel {
    let server = Server::builder()
        .unary("/t.S/Unary", RawCodec, |r: Request<Bytes>| async move {
            if r.get_ref().as_ref() == b"later" {
                tokio::time::sleep(Duration::from_millis(20)).await;
                boom(b"boom")?;
            }
            Ok(Response::new(boom(r.get_ref())?))
        })
        .server_streaming("/t.S/Out", RawCodec, |_r: Request<Bytes>| async move {
            let items = futures_util::stream::iter([&b"a"[..], b"boom"]).map(boom);
            Ok(Response::new(items))
        })
        .client_streaming(
            "/t.S/In",
            RawCodec,
            |r: Request<Streaming<Bytes>>| async move {
                let mut s = r.into_inner();
                let mut last = Bytes::new();
                while let Some(m) = s.message().await? {
                    last = boom(&m)?;
                }
                Ok(Response::new(last))
            },
        )
        .streaming(
            "/t.S/Both",
            RawCodec,
            |r: Request<Streaming<Bytes>>| async move {
                let s = r.into_inner();
                Ok(Response::new(s.map(|m| boom(&m?))))
            },
        )
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind");
    let addr = server.local_addr().clone();
    tokio::spawn(server.serve());
    Channel::connect(addr).await.expect("connect")
}

fn assert_panicked(r: Result<(), Status>, what: &str) {
    let err = r.expect_err(what);
    assert_eq!(err.code(), Code::Internal, "{what}: {err}");
    assert!(err.message().contains("panicked"), "{what}: {err}");
}

async fn drain(s: Result<Response<Streaming<Bytes>>, Status>) -> Result<(), Status> {
    let mut s = s?.into_inner();
    while s.message().await?.is_some() {}
    Ok(())
}

#[tokio::test]
async fn a_panicking_handler_ends_only_its_own_call() {
    let ch = server().await;
    // A call in flight on the same connection while the others panic.
    let slow = tokio::spawn({
        let ch = ch.clone();
        async move {
            let reqs =
                futures_util::stream::iter([Bytes::from_static(b"fine")]).then(|m| async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    m
                });
            ch.client_streaming(RawCodec, "/t.S/In", Request::new(Box::pin(reqs)))
                .await
        }
    });
    let unary = |m: &'static [u8]| {
        let ch = ch.clone();
        async move {
            ch.unary(RawCodec, "/t.S/Unary", Bytes::from_static(m))
                .await
                .map(|_| ())
        }
    };
    assert_panicked(unary(b"boom").await, "unary, first poll");
    assert_panicked(unary(b"later").await, "unary, a later poll");
    let out = ch
        .server_streaming(RawCodec, "/t.S/Out", Bytes::new())
        .await;
    assert_panicked(drain(out).await, "in a response stream");
    let reqs = futures_util::stream::iter([&b"x"[..], b"boom"].map(Bytes::from_static));
    let r = ch
        .client_streaming(RawCodec, "/t.S/In", Request::new(reqs))
        .await;
    assert_panicked(r.map(|_| ()), "client streaming");
    let reqs = futures_util::stream::iter([&b"x"[..], b"boom"].map(Bytes::from_static));
    let both = ch
        .streaming(RawCodec, "/t.S/Both", Request::new(reqs))
        .await;
    assert_panicked(drain(both).await, "bidirectional");

    let r = slow
        .await
        .expect("task")
        .expect("the other call is unaffected");
    assert_eq!(r.into_inner(), Bytes::from_static(b"fine"));
    let r = ch
        .unary(RawCodec, "/t.S/Unary", Bytes::from_static(b"ok"))
        .await
        .expect("the connection goes on");
    assert_eq!(r.into_inner(), Bytes::from_static(b"ok"));
}
