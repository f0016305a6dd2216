//! The interop server's `expect_compressed` checks, message by message, over the gRPC face
//! (`grpc://`, as gRPC's interop clients call it) and the native face: gRPC's
//! `client_compressed_unary` and `client_compressed_streaming` cases (which grpc-go's interop
//! client, the one `scripts/test-interop.sh` runs, does not have), and a message sent as it is
//! inside a compressed call while it is expected compressed — which a check of the call's
//! encoding alone let through.

use futures_util::{stream, StreamExt};
use std::time::Duration;
use topspin::{Code, Compression, Config, Encoding, Endpoint, MessageCompression, Request};
use topspin_interop::{server_builder, testing as pb};

fn expect(value: bool) -> Option<pb::BoolValue> {
    Some(pb::BoolValue { value })
}

fn payload(size: usize) -> Option<pb::Payload> {
    Some(pb::Payload {
        body: vec![0u8; size].into(),
        ..Default::default()
    })
}

fn gzip() -> Option<Compression> {
    Some(Compression::new(Encoding::Gzip).with_threshold(0))
}

/// A client of `address` (`tcp://` or `grpc://`) whose calls compress with `compression`.
async fn client(address: &str, compression: Option<Compression>) -> pb::TestServiceClient {
    let channel = Endpoint::new(address)
        .unwrap()
        .config(Config::default().with_compression(compression))
        .connect()
        .await
        .unwrap();
    pb::TestServiceClient::new(channel)
}

/// Runs `test` with the interop server's address on each face.
async fn each_face<F, Fut>(test: F)
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let server = server_builder().bind("tcp://127.0.0.1:0").await.unwrap();
    let port = server.local_addr().to_string();
    let port = port.rsplit(':').next().unwrap().to_owned();
    let shutdown = server.shutdown_handle();
    tokio::spawn(server.serve());
    for scheme in ["grpc", "tcp"] {
        eprintln!("[{scheme}]");
        test(format!("{scheme}://127.0.0.1:{port}")).await;
    }
    shutdown.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn client_compressed_unary() {
    each_face(|address| async move {
        let call = |compression, expect_compressed| {
            let address = address.clone();
            async move {
                let req = pb::SimpleRequest {
                    expect_compressed,
                    response_size: 314_159,
                    payload: payload(271_828),
                    ..Default::default()
                };
                client(&address, compression).await.unary_call(req).await
            }
        };
        // The probe: expected compressed, sent as it is.
        let e = call(None, expect(true)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "[{address}] {e}");
        call(gzip(), expect(true)).await.unwrap();
        call(None, expect(false)).await.unwrap();
        // Expected compressed, sent as it is in a gzip call (under the threshold): the call's
        // encoding alone would have let it through.
        let under = Some(Compression::new(Encoding::Gzip).with_threshold(1 << 20));
        let e = call(under, expect(true)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "[{address}] {e}");
        let e = call(gzip(), expect(false)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "[{address}] {e}");
    })
    .await;
}

#[tokio::test]
async fn client_compressed_streaming() {
    each_face(|address| async move {
        // The probe: one message expected compressed, sent as it is.
        let probe = pb::StreamingInputCallRequest {
            expect_compressed: expect(true),
            payload: payload(27_182),
        };
        let e = client(&address, None)
            .await
            .streaming_input_call(Request::new(stream::iter([probe])))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "[{address}] {e}");
        // The case: a gzip call whose first message is compressed, its second not.
        let sent = [(true, 27_182), (false, 45_904)];
        let calls = |flags: [bool; 2]| {
            let switch = MessageCompression::new();
            let flip = switch.clone();
            let messages = stream::iter(sent).map(move |(compressed, size)| {
                flip.set_enabled(compressed);
                pb::StreamingInputCallRequest {
                    expect_compressed: expect(flags[usize::from(size == 45_904)]),
                    payload: payload(size),
                }
            });
            Request::new(messages)
                .with_compression(gzip())
                .with_message_compression(&switch)
        };
        let c = client(&address, None).await;
        let r = c.streaming_input_call(calls([true, false])).await.unwrap();
        assert_eq!(r.get_ref().aggregated_payload_size, 73_086, "[{address}]");
        // The second message expected compressed: it was not.
        let e = c
            .streaming_input_call(calls([true, true]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "[{address}] {e}");
    })
    .await;
}
