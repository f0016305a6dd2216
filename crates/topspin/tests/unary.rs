//! Unary calls over every transport: echo, errors with details, unknown methods.

mod common;

use bytes::Bytes;
use common::*;
use topspin::codec::{ProstCodec, RawCodec};
use topspin::{Code, Request};

#[tokio::test]
async fn echo_over_every_transport() {
    each_client(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.client().await;
        for body in ["", "x", "hello topspin", &"z".repeat(100_000)] {
            assert_eq!(ch.call(UNARY, body).await.unwrap(), bytes(body));
        }
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn handler_errors_carry_code_message_details_and_trailers() {
    each_client(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.client().await;
        let err = ch.call(FAIL, "NOT_FOUND:no key 'apple'").await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
        assert_eq!(err.message(), "no key 'apple'");
        assert_eq!(err.details(), &Bytes::from_static(b"d"));
        assert_eq!(err.metadata().get_str("why"), Some("asked"));
        // The connection is fine afterwards.
        assert_eq!(ch.call(UNARY, "ok").await.unwrap(), bytes("ok"));
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn unknown_method_is_unimplemented_and_named() {
    each_client(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.client().await;
        let err = ch.call("/test.Echo/Nope", "x").await.unwrap_err();
        assert_eq!(err.code(), Code::Unimplemented);
        assert!(err.message().contains("/test.Echo/Nope"), "{err}");
        assert_eq!(
            ch.call(UNARY, "still fine").await.unwrap(),
            bytes("still fine")
        );
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn codec_mismatch_is_unimplemented() {
    let skips = [
        (
            Transport::Grpc,
            "gRPC carries no codec id: the face cannot tell a protobuf request from a raw one",
        ),
        (
            Transport::GrpcTonic,
            "gRPC carries no codec id: a gRPC server cannot tell a protobuf request from a raw one",
        ),
    ];
    each_transport(&skips, |t| async move {
        let server = serve(standard(Probe::default()), t).await;
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
    })
    .await;
}

#[tokio::test]
async fn protobuf_codec_round_trip() {
    let skips = [not_standard(
        "its server has a method of its own, /t.P/Upper",
    )];
    each_transport(&skips, |t| async move {
        let server = serve(
            topspin::Server::builder().unary(
                "/t.P/Upper",
                ProstCodec::<String, String>::default(),
                |req: Request<String>| async move {
                    Ok(topspin::Response::new(req.into_inner().to_uppercase()))
                },
            ),
            t,
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
    })
    .await;
}

#[tokio::test]
async fn batch_of_calls_in_one_write() {
    each_transport(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.channel().await;
        let reqs = (0..8)
            .map(|i| Request::new(Bytes::from(format!("b{i}"))))
            .collect();
        let out = ch.unary_batch(RawCodec, UNARY, reqs).await;
        for (i, r) in out.into_iter().enumerate() {
            assert_eq!(r.unwrap().into_inner(), Bytes::from(format!("b{i}")));
        }
        server.stop().await;
    })
    .await;
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
    each_transport(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.channel().await;
        let r = ch.unary(RawCodec, UNARY, bytes("plain")).await.unwrap();
        assert_eq!(r.into_inner(), bytes("plain"));
        server.stop().await;
    })
    .await;
}

/// The rules of a unary-response call's answer (exactly one message) are one, in one wording,
/// on every transport and both client modes (native and `grpc://`): a server-streaming
/// handler's two messages, or none, answer a unary call here.
#[tokio::test]
async fn a_unary_call_answered_with_two_messages_or_none_fails_in_one_wording() {
    each_transport(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.channel().await;
        let two = unary(&ch, SERVER_STREAM, "2").await.unwrap_err();
        assert_eq!(two.code(), Code::Internal, "{two}");
        assert_eq!(
            two.message(),
            "the server sent more than one response message for /test.Echo/ServerStream, which expects one"
        );
        let none = unary(&ch, SERVER_STREAM, "0").await.unwrap_err();
        assert_eq!(none.code(), Code::Internal, "{none}");
        assert_eq!(
            none.message(),
            "the server ended /test.Echo/ServerStream with OK but sent no response message"
        );
        // The call was ended alone: the connection goes on.
        assert_eq!(unary(&ch, UNARY, "after").await.unwrap(), bytes("after"));
        server.stop().await;
    })
    .await;
}
