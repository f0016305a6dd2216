//! gRPC's interop `TestService` (`grpc.testing`, `proto/grpc/testing/test.proto`) served by
//! topspin, so that gRPC's own interop clients can be run against topspin's gRPC face
//! (`scripts/test-interop.sh` runs grpc-go's). It follows gRPC's interop test descriptions:
//! payloads of zeros of the asked size, the echoed metadata (`x-grpc-test-echo-initial` in the
//! response headers, `x-grpc-test-echo-trailing-bin` in the trailers), the asked status, the
//! asked compression per call and per message, and `INVALID_ARGUMENT` for a request message
//! whose compressed flag is not what its `expect_compressed` says.
//!
//! ```
//! use topspin_interop::{server_builder, testing};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = server_builder().bind("tcp://127.0.0.1:0").await?;
//! let address = server.local_addr().clone();
//! let shutdown = server.shutdown_handle();
//! tokio::spawn(server.serve());
//! let client = testing::TestServiceClient::connect(address).await?;
//! let reply = client
//!     .unary_call(testing::SimpleRequest { response_size: 3, ..Default::default() })
//!     .await?;
//! assert_eq!(reply.into_inner().payload.unwrap().body.as_ref(), &[0, 0, 0]);
//! shutdown.shutdown(std::time::Duration::from_secs(1)).await;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

use futures_util::stream::{self, BoxStream, StreamExt};
use std::time::Duration;
use topspin::{
    Code, Compression, Encoding, MessageCompression, Metadata, Request, Response, Server,
    ServerBuilder, Status, Streaming,
};

/// The `grpc.testing` package: messages, the `TestService` trait, its server and client.
pub mod testing {
    #![allow(missing_docs, unreachable_pub)]
    include!(concat!(env!("OUT_DIR"), "/grpc.testing.rs"));
}

use testing as pb;

/// The metadata key whose value a call's response headers echo.
pub const ECHO_INITIAL: &str = "x-grpc-test-echo-initial";
/// The metadata key whose (binary) value a call's trailers echo.
pub const ECHO_TRAILING: &str = "x-grpc-test-echo-trailing-bin";

/// A server with the `TestService` (and nothing else: `UnimplementedService` is unknown to it).
pub fn server_builder() -> ServerBuilder {
    Server::builder().add_service(pb::TestServiceServer::new(Interop))
}

/// The `TestService`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Interop;

/// `size` zero bytes.
fn payload(size: i32) -> Result<pb::Payload, Status> {
    let size = usize::try_from(size)
        .map_err(|_| Status::invalid_argument(format!("a payload of {size} bytes")))?;
    Ok(pb::Payload {
        r#type: pb::PayloadType::Compressable as i32,
        body: vec![0; size].into(),
    })
}

/// The response headers and trailers that echo the request's metadata.
fn echoed(md: &Metadata) -> (Metadata, Metadata) {
    let mut headers = Metadata::builder();
    if let Some(v) = md.get_str(ECHO_INITIAL) {
        headers = headers
            .text(ECHO_INITIAL, v)
            .unwrap_or_else(|_| Metadata::builder());
    }
    let mut trailers = Metadata::builder();
    if let Some(v) = md.get(ECHO_TRAILING) {
        trailers = trailers
            .binary(ECHO_TRAILING, v)
            .unwrap_or_else(|_| Metadata::builder());
    }
    (headers.build(), trailers.build())
}

/// The status a request asks the call to end with, if it asks for one other than OK.
fn asked_status(s: Option<&pb::EchoStatus>) -> Option<Status> {
    let s = s.filter(|s| s.code != 0)?;
    let code = u16::try_from(s.code).map_or(Code::Unknown, Code::from_u16);
    Some(Status::new(code, s.message.clone()))
}

/// `INVALID_ARGUMENT` for a request message whose compressed flag is not what its
/// `expect_compressed` says (as gRPC's C++ interop server checks): checked message by message
/// (`compressed`: `Request::message_compressed`, `Streaming::last_message_compressed`), not by
/// the call's `grpc-encoding` — a call that compresses may send a message as it is, as
/// `client_compressed_streaming`'s second message goes. Nothing is checked without
/// `expect_compressed`.
fn check_compressed(expect: Option<&pb::BoolValue>, compressed: bool) -> Result<(), Status> {
    match expect {
        Some(e) if e.value && !compressed => Err(Status::invalid_argument(
            "the request was expected compressed and came uncompressed",
        )),
        Some(e) if !e.value && compressed => Err(Status::invalid_argument(
            "the request was expected uncompressed and came compressed",
        )),
        _ => Ok(()),
    }
}

/// gzip for every message that is worth it or not: the interop tests ask for compression by
/// message, whatever its size.
fn gzip() -> Compression {
    Compression::new(Encoding::Gzip).with_threshold(0)
}

/// The answers one `StreamingOutputCallRequest` asks for: each after its interval, compressed
/// if it asks (through `switch`), then its status if it asks for one.
fn answers(
    req: pb::StreamingOutputCallRequest,
    switch: MessageCompression,
) -> BoxStream<'static, Result<pb::StreamingOutputCallResponse, Status>> {
    let status = asked_status(req.response_status.as_ref());
    let messages = stream::iter(req.response_parameters).then(move |p| {
        let switch = switch.clone();
        async move {
            if p.interval_us > 0 {
                tokio::time::sleep(Duration::from_micros(p.interval_us as u64)).await;
            }
            switch.set_enabled(p.compressed.is_some_and(|c| c.value));
            Ok(pb::StreamingOutputCallResponse {
                payload: Some(payload(p.size)?),
            })
        }
    });
    messages.chain(stream::iter(status.map(Err))).boxed()
}

/// A response stream of `answers`, compressed message by message when any answer asks for it.
fn streamed(
    compress: bool,
    switch: &MessageCompression,
    headers: Metadata,
    trailers: Metadata,
    out: BoxStream<'static, Result<pb::StreamingOutputCallResponse, Status>>,
) -> Response<BoxStream<'static, Result<pb::StreamingOutputCallResponse, Status>>> {
    let r = Response::new(out)
        .with_metadata(headers)
        .with_trailers(trailers)
        .with_message_compression(switch);
    if compress {
        r.with_compression(Some(gzip()))
    } else {
        r
    }
}

fn asks_compression(req: &pb::StreamingOutputCallRequest) -> bool {
    req.response_parameters
        .iter()
        .any(|p| p.compressed.is_some_and(|c| c.value))
}

impl Interop {
    fn unary(
        &self,
        request: Request<pb::SimpleRequest>,
    ) -> Result<Response<pb::SimpleResponse>, Status> {
        check_compressed(
            request.get_ref().expect_compressed.as_ref(),
            request.message_compressed(),
        )?;
        let (headers, trailers) = echoed(request.metadata());
        let req = request.into_inner();
        if let Some(st) = asked_status(req.response_status.as_ref()) {
            return Err(st.with_headers(headers).with_metadata(trailers));
        }
        let reply = pb::SimpleResponse {
            payload: Some(payload(req.response_size)?),
            server_id: if req.fill_server_id {
                format!("topspin-interop-{}", std::process::id())
            } else {
                String::new()
            },
            ..Default::default()
        };
        let r = Response::new(reply)
            .with_metadata(headers)
            .with_trailers(trailers);
        Ok(match req.response_compressed {
            Some(c) if c.value => r.with_compression(Some(gzip())),
            Some(_) => r.with_compression(None),
            None => r,
        })
    }
}

impl pb::TestService for Interop {
    async fn empty_call(&self, _: Request<pb::Empty>) -> Result<Response<pb::Empty>, Status> {
        Ok(Response::new(pb::Empty {}))
    }

    async fn unary_call(
        &self,
        request: Request<pb::SimpleRequest>,
    ) -> Result<Response<pb::SimpleResponse>, Status> {
        self.unary(request)
    }

    async fn cacheable_unary_call(
        &self,
        request: Request<pb::SimpleRequest>,
    ) -> Result<Response<pb::SimpleResponse>, Status> {
        self.unary(request)
    }

    type StreamingOutputCallStream =
        BoxStream<'static, Result<pb::StreamingOutputCallResponse, Status>>;

    async fn streaming_output_call(
        &self,
        request: Request<pb::StreamingOutputCallRequest>,
    ) -> Result<Response<Self::StreamingOutputCallStream>, Status> {
        let (headers, trailers) = echoed(request.metadata());
        let req = request.into_inner();
        let compress = asks_compression(&req);
        let switch = MessageCompression::new();
        let out = answers(req, switch.clone());
        Ok(streamed(compress, &switch, headers, trailers, out))
    }

    async fn streaming_input_call(
        &self,
        request: Request<Streaming<pb::StreamingInputCallRequest>>,
    ) -> Result<Response<pb::StreamingInputCallResponse>, Status> {
        let mut input = request.into_inner();
        let mut size = 0usize;
        while let Some(m) = input.message().await? {
            check_compressed(
                m.expect_compressed.as_ref(),
                input.last_message_compressed(),
            )?;
            size += m.payload.map_or(0, |p| p.body.len());
        }
        let aggregated_payload_size = i32::try_from(size)
            .map_err(|_| Status::out_of_range(format!("{size} bytes of payload")))?;
        Ok(Response::new(pb::StreamingInputCallResponse {
            aggregated_payload_size,
        }))
    }

    type FullDuplexCallStream = BoxStream<'static, Result<pb::StreamingOutputCallResponse, Status>>;

    async fn full_duplex_call(
        &self,
        request: Request<Streaming<pb::StreamingOutputCallRequest>>,
    ) -> Result<Response<Self::FullDuplexCallStream>, Status> {
        let (headers, trailers) = echoed(request.metadata());
        let switch = MessageCompression::new();
        let each = switch.clone();
        let out = request
            .into_inner()
            .flat_map(move |r| match r {
                Ok(req) => answers(req, each.clone()),
                Err(e) => stream::once(async move { Err(e) }).boxed(),
            })
            .boxed();
        // Whether any answer will be compressed is not known before the requests come: the
        // call offers gzip and the switch decides message by message.
        Ok(streamed(true, &switch, headers, trailers, out))
    }

    type HalfDuplexCallStream = BoxStream<'static, Result<pb::StreamingOutputCallResponse, Status>>;

    async fn half_duplex_call(
        &self,
        request: Request<Streaming<pb::StreamingOutputCallRequest>>,
    ) -> Result<Response<Self::HalfDuplexCallStream>, Status> {
        let (headers, trailers) = echoed(request.metadata());
        let mut input = request.into_inner();
        let mut all = Vec::new();
        while let Some(m) = input.message().await? {
            all.push(m);
        }
        let compress = all.iter().any(asks_compression);
        let switch = MessageCompression::new();
        let each = switch.clone();
        let out = stream::iter(all)
            .flat_map(move |req| answers(req, each.clone()))
            .boxed();
        Ok(streamed(compress, &switch, headers, trailers, out))
    }

    async fn unimplemented_call(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::Empty>, Status> {
        Err(Status::unimplemented(
            "grpc.testing.TestService/UnimplementedCall is not implemented, as the test expects",
        ))
    }
}
