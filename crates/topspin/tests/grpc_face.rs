//! The gRPC face over real sockets: tonic's client (a gRPC stack this project did not write)
//! calls a topspin server's ordinary handlers over HTTP/2 — h2c on a plain `tcp://` port and
//! ALPN `h2` on `tls://` — with every call kind, deadlines, errors with details, cancellation,
//! metadata and `-bin` values both ways, trailers, compression and size limits; and one port
//! serves a native topspin client and a gRPC client at once.

// The face is the `grpc` feature's; the TLS cases need `tls`.
#![cfg(all(feature = "grpc", feature = "tls"))]

mod common;
mod layered;

use futures_util::{stream, StreamExt};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::{BinaryMetadataValue, MetadataValue};
use topspin::codec::ProstCodec;
use topspin::{
    Channel, Code, Compression, Config, Encoding, Metadata, Protocol, Request, Response, Server,
    ServerBuilder, ShutdownHandle, Status,
};

type Codec = ProstCodec<String, String>;
type Tonic = tonic::client::Grpc<tonic::transport::Channel>;
type Events = Arc<Mutex<Vec<String>>>;

fn codec() -> tonic_prost::ProstCodec<String, String> {
    tonic_prost::ProstCodec::default()
}

fn protocol(req: &Request<impl Sized>) -> &'static str {
    match req.protocol() {
        Some(Protocol::Grpc) => "grpc",
        Some(Protocol::Topspin) => "topspin",
        _ => "other",
    }
}

/// The test service: ordinary topspin handlers, nothing gRPC-specific.
fn service(events: Events) -> ServerBuilder {
    let ev = events.clone();
    let slow_events = events;
    Server::builder()
        .unary(
            "/t.T/Echo",
            Codec::default(),
            |req: Request<String>| async move {
                let md = req.metadata();
                let mut h = Metadata::builder()
                    .text("protocol", protocol(&req))
                    .unwrap();
                if let Some(u) = md.get_str("user") {
                    h = h.text("seen-user", u).unwrap();
                }
                if let Some(b) = md.get("trace-bin") {
                    h = h.binary("seen-bin", b).unwrap();
                }
                let trailers = Metadata::builder()
                    .text("t-trailer", "done")
                    .unwrap()
                    .binary("t-trailer-bin", &[0xde, 0xad])
                    .unwrap()
                    .build();
                Ok(Response::new(req.into_inner())
                    .with_metadata(h.build())
                    .with_trailers(trailers))
            },
        )
        .unary(
            "/t.T/Fail",
            Codec::default(),
            |_req: Request<String>| async move {
                let md = Metadata::builder().text("why", "because").unwrap().build();
                Err::<Response<String>, _>(
                    Status::failed_precondition("no 100% grüße")
                        .with_details(vec![1u8, 2, 3, 0xff])
                        .with_metadata(md),
                )
            },
        )
        .unary(
            "/t.T/FailWithHeaders",
            Codec::default(),
            |_req: Request<String>| async move {
                let h = Metadata::builder().text("early", "yes").unwrap().build();
                let t = Metadata::builder().text("why", "because").unwrap().build();
                Err::<Response<String>, _>(
                    Status::unavailable("draining")
                        .with_headers(h)
                        .with_metadata(t),
                )
            },
        )
        .unary(
            "/t.T/Slow",
            Codec::default(),
            move |req: Request<String>| {
                let ev = slow_events.clone();
                async move {
                    ev.lock()
                        .unwrap()
                        .push(format!("deadline {}", req.deadline().is_some()));
                    let cancel = req.cancellation().expect("server request");
                    let ev2 = ev.clone();
                    tokio::spawn(async move {
                        cancel.cancelled().await;
                        ev2.lock().unwrap().push("cancelled".into());
                    });
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Ok(Response::new(String::from("too late")))
                }
            },
        )
        .server_streaming(
            "/t.T/Split",
            Codec::default(),
            |req: Request<String>| async move {
                let words: Vec<Result<String, Status>> = req
                    .into_inner()
                    .split(' ')
                    .map(|w| Ok(w.to_owned()))
                    .collect();
                Ok(Response::new(stream::iter(words))
                    .with_trailers(Metadata::builder().text("count", "many").unwrap().build()))
            },
        )
        .server_streaming(
            "/t.T/Flags",
            Codec::default(),
            |_req: Request<String>| async move {
                // Two answers: the first compressed, the second not (the switch goes off once
                // the first is taken).
                let switch = topspin::MessageCompression::new();
                let flip = switch.clone();
                let words = stream::iter(0..2).map(move |i| {
                    flip.set_enabled(i == 0);
                    Ok::<_, Status>("compress me ".repeat(400))
                });
                Ok(Response::new(words)
                    .with_compression(Some(topspin::Compression::new(topspin::Encoding::Gzip)))
                    .with_message_compression(&switch))
            },
        )
        .client_streaming(
            "/t.T/Join",
            Codec::default(),
            |req: Request<topspin::Streaming<String>>| async move {
                let mut s = req.into_inner();
                let mut parts = Vec::new();
                while let Some(m) = s.message().await? {
                    parts.push(m);
                }
                Ok(Response::new(parts.join("+")))
            },
        )
        .streaming(
            "/t.T/Upper",
            Codec::default(),
            move |req: Request<topspin::Streaming<String>>| {
                let ev = ev.clone();
                async move {
                    ev.lock().unwrap().push(format!("upper {}", protocol(&req)));
                    let out = req.into_inner().map(|m| m.map(|s| s.to_uppercase()));
                    Ok(Response::new(out))
                }
            },
        )
}

struct Running {
    /// host:port
    hp: String,
    shutdown: ShutdownHandle,
    events: Events,
}

async fn start(f: impl FnOnce(ServerBuilder) -> ServerBuilder, addr: &str) -> Running {
    let events = Events::default();
    let server = f(service(events.clone())).bind(addr).await.expect("bind");
    let local = server.local_addr().to_string();
    let hp = local.split("://").nth(1).expect("host:port").to_owned();
    let shutdown = server.shutdown_handle();
    tokio::spawn(server.serve());
    Running {
        hp,
        shutdown,
        events,
    }
}

impl Running {
    async fn tonic(&self) -> Tonic {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", self.hp))
            .unwrap()
            .connect()
            .await
            .expect("tonic connects");
        tonic::client::Grpc::new(ch)
    }

    async fn wait_for(&self, what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !self.events.lock().unwrap().iter().any(|e| e == what) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {what:?} in {:?}",
                self.events.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(self) {
        self.shutdown.shutdown(Duration::from_secs(1)).await;
    }
}

fn path(p: &'static str) -> PathAndQuery {
    PathAndQuery::from_static(p)
}

async fn unary(
    g: &mut Tonic,
    p: &'static str,
    req: tonic::Request<String>,
) -> Result<tonic::Response<String>, tonic::Status> {
    g.ready().await.expect("ready");
    g.unary(req, path(p), codec()).await
}

/// All four call kinds, metadata and `-bin` both ways, headers and trailers.
async fn four_kinds(g: &mut Tonic) {
    let mut req = tonic::Request::new("hello".to_string());
    req.metadata_mut()
        .insert("user", MetadataValue::from_static("ann"));
    req.metadata_mut().insert_bin(
        "trace-bin",
        BinaryMetadataValue::from_bytes(&[0, 1, 0xfe, 0xff]),
    );
    let resp = unary(g, "/t.T/Echo", req).await.expect("echo");
    let md = resp.metadata();
    assert_eq!(md.get("protocol").unwrap(), "grpc");
    assert_eq!(md.get("seen-user").unwrap(), "ann");
    assert_eq!(
        md.get_bin("seen-bin").unwrap().to_bytes().unwrap().as_ref(),
        &[0, 1, 0xfe, 0xff]
    );
    // tonic merges a unary call's trailers into its metadata.
    assert_eq!(md.get("t-trailer").unwrap(), "done");
    assert_eq!(
        md.get_bin("t-trailer-bin")
            .unwrap()
            .to_bytes()
            .unwrap()
            .as_ref(),
        &[0xde, 0xad]
    );
    assert_eq!(resp.into_inner(), "hello");

    g.ready().await.unwrap();
    let resp = g
        .server_streaming(
            tonic::Request::new("a b c".to_string()),
            path("/t.T/Split"),
            codec(),
        )
        .await
        .expect("split");
    let mut s = resp.into_inner();
    let mut words = Vec::new();
    while let Some(w) = s.message().await.expect("word") {
        words.push(w);
    }
    assert_eq!(words, ["a", "b", "c"]);
    let trailers = s
        .trailers()
        .await
        .expect("trailers")
        .expect("some trailers");
    assert_eq!(trailers.get("count").unwrap(), "many");

    g.ready().await.unwrap();
    let parts = stream::iter(["x", "y", "z"].map(String::from));
    let joined = g
        .client_streaming(tonic::Request::new(parts), path("/t.T/Join"), codec())
        .await
        .expect("join");
    assert_eq!(joined.into_inner(), "x+y+z");

    g.ready().await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(4);
    let out = tokio_stream_from(rx);
    let resp = g
        .streaming(tonic::Request::new(out), path("/t.T/Upper"), codec())
        .await
        .expect("upper");
    let mut s = resp.into_inner();
    // Ping-pong: each answer arrives before the next request is sent.
    for w in ["one", "two", "three"] {
        tx.send(w.to_owned()).await.unwrap();
        assert_eq!(s.message().await.unwrap().unwrap(), w.to_uppercase());
    }
    drop(tx);
    assert!(s.message().await.unwrap().is_none());
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<String>,
) -> impl futures_util::Stream<Item = String> + Send + 'static {
    stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[tokio::test]
async fn tonic_calls_every_kind_over_h2c() {
    let s = start(|b| b, "tcp://127.0.0.1:0").await;
    let mut g = s.tonic().await;
    four_kinds(&mut g).await;
    s.wait_for("upper grpc").await;
    s.stop().await;
}

#[tokio::test]
async fn errors_carry_code_message_details_and_trailers() {
    let s = start(|b| b, "tcp://127.0.0.1:0").await;
    let mut g = s.tonic().await;
    let err = unary(&mut g, "/t.T/Fail", tonic::Request::new(String::new()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(err.message(), "no 100% grüße");
    assert_eq!(err.details(), &[1, 2, 3, 0xff]);
    assert_eq!(err.metadata().get("why").unwrap(), "because");

    let err = unary(&mut g, "/t.T/Nope", tonic::Request::new(String::new()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    assert!(err.message().contains("/t.T/Nope"), "{err:?}");
    s.stop().await;
}

/// A raw HTTP/2 client (h2): sends exactly the headers given, enforces no deadline itself.
async fn raw_call(
    hp: &str,
    method: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> (http::HeaderMap, Vec<u8>, Option<http::HeaderMap>) {
    let tcp = tokio::net::TcpStream::connect(hp).await.unwrap();
    let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::post(format!("http://{hp}{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let (resp, mut send) = client.send_request(req.body(()).unwrap(), false).unwrap();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
    framed.extend_from_slice(body);
    send.send_data(bytes::Bytes::from(framed), true).unwrap();
    let resp = resp.await.unwrap();
    let (parts, mut recv) = resp.into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.unwrap();
        let _ = recv.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = recv.trailers().await.unwrap();
    (parts.headers, data, trailers)
}

#[tokio::test]
async fn grpc_timeout_is_the_handlers_deadline() {
    let s = start(|b| b, "tcp://127.0.0.1:0").await;
    let t0 = std::time::Instant::now();
    let (headers, data, trailers) =
        raw_call(&s.hp, "/t.T/Slow", &[("grpc-timeout", "300m")], b"").await;
    assert!(t0.elapsed() >= Duration::from_millis(250) && t0.elapsed() < Duration::from_secs(10));
    // Nothing was sent before the deadline: a trailers-only response.
    assert!(data.is_empty() && trailers.is_none(), "{trailers:?}");
    assert_eq!(headers.get("grpc-status").unwrap(), "4", "{headers:?}");
    s.wait_for("deadline true").await;
    // The handler's call was cancelled when its deadline passed.
    s.wait_for("cancelled").await;
    s.stop().await;
}

#[tokio::test]
async fn raw_h2_sees_headers_message_and_trailers() {
    let s = start(|b| b, "tcp://127.0.0.1:0").await;
    // "hi" as a protobuf string (field 1).
    let (headers, data, trailers) = raw_call(
        &s.hp,
        "/t.T/Echo",
        &[("user", "bob"), ("trace-bin", "AAE")],
        &[10, 2, b'h', b'i'],
    )
    .await;
    assert_eq!(headers.get("content-type").unwrap(), "application/grpc");
    assert_eq!(headers.get("seen-user").unwrap(), "bob");
    assert_eq!(headers.get("seen-bin").unwrap(), "AAE");
    assert_eq!(data, [0, 0, 0, 0, 4, 10, 2, b'h', b'i']);
    let trailers = trailers.expect("trailers");
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    assert_eq!(trailers.get("t-trailer").unwrap(), "done");
    // Errors before any response are trailers-only, the message percent-encoded.
    let (headers, _, trailers) = raw_call(&s.hp, "/t.T/Fail", &[], b"").await;
    assert!(trailers.is_none());
    assert_eq!(headers.get("grpc-status").unwrap(), "9");
    assert_eq!(
        headers.get("grpc-message").unwrap(),
        "no 100%25 gr%C3%BC%C3%9Fe"
    );
    assert_eq!(headers.get("grpc-status-details-bin").unwrap(), "AQID/w");
    // A malformed grpc-timeout and an unknown encoding are refused.
    let (headers, _, _) = raw_call(&s.hp, "/t.T/Echo", &[("grpc-timeout", "soon")], b"").await;
    assert_eq!(headers.get("grpc-status").unwrap(), "13");
    let (headers, _, _) = raw_call(&s.hp, "/t.T/Echo", &[("grpc-encoding", "snappy")], b"").await;
    assert_eq!(headers.get("grpc-status").unwrap(), "12");
    assert!(headers.get("grpc-accept-encoding").is_some());
    s.stop().await;
}

/// A unary handler that fails with headers (`Status::with_headers`): HEADERS without
/// END_STREAM carrying them, then the trailers with the status, not a trailers-only answer;
/// tonic's client and topspin's `grpc://` client both see the status.
#[tokio::test]
async fn a_unary_error_with_headers_sends_them_before_the_trailers() {
    let s = start(|b| b, "tcp://127.0.0.1:0").await;
    let (headers, data, trailers) = raw_call(&s.hp, "/t.T/FailWithHeaders", &[], b"").await;
    assert_eq!(headers.get("early").unwrap(), "yes", "{headers:?}");
    assert_eq!(headers.get("content-type").unwrap(), "application/grpc");
    assert!(headers.get("grpc-status").is_none(), "{headers:?}");
    assert!(data.is_empty());
    let trailers = trailers.expect("trailers after the headers");
    assert_eq!(trailers.get("grpc-status").unwrap(), "14");
    assert_eq!(trailers.get("grpc-message").unwrap(), "draining");
    assert_eq!(trailers.get("why").unwrap(), "because");
    assert!(trailers.get("early").is_none(), "{trailers:?}");

    let mut g = s.tonic().await;
    let err = unary(
        &mut g,
        "/t.T/FailWithHeaders",
        tonic::Request::new(String::new()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(err.message(), "draining");
    s.stop().await;
}

/// A response stream's `MessageCompression` reaches gRPC's compressed flag, message by
/// message: the first answer compressed (flag 1), the second not (flag 0), in one call.
#[tokio::test]
async fn a_switch_turns_grpc_compression_off_between_messages() {
    let s = start(|b| b, "tcp://127.0.0.1:0").await;
    let (headers, data, trailers) = raw_call(
        &s.hp,
        "/t.T/Flags",
        &[("grpc-accept-encoding", "gzip")],
        b"",
    )
    .await;
    assert_eq!(headers.get("grpc-encoding").unwrap(), "gzip", "{headers:?}");
    assert_eq!(trailers.expect("trailers").get("grpc-status").unwrap(), "0");
    let mut flags = Vec::new();
    let mut rest = &data[..];
    while rest.len() >= 5 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        flags.push((rest[0], len));
        rest = &rest[5 + len..];
    }
    assert!(rest.is_empty());
    assert_eq!(flags.len(), 2, "{flags:?}");
    assert_eq!(flags[0].0, 1, "{flags:?}");
    assert!(flags[0].1 < 1000, "{flags:?}");
    assert_eq!(flags[1].0, 0, "{flags:?}");
    assert!(flags[1].1 > 4000, "{flags:?}");
    s.stop().await;
}

#[tokio::test]
async fn a_client_reset_cancels_the_handler() {
    let s = start(|b| b, "tcp://127.0.0.1:0").await;
    let mut g = s.tonic().await;
    let call = unary(&mut g, "/t.T/Slow", tonic::Request::new(String::new()));
    // Dropping the call's future resets its stream (RST_STREAM CANCEL).
    let r = tokio::time::timeout(Duration::from_millis(300), call).await;
    assert!(r.is_err(), "the slow call answered: {r:?}");
    s.wait_for("deadline false").await;
    s.wait_for("cancelled").await;
    // The connection goes on.
    let ok = unary(&mut g, "/t.T/Echo", tonic::Request::new("still".into())).await;
    assert_eq!(ok.unwrap().into_inner(), "still");
    s.stop().await;
}

#[tokio::test]
async fn messages_over_max_message_size_are_resource_exhausted() {
    let s = start(|b| b.max_message_size(1024), "tcp://127.0.0.1:0").await;
    let mut g = s.tonic().await;
    let err = unary(&mut g, "/t.T/Echo", tonic::Request::new("x".repeat(5000)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    let ok = unary(&mut g, "/t.T/Echo", tonic::Request::new("x".repeat(500))).await;
    assert_eq!(ok.unwrap().into_inner().len(), 500);
    s.stop().await;
}

#[tokio::test]
async fn grpc_compression_both_ways() {
    for (ours, theirs) in [
        (Encoding::Gzip, tonic::codec::CompressionEncoding::Gzip),
        (Encoding::Zstd, tonic::codec::CompressionEncoding::Zstd),
    ] {
        let config =
            Config::default().with_compression(Some(Compression::new(ours).with_threshold(0)));
        let s = start(|b| b.config(config), "tcp://127.0.0.1:0").await;
        let mut g = s
            .tonic()
            .await
            .send_compressed(theirs)
            .accept_compressed(theirs);
        let big = "compressible ".repeat(1000);
        let resp = unary(&mut g, "/t.T/Echo", tonic::Request::new(big.clone()))
            .await
            .expect("echo");
        assert_eq!(resp.into_inner(), big);
        four_kinds(&mut g).await;
        s.stop().await;
    }
}

#[tokio::test]
async fn one_port_serves_native_and_grpc_clients_at_once() {
    let s = start(|b| b, "tcp://127.0.0.1:0").await;
    let native = Channel::connect(format!("tcp://{}", s.hp))
        .await
        .expect("native connects");
    let mut g = s.tonic().await;
    let native_calls = async {
        for i in 0..50 {
            let r = native
                .unary(Codec::default(), "/t.T/Echo", format!("n{i}"))
                .await
                .expect("native echo");
            assert_eq!(r.metadata().get_str("protocol"), Some("topspin"));
            assert_eq!(r.into_inner(), format!("n{i}"));
        }
    };
    let grpc_calls = async {
        for i in 0..50 {
            let r = unary(&mut g, "/t.T/Echo", tonic::Request::new(format!("g{i}")))
                .await
                .expect("grpc echo");
            assert_eq!(r.metadata().get("protocol").unwrap(), "grpc");
            assert_eq!(r.into_inner(), format!("g{i}"));
        }
    };
    tokio::join!(native_calls, grpc_calls);
    s.stop().await;
}

#[tokio::test]
async fn tls_with_alpn_h2() {
    let ca = layered::Ca::new("grpc test CA");
    let pair = ca.issue("server", &["localhost"], false);
    let tls = topspin::tls::ServerTls::from_pem_files(&pair.cert, &pair.key).expect("tls");
    let s = start(|b| b.tls(tls), "tls://127.0.0.1:0").await;
    let ca_pem = std::fs::read(&ca.cert).unwrap();
    let ch = tonic::transport::Endpoint::from_shared(format!("https://{}", s.hp))
        .unwrap()
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca_pem))
                .domain_name("localhost"),
        )
        .unwrap()
        .connect()
        .await
        .expect("tonic connects over TLS");
    let mut g = tonic::client::Grpc::new(ch);
    four_kinds(&mut g).await;
    // The native client still gets topspin/1 on the same TLS port.
    let native = topspin::Endpoint::new(format!(
        "tls://localhost:{}",
        s.hp.rsplit(':').next().unwrap()
    ))
    .unwrap()
    .tls(topspin::tls::ClientTls::ca_pem_file(&ca.cert).unwrap())
    .connect()
    .await
    .expect("native TLS connects");
    let r = native
        .unary(Codec::default(), "/t.T/Echo", "n".to_string())
        .await
        .unwrap();
    assert_eq!(r.metadata().get_str("protocol"), Some("topspin"));
    s.stop().await;
}

#[tokio::test]
async fn grpc_false_turns_the_face_off() {
    let s = start(|b| b.grpc(false), "tcp://127.0.0.1:0").await;
    let r = tokio::time::timeout(Duration::from_secs(10), async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", s.hp))
            .unwrap()
            .connect()
            .await;
        match ch {
            Err(_) => Err(()),
            Ok(ch) => {
                let mut g = tonic::client::Grpc::new(ch);
                unary(&mut g, "/t.T/Echo", tonic::Request::new("x".into()))
                    .await
                    .map(|_| ())
                    .map_err(|_| ())
            }
        }
    })
    .await
    .expect("fails promptly");
    assert!(r.is_err());
    // Native clients are served as ever.
    let native = Channel::connect(format!("tcp://{}", s.hp)).await.unwrap();
    let r = native
        .unary(Codec::default(), "/t.T/Echo", "n".to_string())
        .await
        .unwrap();
    assert_eq!(r.into_inner(), "n");
    s.stop().await;
}

#[tokio::test]
async fn graceful_shutdown_lets_grpc_calls_finish_then_ends_the_rest_unavailable() {
    let s = start(|b| b, "tcp://127.0.0.1:0").await;
    let mut g = s.tonic().await;
    let slow = tokio::spawn({
        let mut g = g.clone();
        async move { unary(&mut g, "/t.T/Slow", tonic::Request::new(String::new())).await }
    });
    s.wait_for("deadline false").await;
    let ok = unary(&mut g, "/t.T/Echo", tonic::Request::new("before".into())).await;
    assert_eq!(ok.unwrap().into_inner(), "before");
    s.shutdown.shutdown(Duration::from_millis(200)).await;
    let err = slow.await.unwrap().unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    s.wait_for("cancelled").await;
    let _ = Code::Ok;
}

#[tokio::test]
async fn a_sniffing_port_serves_grpc_too() {
    let s = start(
        |b| b.sniff_transports(Duration::from_secs(5)),
        "tcp://127.0.0.1:0",
    )
    .await;
    let mut g = s.tonic().await;
    let r = unary(&mut g, "/t.T/Echo", tonic::Request::new("g".into())).await;
    assert_eq!(r.unwrap().metadata().get("protocol").unwrap(), "grpc");
    let native = Channel::connect(format!("tcp://{}", s.hp)).await.unwrap();
    let r = native
        .unary(Codec::default(), "/t.T/Echo", "n".to_string())
        .await
        .unwrap();
    assert_eq!(r.metadata().get_str("protocol"), Some("topspin"));
    s.stop().await;
}

/// Polls the server's connections gauge until it reads `want` (10 s at most).
async fn connections_become(gauges: &topspin::Gauges, want: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = gauges.snapshot().connections;
        if now == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "connections gauge stays at {now}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A gRPC connection counts in `Server::gauges()` while it is open, and once it is
/// `max_connection_age` old (±10%) it is sent a graceful GOAWAY: the call in flight finishes
/// normally, then the connection closes and leaves the gauge.
#[tokio::test]
async fn grpc_connections_count_and_end_gracefully_at_max_connection_age() {
    let config = Config::default()
        .with_max_connection_age(Some(Duration::from_secs(1)))
        .with_max_connection_age_grace(Duration::from_secs(10));
    let server = service(Events::default())
        .config(config)
        .unary(
            "/t.T/Nap",
            Codec::default(),
            |req: Request<String>| async move {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                Ok(Response::new(req.into_inner()))
            },
        )
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind");
    let hp = server.local_addr().to_string()["tcp://".len()..].to_owned();
    let gauges = server.gauges();
    let shutdown = server.shutdown_handle();
    tokio::spawn(server.serve());
    assert_eq!(gauges.snapshot().connections, 0);

    let tcp = tokio::net::TcpStream::connect(&hp).await.unwrap();
    let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    connections_become(&gauges, 1).await;

    // A call that is still running when the connection reaches its age.
    let req = http::Request::post(format!("http://{hp}/t.T/Nap"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (resp, mut send) = client.send_request(req, false).unwrap();
    send.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), resp)
        .await
        .expect("response in time")
        .expect("the call is not refused");
    let mut body = resp.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("data");
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.expect("trailers").expect("trailers");
    assert_eq!(trailers.get("grpc-status").unwrap(), "0", "{trailers:?}");

    // GOAWAY, and with no call left the connection ends: the client's connection future
    // returns (within the 10 s grace: the close is the GOAWAY's, not the grace's abort).
    let ended = tokio::time::timeout(Duration::from_secs(8), conn)
        .await
        .expect("the server closes the connection after max_connection_age");
    assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
    connections_become(&gauges, 0).await;
    // A new stream on the old connection is not possible: the server said GOAWAY.
    let req = http::Request::post(format!("http://{hp}/t.T/Echo"))
        .body(())
        .unwrap();
    assert!(client.send_request(req, true).is_err());
    shutdown.shutdown(Duration::from_secs(1)).await;
}

/// `Config::keepalive_interval` on the gRPC face: a peer that never answers the server's PING
/// is closed after `keepalive_timeout`, and leaves the gauge; one that answers (h2's client
/// does) keeps its connection across many pings.
#[tokio::test]
async fn grpc_keep_alive_closes_a_silent_peer_and_keeps_a_live_one() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = Config::default()
        .with_keepalive_interval(Some(Duration::from_millis(200)))
        .with_keepalive_timeout(Duration::from_millis(500));
    let server = service(Events::default())
        .config(config)
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind");
    let hp = server.local_addr().to_string()["tcp://".len()..].to_owned();
    let gauges = server.gauges();
    let shutdown = server.shutdown_handle();
    tokio::spawn(server.serve());

    // Silent: the client preface and an empty SETTINGS frame, then nothing ever again.
    let mut silent = tokio::net::TcpStream::connect(&hp).await.unwrap();
    silent
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    connections_become(&gauges, 1).await;
    let mut seen = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 1024];
        loop {
            match silent.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the server keeps a peer that answers no PING"
    );
    // Among what the server sent: a PING frame (type 6, not an ACK).
    let mut at = 0;
    let mut pinged = false;
    while at + 9 <= seen.len() {
        let len = usize::from(seen[at]) << 16
            | usize::from(seen[at + 1]) << 8
            | usize::from(seen[at + 2]);
        pinged |= seen[at + 3] == 6 && seen[at + 4] & 1 == 0;
        at += 9 + len;
    }
    assert!(pinged, "no PING in {seen:?}");
    connections_become(&gauges, 0).await;

    // Live: h2's client answers the pings; the connection outlives many intervals.
    let tcp = tokio::net::TcpStream::connect(&hp).await.unwrap();
    let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!conn.is_finished(), "a live peer's connection was closed");
    connections_become(&gauges, 1).await;
    let req = http::Request::post(format!("http://{hp}/t.T/Echo"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    client = client.ready().await.expect("still open");
    let (resp, mut send) = client.send_request(req, false).unwrap();
    send.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .unwrap();
    let resp = resp.await.expect("answered");
    assert_eq!(resp.status(), http::StatusCode::OK);
    drop(client);
    shutdown.shutdown(Duration::from_secs(1)).await;
}

/// A byte stream that can be frozen: once `frozen`, it neither reads nor writes again (a peer
/// that hangs without closing its socket).
struct Freezable {
    io: tokio::net::TcpStream,
    frozen: Arc<std::sync::atomic::AtomicBool>,
}

impl Freezable {
    fn is_frozen(&self) -> bool {
        self.frozen.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl tokio::io::AsyncRead for Freezable {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.is_frozen() {
            return std::task::Poll::Pending;
        }
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Freezable {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.is_frozen() {
            return std::task::Poll::Pending;
        }
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.is_frozen() {
            return std::task::Poll::Pending;
        }
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A keep-alive test server: the test service with these keep-alive settings on plain TCP.
async fn keep_alive_server(
    every: Duration,
    timeout: Duration,
) -> (String, topspin::Gauges, ShutdownHandle) {
    let config = Config::default()
        .with_keepalive_interval(Some(every))
        .with_keepalive_timeout(timeout);
    let server = service(Events::default())
        .config(config)
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind");
    let hp = server.local_addr().to_string()["tcp://".len()..].to_owned();
    let gauges = server.gauges();
    let shutdown = server.shutdown_handle();
    tokio::spawn(server.serve());
    (hp, gauges, shutdown)
}

/// The gRPC face's keep-alive is the native connection's rule (`connection::liveness`): an h2
/// peer that answered the server's PINGs and then hangs (reads and writes nothing, its socket
/// open) is closed once a PING goes unanswered for `keepalive_timeout`; until it hangs, its
/// connection outlives many intervals.
#[tokio::test]
async fn grpc_keep_alive_closes_an_h2_peer_that_stops_answering() {
    let (every, timeout) = (Duration::from_millis(200), Duration::from_millis(400));
    let (hp, gauges, shutdown) = keep_alive_server(every, timeout).await;
    let frozen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let io = Freezable {
        io: tokio::net::TcpStream::connect(&hp).await.unwrap(),
        frozen: frozen.clone(),
    };
    let (mut client, conn) = h2::client::handshake(io).await.unwrap();
    let conn = tokio::spawn(conn);
    // Live: the idle client answers every PING (h2 does); many intervals pass.
    tokio::time::sleep(every * 8).await;
    assert!(!conn.is_finished(), "a live peer's connection was closed");
    connections_become(&gauges, 1).await;
    let req = http::Request::post(format!("http://{hp}/t.T/Echo"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    client = client.ready().await.expect("still open");
    let (resp, mut send) = client.send_request(req, false).unwrap();
    send.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .unwrap();
    assert_eq!(resp.await.expect("answered").status(), http::StatusCode::OK);
    // Hung: the server's next PING is never answered, and the server closes the connection.
    frozen.store(true, std::sync::atomic::Ordering::Relaxed);
    connections_become(&gauges, 0).await;
    drop((client, conn));
    shutdown.shutdown(Duration::from_secs(1)).await;
}

/// As on a native connection, the gRPC face PINGs only after `keepalive_interval` without a
/// byte from the client, and bytes answer its PING as the PONG would: a client that keeps
/// sending (its own PINGs here) while it answers none of the server's is not closed.
#[tokio::test]
async fn grpc_keep_alive_spares_a_client_that_keeps_sending() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (every, timeout) = (Duration::from_secs(1), Duration::from_secs(1));
    let (hp, gauges, shutdown) = keep_alive_server(every, timeout).await;
    let sock = tokio::net::TcpStream::connect(&hp).await.unwrap();
    let (mut rd, mut wr) = sock.into_split();
    // Reads what the server sends (PING ACKs, maybe PINGs) until it closes.
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 1024];
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    });
    wr.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    connections_become(&gauges, 1).await;
    // A PING of its own every 100 ms for twice interval + timeout.
    let ping = b"\0\0\x08\x06\0\0\0\0\0chatting";
    for _ in 0..40 {
        if wr.write_all(ping).await.is_err() {
            break; // closed by the server (asserted below)
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !reader.is_finished(),
        "the server closed a client that kept sending"
    );
    assert_eq!(gauges.snapshot().connections, 1);
    drop(wr);
    reader.abort();
    shutdown.shutdown(Duration::from_secs(1)).await;
}

/// A call still running when `max_connection_age_grace` after the age runs out is ended
/// (its handler cancelled), as on a native connection.
#[tokio::test]
async fn max_connection_age_grace_ends_calls_that_outlast_it() {
    let config = Config::default()
        .with_max_connection_age(Some(Duration::from_millis(300)))
        .with_max_connection_age_grace(Duration::from_millis(300));
    let s = start(|b| b.config(config), "tcp://127.0.0.1:0").await;
    let mut g = s.tonic().await;
    let slow = tokio::spawn(async move {
        unary(&mut g, "/t.T/Slow", tonic::Request::new(String::new())).await
    });
    let r = tokio::time::timeout(Duration::from_secs(10), slow)
        .await
        .expect("the call ends within the age and its grace (30 s handler)");
    let err = r.unwrap().unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    s.wait_for("cancelled").await;
    s.stop().await;
}

/// As on a native connection: a method whose handler blocked its connection's task once is
/// polled on a task of its own from then on, so a tonic client's quick call on the same
/// HTTP/2 connection is answered while the blocking one still runs. Told by order, not by
/// timing (`blocking::Handlers`): the second blocking handler stays blocked until the quick
/// one has run, or 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_blocks_holds_up_its_grpc_connection_once() {
    static H: common::blocking::Handlers = common::blocking::Handlers::new();
    let s = start(
        |b| {
            b.unary(
                "/t.T/Block",
                Codec::default(),
                |_r: Request<String>| async move { Ok(Response::new(H.block().to_owned())) },
            )
            .unary(
                "/t.T/Quick",
                Codec::default(),
                |_r: Request<String>| async move { Ok(Response::new(H.quick().to_owned())) },
            )
        },
        "tcp://127.0.0.1:0",
    )
    .await;
    let mut g = s.tonic().await;
    let r = unary(&mut g, "/t.T/Block", tonic::Request::new(String::new())).await;
    assert_eq!(r.expect("learnt").into_inner(), "learnt");
    let blocking = {
        let mut g = g.clone();
        tokio::spawn(async move {
            unary(&mut g, "/t.T/Block", tonic::Request::new(String::new())).await
        })
    };
    H.wait_for_second();
    let quick = unary(&mut g, "/t.T/Quick", tonic::Request::new(String::new()))
        .await
        .expect("quick");
    assert_eq!(
        quick.into_inner(),
        "during",
        "the quick call waited for the blocking one"
    );
    let blocked = blocking.await.unwrap().expect("blocking call");
    assert_eq!(blocked.into_inner(), "saw the quick call");
    s.stop().await;
}

/// As on the native face: the trailers a handler set on a streaming response reach a tonic
/// client with the error status that ends the stream.
#[tokio::test]
async fn trailers_of_a_stream_that_ends_in_an_error_reach_a_grpc_client() {
    let s = start(
        |b| {
            b.server_streaming(
                "/t.T/FailsWithTrailers",
                Codec::default(),
                |_r: Request<String>| async move {
                    let items = stream::iter([
                        Ok("one".to_owned()),
                        Err(Status::new(Code::Aborted, "stopped")),
                    ]);
                    let trailers = Metadata::builder()
                        .text("from-response", "r")
                        .unwrap()
                        .build();
                    Ok(Response::new(items).with_trailers(trailers))
                },
            )
        },
        "tcp://127.0.0.1:0",
    )
    .await;
    let mut g = s.tonic().await;
    g.ready().await.unwrap();
    let resp = g
        .server_streaming(
            tonic::Request::new(String::new()),
            path("/t.T/FailsWithTrailers"),
            codec(),
        )
        .await
        .expect("opens");
    let mut st = resp.into_inner();
    assert_eq!(st.message().await.expect("one").as_deref(), Some("one"));
    let e = st.message().await.expect_err("ends in an error");
    assert_eq!(e.code(), tonic::Code::Aborted);
    assert_eq!(e.metadata().get("from-response").unwrap(), "r");
    s.stop().await;
}

/// On the gRPC face as on the native one: the handler sees the request's `grpc-encoding`
/// (`Request::encoding`) and chooses its response's (`Response::with_compression`), over the
/// server's default — the interop suite's per-call compression.
#[tokio::test]
async fn a_handler_chooses_its_grpc_response_compression() {
    use tonic::codec::CompressionEncoding;
    let s = start(
        |b| {
            b.config(Config::default().with_compression(Some(Compression::new(Encoding::Zstd))))
                .unary(
                    "/t.T/Chooses",
                    Codec::default(),
                    |req: Request<String>| async move {
                        let came = req.encoding().map_or("none", |e| e.name()).to_owned();
                        let choice = (came == "gzip")
                            .then(|| Compression::new(Encoding::Gzip).with_threshold(0));
                        Ok(Response::new(came).with_compression(choice))
                    },
                )
        },
        "tcp://127.0.0.1:0",
    )
    .await;
    let mut g = s
        .tonic()
        .await
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Zstd);
    let r = unary(
        &mut g,
        "/t.T/Chooses",
        tonic::Request::new("x".repeat(2000)),
    )
    .await
    .expect("call");
    assert_eq!(r.metadata().get("grpc-encoding").unwrap(), "gzip");
    assert_eq!(r.into_inner(), "gzip");
    // Uncompressed request: the handler chooses none, though zstd is the server's default.
    let mut g = s.tonic().await.accept_compressed(CompressionEncoding::Zstd);
    let r = unary(
        &mut g,
        "/t.T/Chooses",
        tonic::Request::new("x".repeat(2000)),
    )
    .await
    .expect("call");
    assert!(
        r.metadata().get("grpc-encoding").is_none(),
        "{:?}",
        r.metadata()
    );
    assert_eq!(r.into_inner(), "none");
    s.stop().await;
}
