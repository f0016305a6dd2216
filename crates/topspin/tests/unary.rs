//! Unary calls over TCP and Unix sockets: echo, errors with details, unknown methods.

mod common;

use bytes::Bytes;
use common::*;
use topspin::codec::{ProstCodec, RawCodec};
use topspin::{Code, Request};

#[tokio::test]
async fn echo_over_tcp_and_unix() {
    for t in BOTH {
        let server = serve(builder(Probe::default()), t).await;
        let ch = server.channel().await;
        for body in ["", "x", "hello topspin", &"z".repeat(100_000)] {
            assert_eq!(unary(&ch, UNARY, body).await.unwrap(), bytes(body), "{t:?}");
        }
        server.stop().await;
    }
}

#[tokio::test]
async fn handler_errors_carry_code_message_details_and_trailers() {
    let server = serve(builder(Probe::default()), Transport::Tcp).await;
    let ch = server.channel().await;
    let err = unary(&ch, FAIL, "NOT_FOUND:no key 'apple'")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(err.message(), "no key 'apple'");
    assert_eq!(err.details(), &Bytes::from_static(b"d"));
    assert_eq!(err.metadata().get_str("why"), Some("asked"));
    // The connection is fine afterwards.
    assert_eq!(unary(&ch, UNARY, "ok").await.unwrap(), bytes("ok"));
    server.stop().await;
}

#[tokio::test]
async fn unknown_method_is_unimplemented_and_named() {
    let server = serve(builder(Probe::default()), Transport::Unix).await;
    let ch = server.channel().await;
    let err = unary(&ch, "/test.Echo/Nope", "x").await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    assert!(err.message().contains("/test.Echo/Nope"), "{err}");
    assert_eq!(
        unary(&ch, UNARY, "still fine").await.unwrap(),
        bytes("still fine")
    );
    server.stop().await;
}

#[tokio::test]
async fn codec_mismatch_is_unimplemented() {
    let server = serve(builder(Probe::default()), Transport::Tcp).await;
    let ch = server.channel().await;
    let err = ch
        .unary(
            ProstCodec::<String, String>::default(),
            UNARY,
            Request::new("x".to_string()),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    assert!(err.message().contains("codec"), "{err}");
    server.stop().await;
}

#[tokio::test]
async fn protobuf_codec_round_trip() {
    let server = serve(
        topspin::Server::builder().unary(
            "/t.P/Upper",
            ProstCodec::<String, String>::default(),
            |req: Request<String>| async move {
                Ok(topspin::Response::new(req.into_inner().to_uppercase()))
            },
        ),
        Transport::Tcp,
    )
    .await;
    let ch = server.channel().await;
    let r = ch
        .unary(
            ProstCodec::<String, String>::default(),
            "/t.P/Upper",
            Request::new("grüße".to_string()),
        )
        .await
        .unwrap();
    assert_eq!(r.into_inner(), "GRÜSSE");
    server.stop().await;
}

#[tokio::test]
async fn batch_of_calls_in_one_write() {
    let server = serve(builder(Probe::default()), Transport::Tcp).await;
    let ch = server.channel().await;
    let reqs = (0..8)
        .map(|i| Request::new(Bytes::from(format!("b{i}"))))
        .collect();
    let out = ch.unary_batch(RawCodec, UNARY, reqs).await;
    for (i, r) in out.into_iter().enumerate() {
        assert_eq!(r.unwrap().into_inner(), Bytes::from(format!("b{i}")));
    }
    server.stop().await;
}

#[tokio::test]
async fn ipv6_loopback() {
    let server = builder(Probe::default()).bind("tcp://[::1]:0").await;
    let server = match server {
        Ok(s) => s,
        // A machine without IPv6 cannot run this; say so rather than pass silently.
        Err(e) => panic!("IPv6 loopback unavailable: {e}"),
    };
    let addr = server.local_addr().clone();
    assert!(addr.to_string().starts_with("tcp://[::1]:"), "{addr}");
    let handle = server.shutdown_handle();
    tokio::spawn(server.serve());
    let ch = topspin::Channel::connect(addr).await.unwrap();
    assert_eq!(unary(&ch, UNARY, "v6").await.unwrap(), bytes("v6"));
    handle.shutdown(std::time::Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_plain_message_is_a_request() {
    let server = serve(builder(Probe::default()), Transport::Tcp).await;
    let ch = server.channel().await;
    let r = ch.unary(RawCodec, UNARY, bytes("plain")).await.unwrap();
    assert_eq!(r.into_inner(), bytes("plain"));
    server.stop().await;
}
