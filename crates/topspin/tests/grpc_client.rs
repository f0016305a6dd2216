//! The gRPC client mode against a real gRPC server: tonic (hyper and h2 underneath, the
//! service written as tonic's generated code writes it) on a loopback port, called by a
//! topspin `Channel` through `grpc://` (h2c) and `grpcs://` (TLS, ALPN h2): the four call
//! kinds, deadlines, status details, metadata both ways, cancellation, a 2 MB message and
//! compression.
#![cfg(feature = "tls")]

mod common;
mod layered;

use bytes::Bytes;
use futures_util::{stream, Stream, StreamExt};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::codec::CompressionEncoding;
use tonic::codegen::{http, Service};
use tonic::server::{Grpc, NamedService};
use topspin::codec::RawCodec;
use topspin::tls::ClientTls;
use topspin::{Channel, Code, Compression, Encoding, Endpoint, Metadata, Request};

// ---- the tonic side -------------------------------------------------------------------------

/// tonic's codec for raw bytes: the one the tonic entry of the capability suite uses.
use common::TonicRaw as Raw;

/// A call as the server saw it: method, `grpc-timeout`, `grpc-encoding`.
type CallHeaders = (String, Option<String>, Option<String>);

/// What the tonic handlers saw.
#[derive(Default)]
struct Seen {
    /// `grpc-timeout` and `grpc-encoding` of each call, by method.
    headers: Mutex<Vec<CallHeaders>>,
    /// Told when a handler's future (or response stream) is dropped before it finished.
    dropped: Mutex<Option<mpsc::UnboundedSender<&'static str>>>,
}

/// Tells `Seen::dropped` when dropped while armed.
struct DropFlag(Arc<Seen>, &'static str, bool);

impl DropFlag {
    fn disarm(mut self) {
        self.2 = false;
    }
}

impl Drop for DropFlag {
    fn drop(&mut self) {
        if self.2 {
            if let Some(tx) = &*self.0.dropped.lock().unwrap() {
                let _ = tx.send(self.1);
            }
        }
    }
}

type BoxFut<T> = Pin<Box<dyn Future<Output = Result<T, tonic::Status>> + Send>>;
type BoxStream = Pin<Box<dyn Stream<Item = Result<Bytes, tonic::Status>> + Send>>;

/// A handler: a function of the test's state and the request.
type HandlerFn<Req, Resp> = fn(Arc<Seen>, tonic::Request<Req>) -> BoxFut<tonic::Response<Resp>>;

/// A tower service from a handler: tonic's `UnaryService` and friends are implemented for it.
struct Handler<Req, Resp>(Arc<Seen>, HandlerFn<Req, Resp>);

impl<Req, Resp> Service<tonic::Request<Req>> for Handler<Req, Resp> {
    type Response = tonic::Response<Resp>;
    type Error = tonic::Status;
    type Future = BoxFut<tonic::Response<Resp>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), tonic::Status>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: tonic::Request<Req>) -> Self::Future {
        (self.1)(self.0.clone(), req)
    }
}

fn echo(_: Arc<Seen>, r: tonic::Request<Bytes>) -> BoxFut<tonic::Response<Bytes>> {
    Box::pin(async move {
        let md = r.metadata().clone();
        let mut resp = tonic::Response::new(r.into_inner());
        if let Some(u) = md.get("x-user") {
            resp.metadata_mut().insert("x-echo-user", u.clone());
        }
        if let Some(b) = md.get_bin("x-raw-bin") {
            resp.metadata_mut().insert_bin("x-echo-raw-bin", b.clone());
        }
        Ok(resp)
    })
}

fn fail(_: Arc<Seen>, _: tonic::Request<Bytes>) -> BoxFut<tonic::Response<Bytes>> {
    Box::pin(async move {
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert_bin(
            "x-why-bin",
            tonic::metadata::MetadataValue::from_bytes(&[9, 0, 9]),
        );
        Err(tonic::Status::with_details_and_metadata(
            tonic::Code::NotFound,
            "no key 🍎 (100% gone)",
            Bytes::from_static(&[1, 2, 3, 0, 255]),
            md,
        ))
    })
}

fn slow(seen: Arc<Seen>, _: tonic::Request<Bytes>) -> BoxFut<tonic::Response<Bytes>> {
    let flag = DropFlag(seen, "slow", true);
    Box::pin(async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        flag.disarm();
        Ok(tonic::Response::new(Bytes::from_static(b"late")))
    })
}

fn count(_: Arc<Seen>, r: tonic::Request<Bytes>) -> BoxFut<tonic::Response<BoxStream>> {
    Box::pin(async move {
        let n = r.get_ref().first().copied().unwrap_or(0);
        let items = (0..n).map(|i| Ok(Bytes::from(format!("m{i}"))));
        Ok(tonic::Response::new(
            Box::pin(stream::iter(items)) as BoxStream
        ))
    })
}

fn forever(seen: Arc<Seen>, _: tonic::Request<Bytes>) -> BoxFut<tonic::Response<BoxStream>> {
    let flag = DropFlag(seen, "forever", true);
    Box::pin(async move {
        let s = stream::unfold((0u32, flag), |(i, flag)| async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Some((Ok(Bytes::from(format!("t{i}"))), (i + 1, flag)))
        });
        Ok(tonic::Response::new(Box::pin(s) as BoxStream))
    })
}

fn flood(_: Arc<Seen>, _: tonic::Request<Bytes>) -> BoxFut<tonic::Response<BoxStream>> {
    Box::pin(async move {
        let kib = Bytes::from(vec![7u8; 1024]);
        let s = stream::repeat_with(move || Ok(kib.clone()));
        Ok(tonic::Response::new(Box::pin(s) as BoxStream))
    })
}

fn big_headers(_: Arc<Seen>, r: tonic::Request<Bytes>) -> BoxFut<tonic::Response<Bytes>> {
    Box::pin(async move {
        let n = r.get_ref().first().copied().unwrap_or(0);
        let mut resp = tonic::Response::new(Bytes::from_static(b"x"));
        let v: tonic::metadata::MetadataValue<_> = "y".repeat(8000).parse().unwrap();
        for i in 0..n {
            let k: tonic::metadata::MetadataKey<_> = format!("x-big-{i}").parse().unwrap();
            resp.metadata_mut().insert(k, v.clone());
        }
        Ok(resp)
    })
}

fn nap(_: Arc<Seen>, r: tonic::Request<Bytes>) -> BoxFut<tonic::Response<Bytes>> {
    Box::pin(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(tonic::Response::new(r.into_inner()))
    })
}

fn stall(
    _: Arc<Seen>,
    r: tonic::Request<tonic::Streaming<Bytes>>,
) -> BoxFut<tonic::Response<Bytes>> {
    Box::pin(async move {
        let _requests = r.into_inner(); // never read
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(tonic::Response::new(Bytes::new()))
    })
}

fn sum(_: Arc<Seen>, r: tonic::Request<tonic::Streaming<Bytes>>) -> BoxFut<tonic::Response<Bytes>> {
    Box::pin(async move {
        let mut s = r.into_inner();
        let mut all = Vec::new();
        while let Some(m) = s.message().await? {
            all.extend_from_slice(&m);
        }
        Ok(tonic::Response::new(Bytes::from(all)))
    })
}

fn chat(
    _: Arc<Seen>,
    r: tonic::Request<tonic::Streaming<Bytes>>,
) -> BoxFut<tonic::Response<BoxStream>> {
    Box::pin(async move {
        let s = r
            .into_inner()
            .map(|m| m.map(|m| Bytes::from(m.to_ascii_uppercase())));
        Ok(tonic::Response::new(Box::pin(s) as BoxStream))
    })
}

/// The test service, routed by path as tonic's generated servers do.
#[derive(Clone)]
struct TestService {
    seen: Arc<Seen>,
}

impl NamedService for TestService {
    const NAME: &'static str = "test.T";
}

fn grpc() -> Grpc<Raw> {
    Grpc::new(Raw)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Zstd)
        .send_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Zstd)
        .max_decoding_message_size(8 << 20)
}

fn header(req: &http::Request<tonic::body::Body>, name: &str) -> Option<String> {
    req.headers()
        .get(name)
        .map(|v| v.to_str().unwrap_or("?").to_owned())
}

impl Service<http::Request<tonic::body::Body>> for TestService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let seen = self.seen.clone();
        let path = req.uri().path().to_owned();
        seen.headers.lock().unwrap().push((
            path.clone(),
            header(&req, "grpc-timeout"),
            header(&req, "grpc-encoding"),
        ));
        Box::pin(async move {
            let mut g = grpc();
            let res = match path.as_str() {
                "/test.T/Echo" => g.unary(Handler(seen, echo), req).await,
                "/test.T/Fail" => g.unary(Handler(seen, fail), req).await,
                "/test.T/Slow" => g.unary(Handler(seen, slow), req).await,
                "/test.T/Count" => g.server_streaming(Handler(seen, count), req).await,
                "/test.T/Forever" => g.server_streaming(Handler(seen, forever), req).await,
                // Not compressed: the window is counted in message bytes.
                "/test.T/Nap" => g.unary(Handler(seen, nap), req).await,
                "/test.T/Stall" => g.client_streaming(Handler(seen, stall), req).await,
                "/test.T/BigHeaders" => g.unary(Handler(seen, big_headers), req).await,
                "/test.T/Flood" => {
                    let mut g = Grpc::new(Raw);
                    g.server_streaming(Handler(seen, flood), req).await
                }
                "/test.T/Sum" => g.client_streaming(Handler(seen, sum), req).await,
                "/test.T/Chat" => g.streaming(Handler(seen, chat), req).await,
                _ => tonic::Status::unimplemented("no such method").into_http(),
            };
            Ok(res)
        })
    }
}

struct Tonic {
    port: u16,
    seen: Arc<Seen>,
    drops: mpsc::UnboundedReceiver<&'static str>,
}

/// Starts the tonic server on a loopback port (TLS with `tls`).
async fn tonic_server(tls: Option<tonic::transport::ServerTlsConfig>) -> Tonic {
    tonic_server_with(tls, None).await
}

/// The tonic server, allowing `max_streams` concurrent streams per connection if given.
async fn tonic_server_with(
    tls: Option<tonic::transport::ServerTlsConfig>,
    max_streams: Option<u32>,
) -> Tonic {
    let seen = Arc::new(Seen::default());
    // Test only: one message per call the test itself makes.
    let (tx, drops) = mpsc::unbounded_channel();
    *seen.dropped.lock().unwrap() = Some(tx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut server = tonic::transport::Server::builder().max_concurrent_streams(max_streams);
    if let Some(tls) = tls {
        server = server.tls_config(tls).unwrap();
    }
    let router = server.add_service(TestService { seen: seen.clone() });
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(router.serve_with_incoming(incoming));
    Tonic { port, seen, drops }
}

async fn channel(t: &Tonic) -> Channel {
    common::within(15, async {
        Endpoint::new(format!("grpc://127.0.0.1:{}", t.port))?
            .timeout(Duration::from_secs(10))
            .connect()
            .await
    })
    .await
    .expect("connect")
}

fn b(s: &'static str) -> Bytes {
    Bytes::from_static(s.as_bytes())
}

// ---- the tests ------------------------------------------------------------------------------

#[tokio::test]
async fn unary_and_metadata_both_ways() {
    let t = tonic_server(None).await;
    let ch = channel(&t).await;
    let md = Metadata::builder()
        .text("x-user", "ann")
        .unwrap()
        .binary("x-raw-bin", &[0, 255, 1, 0])
        .unwrap()
        .build();
    let reply = ch
        .unary(
            RawCodec,
            "/test.T/Echo",
            Request::new(b("ping")).with_metadata(md),
        )
        .await
        .expect("echo");
    assert_eq!(reply.metadata().get_str("x-echo-user"), Some("ann"));
    assert_eq!(
        reply.metadata().get("x-echo-raw-bin"),
        Some(&[0u8, 255, 1, 0][..])
    );
    assert_eq!(
        reply.metadata().get("content-type"),
        None,
        "gRPC's own headers are not metadata"
    );
    assert_eq!(reply.into_inner(), b("ping"));
    // Several calls at once share the connection.
    let calls = (0..50).map(|i| {
        let ch = ch.clone();
        async move {
            ch.unary(RawCodec, "/test.T/Echo", Bytes::from(format!("c{i}")))
                .await
        }
    });
    for (i, r) in futures_util::future::join_all(calls)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(r.unwrap().into_inner(), Bytes::from(format!("c{i}")));
    }
    // A batch written together.
    let batch = (0..5)
        .map(|i| Request::new(Bytes::from(format!("b{i}"))))
        .collect();
    for (i, r) in ch
        .unary_batch(RawCodec, "/test.T/Echo", batch)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(r.unwrap().into_inner(), Bytes::from(format!("b{i}")));
    }
    // An interceptor's metadata goes out as headers too.
    let intercepted = Endpoint::new(format!("grpc://127.0.0.1:{}", t.port))
        .unwrap()
        .interceptor(topspin::interceptor::from_fn(
            |c: &mut topspin::CallInfo| {
                c.append_metadata("x-user", b"from-interceptor")
                    .map_err(|e| topspin::Status::internal(e.to_string()))
            },
        ))
        .connect()
        .await
        .unwrap();
    let r = intercepted
        .unary(RawCodec, "/test.T/Echo", b("i"))
        .await
        .unwrap();
    assert_eq!(
        r.metadata().get_str("x-echo-user"),
        Some("from-interceptor")
    );
    // An unknown method: tonic answers UNIMPLEMENTED in a trailers-only response.
    let e = ch
        .unary(RawCodec, "/test.T/Nope", b("x"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{e}");
}

#[tokio::test]
async fn an_error_keeps_its_message_details_and_trailers() {
    let t = tonic_server(None).await;
    let ch = channel(&t).await;
    let e = ch
        .unary(RawCodec, "/test.T/Fail", b("k"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(e.message(), "no key 🍎 (100% gone)");
    assert_eq!(e.details().as_ref(), &[1, 2, 3, 0, 255]);
    assert_eq!(e.metadata().get("x-why-bin"), Some(&[9u8, 0, 9][..]));
}

#[tokio::test]
async fn the_streaming_kinds() {
    let t = tonic_server(None).await;
    let ch = channel(&t).await;
    // Server streaming, and an empty one (tonic may answer it trailers-only).
    for n in [0u8, 3, 200] {
        let mut s = ch
            .server_streaming(RawCodec, "/test.T/Count", Bytes::from(vec![n]))
            .await
            .expect("count")
            .into_inner();
        let mut got = Vec::new();
        while let Some(m) = s.message().await.expect("message") {
            got.push(m);
        }
        let want: Vec<_> = (0..n).map(|i| Bytes::from(format!("m{i}"))).collect();
        assert_eq!(got, want);
    }
    // Client streaming.
    let parts = (0..100).map(|i| Bytes::from(format!("{i},")));
    let all = ch
        .client_streaming(RawCodec, "/test.T/Sum", stream::iter(parts))
        .await
        .expect("sum")
        .into_inner();
    let want: String = (0..100).map(|i| format!("{i},")).collect();
    assert_eq!(all, Bytes::from(want));
    // Bidirectional, one message at a time.
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let mut replies = ch
        .streaming(RawCodec, "/test.T/Chat", tokio_stream(rx))
        .await
        .expect("chat")
        .into_inner();
    for w in ["hello", "grpc", "world"] {
        tx.send(Bytes::from(w)).await.unwrap();
        let r = common::within(10, replies.message())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r, Bytes::from(w.to_uppercase()));
    }
    drop(tx);
    assert!(replies.message().await.unwrap().is_none());
}

/// A receiver as a stream (tokio-stream is not a dependency).
fn tokio_stream(rx: mpsc::Receiver<Bytes>) -> impl Stream<Item = Bytes> + Send + Unpin {
    Box::pin(stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|m| (m, rx))
    }))
}

#[tokio::test]
async fn a_deadline_goes_to_the_server_and_ends_the_call() {
    let mut t = tonic_server(None).await;
    let ch = channel(&t).await;
    let started = std::time::Instant::now();
    let e = ch
        .unary(
            RawCodec,
            "/test.T/Slow",
            Request::new(b("x")).with_timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // The server was told the deadline (grpc-timeout, at most 300 ms) …
    let timeout = t
        .seen
        .headers
        .lock()
        .unwrap()
        .iter()
        .find(|h| h.0 == "/test.T/Slow")
        .and_then(|h| h.1.clone())
        .expect("grpc-timeout sent");
    let micros: u64 = timeout
        .trim_end_matches('u')
        .parse()
        .expect("in microseconds");
    assert!(
        timeout.ends_with('u') && micros > 0 && micros <= 300_000,
        "{timeout}"
    );
    // … and its handler was stopped when it passed.
    assert_eq!(common::within(10, t.drops.recv()).await, Some("slow"));
}

#[tokio::test]
async fn dropping_a_call_resets_its_stream_and_the_handler_sees_it() {
    let mut t = tonic_server(None).await;
    let ch = channel(&t).await;
    // A unary call whose future is dropped.
    let call = ch.unary(RawCodec, "/test.T/Slow", b("x"));
    assert!(tokio::time::timeout(Duration::from_millis(300), call)
        .await
        .is_err());
    assert_eq!(common::within(10, t.drops.recv()).await, Some("slow"));
    // A response stream dropped half way.
    let mut s = ch
        .server_streaming(RawCodec, "/test.T/Forever", b("x"))
        .await
        .expect("forever")
        .into_inner();
    for _ in 0..3 {
        s.message().await.unwrap().unwrap();
    }
    drop(s);
    assert_eq!(common::within(10, t.drops.recv()).await, Some("forever"));
    // The connection goes on.
    let r = ch
        .unary(RawCodec, "/test.T/Echo", b("after"))
        .await
        .unwrap();
    assert_eq!(r.into_inner(), b("after"));
}

#[tokio::test]
async fn a_2mb_message_each_way() {
    let t = tonic_server(None).await;
    let ch = channel(&t).await;
    let big = Bytes::from(
        (0..2_000_000u32)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<_>>(),
    );
    let r = ch
        .unary(RawCodec, "/test.T/Echo", big.clone())
        .await
        .unwrap();
    assert_eq!(r.into_inner(), big);
    // Streamed both ways too (flow control on both sides, windows smaller than a message).
    let parts = vec![big.clone(), big.clone()];
    let all = ch
        .client_streaming(RawCodec, "/test.T/Sum", stream::iter(parts))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.len(), 4_000_000);
    // A response over this channel's max_message_size fails its call alone.
    let small = Endpoint::new(format!("grpc://127.0.0.1:{}", t.port))
        .unwrap()
        .max_message_size(1_000_000)
        .connect()
        .await
        .unwrap();
    let e = small
        .unary(RawCodec, "/test.T/Echo", big)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    let r = small
        .unary(RawCodec, "/test.T/Echo", b("ok"))
        .await
        .unwrap();
    assert_eq!(r.into_inner(), b("ok"));
}

/// A response message split over DATA frames is gathered within the channel's memory budget:
/// while the budget has no room for it the call waits (the message's credit withheld, so the
/// server is held at a window) and completes once there is room; all of it is given back.
#[tokio::test]
async fn a_large_response_waits_for_room_in_the_memory_budget() {
    // topspin's gRPC face: it does not compress (tonic's test server would, and a
    // decompression with the budget spent fails the call at once).
    let server = topspin::Server::builder()
        .unary("/t.T/Echo", RawCodec, |req: Request<Bytes>| async move {
            Ok(topspin::Response::new(req.into_inner()))
        })
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr().host_port().unwrap().to_owned();
    tokio::spawn(server.serve());
    let budget = topspin::MemoryBudget::new(8 << 20);
    let ch = Endpoint::new(format!("grpc://{addr}"))
        .unwrap()
        .config(topspin::Config::default().with_memory_budget(budget.clone()))
        .connect()
        .await
        .unwrap();
    let big = Bytes::from(
        (0..2_000_000u32)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<_>>(),
    );
    // Someone else holds all but 64 KiB of it.
    let others = (8 << 20) - 65_536;
    assert!(budget.try_reserve(others));
    let call = tokio::spawn({
        let (ch, big) = (ch.clone(), big.clone());
        async move { ch.unary(RawCodec, "/t.T/Echo", big).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    if call.is_finished() {
        let r = call.await.unwrap().map(|r| r.into_inner().len());
        panic!("a 2 MB response came in 64 KiB of budget: {r:?}");
    }
    assert!(budget.used() <= others + 65_536, "{}", budget.used());
    budget.release(others);
    let r = common::within(15, call).await.unwrap().unwrap();
    assert_eq!(r.into_inner(), big);
    // The connection keeps the buffer the response was gathered in for the next one, charged
    // to the budget until the connection ends.
    drop(ch);
    common::within(5, async {
        while budget.used() != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn compressed_both_ways() {
    let t = tonic_server(None).await;
    let ch = channel(&t).await;
    let text = Bytes::from("all work and no play ".repeat(5000));
    for e in [Encoding::Gzip, Encoding::Zstd] {
        let req = Request::new(text.clone()).with_compression(Some(Compression::new(e)));
        let r = ch.unary(RawCodec, "/test.T/Echo", req).await.unwrap();
        assert_eq!(r.into_inner(), text, "{e:?}");
        let parts = vec![text.clone(), b("!")];
        let req = Request::new(stream::iter(parts)).with_compression(Some(Compression::new(e)));
        let all = ch
            .client_streaming(RawCodec, "/test.T/Sum", req)
            .await
            .unwrap();
        assert_eq!(all.into_inner().len(), text.len() + 1);
    }
    let seen = t.seen.headers.lock().unwrap();
    let encodings: Vec<_> = seen.iter().filter_map(|h| h.2.clone()).collect();
    assert_eq!(encodings, ["gzip", "gzip", "zstd", "zstd"]);
}

#[tokio::test]
async fn grpcs_with_rustls() {
    let ca = layered::Ca::new("grpc test CA");
    let pair = ca.issue("server", &["localhost"], false);
    let identity = tonic::transport::Identity::from_pem(
        std::fs::read(&pair.cert).unwrap(),
        std::fs::read(&pair.key).unwrap(),
    );
    let t = tonic_server(Some(
        tonic::transport::ServerTlsConfig::new().identity(identity),
    ))
    .await;
    let ch = Endpoint::new(format!("grpcs://localhost:{}", t.port))
        .unwrap()
        .tls(ClientTls::ca_pem_file(&ca.cert).unwrap())
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("grpcs connect");
    let r = ch
        .unary(RawCodec, "/test.T/Echo", b("secret"))
        .await
        .unwrap();
    assert_eq!(r.into_inner(), b("secret"));
    let mut s = ch
        .server_streaming(RawCodec, "/test.T/Count", Bytes::from(vec![5u8]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(common::count_messages(&mut s).await, 5);
    // A plaintext gRPC client against the TLS port fails promptly and says so.
    let plain = Endpoint::new(format!("grpc://127.0.0.1:{}", t.port))
        .unwrap()
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    let e = common::within(15, plain.unary(RawCodec, "/test.T/Echo", b("x")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
}

#[tokio::test]
async fn a_tcp_address_to_a_grpc_server_says_to_use_grpc() {
    let t = tonic_server(None).await;
    let e = common::within(15, Channel::connect(format!("tcp://127.0.0.1:{}", t.port)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.message().contains("grpc://host:port"), "{e}");
}

#[tokio::test]
async fn a_server_that_is_not_there_or_not_grpc() {
    // Nothing listens: UNAVAILABLE.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let e = Channel::connect(format!("grpc://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    // A topspin server is not a gRPC server (until its gRPC face answers): the call fails
    // with a typed status, never hangs.
    let server = topspin::Server::builder()
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr().host_port().unwrap().to_owned();
    tokio::spawn(server.serve());
    let ch = Endpoint::new(format!("grpc://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    let e = common::within(15, ch.unary(RawCodec, "/test.T/Echo", b("x")))
        .await
        .unwrap_err();
    assert!(
        matches!(e.code(), Code::Unavailable | Code::Unimplemented),
        "{e}"
    );
    eprintln!("a topspin server called as a gRPC server: {e}");
}

/// A counting TCP relay in front of a server: bytes each way.
struct Relay {
    port: u16,
    up: Arc<AtomicUsize>,
    down: Arc<AtomicUsize>,
    /// While set, nothing is forwarded either way (a dead network path).
    paused: Arc<std::sync::atomic::AtomicBool>,
    /// Connections accepted.
    accepted: Arc<AtomicUsize>,
}

async fn copy_counting(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    n: Arc<AtomicUsize>,
    paused: Arc<std::sync::atomic::AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0; 64 * 1024];
    while let Ok(k) = r.read(&mut buf).await {
        while paused.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if k == 0 || w.write_all(&buf[..k]).await.is_err() {
            break;
        }
        n.fetch_add(k, Ordering::Relaxed);
    }
    let _ = w.shutdown().await;
}

async fn relay(to: u16) -> Relay {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let (up, down) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let paused = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let accepted = Arc::new(AtomicUsize::new(0));
    let (u, d, p, a) = (up.clone(), down.clone(), paused.clone(), accepted.clone());
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            a.fetch_add(1, Ordering::Relaxed);
            let Ok(s) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                continue;
            };
            let (cr, cw) = c.into_split();
            let (sr, sw) = s.into_split();
            tokio::spawn(copy_counting(cr, sw, u.clone(), p.clone()));
            tokio::spawn(copy_counting(sr, cw, d.clone(), p.clone()));
        }
    });
    Relay {
        port,
        up,
        down,
        paused,
        accepted,
    }
}

#[tokio::test]
async fn compression_shrinks_what_crosses_the_wire() {
    let t = tonic_server(None).await;
    let r = relay(t.port).await;
    let ch = Endpoint::new(format!("grpc://127.0.0.1:{}", r.port))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let text = Bytes::from("all work and no play ".repeat(20_000)); // 420 kB
    let req = Request::new(text.clone()).with_compression(Some(Compression::new(Encoding::Gzip)));
    let reply = ch.unary(RawCodec, "/test.T/Echo", req).await.unwrap();
    assert_eq!(reply.into_inner(), text);
    // Both directions went compressed (tonic compresses its answer since the client accepts
    // gzip): each far below the message's size.
    let (up, down) = (r.up.load(Ordering::Relaxed), r.down.load(Ordering::Relaxed));
    assert!(up < 50_000 && down < 50_000, "up {up} down {down}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_stream_not_read_holds_the_server_at_the_window() {
    let t = tonic_server(None).await;
    let r = relay(t.port).await;
    let ch = Endpoint::new(format!("grpc://127.0.0.1:{}", r.port))
        .unwrap()
        .config(topspin::Config::default().with_initial_call_window(65_535))
        .connect()
        .await
        .unwrap();
    // 1 KiB messages as fast as tonic makes them; the client takes none for a while.
    let mut s = ch
        .server_streaming(RawCodec, "/test.T/Flood", b("x"))
        .await
        .unwrap()
        .into_inner();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let held = r.down.load(Ordering::Relaxed);
    // One stream window (64 KiB) and the frames' overhead; a client that gave the window
    // back before the messages were read lets megabytes through in that time.
    assert!(held < 512 << 10, "{held} bytes arrived unread");
    // Reading gives the window back: the stream goes on well past one window.
    for _ in 0..2000 {
        assert_eq!(s.message().await.unwrap().unwrap().len(), 1024);
    }
    drop(s);
    assert!(r.down.load(Ordering::Relaxed) > held);
}

#[tokio::test]
async fn an_unanswered_keepalive_ping_ends_the_connection() {
    let t = tonic_server(None).await;
    let r = relay(t.port).await;
    let ch = Endpoint::new(format!("grpc://127.0.0.1:{}", r.port))
        .unwrap()
        .config(
            topspin::Config::default()
                .with_keepalive_interval(Some(Duration::from_millis(100)))
                .with_keepalive_timeout(Duration::from_millis(500)),
        )
        .connect()
        .await
        .unwrap();
    // PINGs answered: calls go on across several intervals.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let reply = ch
            .unary(RawCodec, "/test.T/Echo", b("alive"))
            .await
            .unwrap();
        assert_eq!(reply.into_inner(), b("alive"));
    }
    // The path goes dead (nothing arrives, nothing is refused): without keep-alive the call
    // below would wait for ever; with it the connection is closed and the call fails.
    r.paused.store(true, Ordering::Relaxed);
    let e = common::within(15, ch.unary(RawCodec, "/test.T/Slow", b("x")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    // The one liveness policy's reason, as a native connection gives it.
    assert!(e.message().contains("keep-alive PING unanswered"), "{e}");
    assert!(e.message().contains("(keepalive_timeout)"), "{e}");
}

/// Keep-alive on an idle `grpc://` connection: PINGs go after `keepalive_interval` without a
/// byte from the server (the one liveness policy's rule), tonic answers them, and the
/// connection outlives many intervals without a call; once the path goes dead, the next PING
/// is not answered and the connection is closed — a call made then fails fast, with the
/// policy's reason, instead of waiting on a dead path.
#[tokio::test]
async fn keep_alive_keeps_an_idle_connection_to_a_live_server_and_drops_a_dead_one() {
    let t = tonic_server(None).await;
    let r = relay(t.port).await;
    let (every, timeout) = (Duration::from_millis(100), Duration::from_millis(300));
    let ch = Endpoint::new(format!("grpc://127.0.0.1:{}", r.port))
        .unwrap()
        .config(
            topspin::Config::default()
                .with_keepalive_interval(Some(every))
                .with_keepalive_timeout(timeout),
        )
        .connect()
        .await
        .unwrap();
    let echo = || ch.unary(RawCodec, "/test.T/Echo", b("alive"));
    assert_eq!(echo().await.unwrap().into_inner(), b("alive"));
    let down = r.down.load(Ordering::Relaxed);
    tokio::time::sleep(every * 10).await;
    // PINGs went and were answered (bytes came back), on the same connection.
    assert!(r.down.load(Ordering::Relaxed) > down, "no PING answered");
    assert_eq!(echo().await.unwrap().into_inner(), b("alive"));
    assert_eq!(r.accepted.load(Ordering::Relaxed), 1);
    // Dead: the connection is closed by keep-alive (a waiting call fails with its reason).
    r.paused.store(true, Ordering::Relaxed);
    let e = common::within(15, ch.unary(RawCodec, "/test.T/Slow", b("x")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.message().contains("keepalive_timeout"), "{e}");
}

#[tokio::test]
async fn a_restarted_server_is_reconnected_to() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let serve = |listener: tokio::net::TcpListener| {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let seen = Arc::new(Seen::default());
        let router = tonic::transport::Server::builder().add_service(TestService { seen });
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let task = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        }));
        (stop, task)
    };
    let (stop, task) = serve(listener);
    let ch = Endpoint::new(format!("grpc://127.0.0.1:{port}"))
        .unwrap()
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    assert!(ch.unary(RawCodec, "/test.T/Echo", b("1")).await.is_ok());
    // Graceful shutdown: GOAWAY, then the connection closes.
    let _ = stop.send(());
    let _ = common::within(10, task).await;
    let e = ch
        .unary(RawCodec, "/test.T/Echo", b("2"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    // Back on the same port: the channel reconnects.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let (_stop, _task) = serve(listener);
    let mut last = None;
    for _ in 0..100 {
        match ch.unary(RawCodec, "/test.T/Echo", b("3")).await {
            Ok(r) => {
                last = Some(Ok(r.into_inner()));
                break;
            }
            Err(e) => last = Some(Err(e)),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(last.unwrap().unwrap(), b("3"));
}

#[tokio::test]
async fn response_headers_over_the_limit_fail_the_call() {
    let t = tonic_server(None).await;
    let ch = Endpoint::new(format!("grpc://127.0.0.1:{}", t.port))
        .unwrap()
        .config(topspin::Config::default().with_max_metadata_size(16 * 1024))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    // 24 kB of headers: the stream is refused, the connection goes on.
    let e = ch
        .unary(RawCodec, "/test.T/BigHeaders", Bytes::from(vec![3u8]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e}");
    assert!(e.message().contains("max_metadata_size of 16384"), "{e}");
    // 160 kB: h2 closes the connection (an abuse limit); the channel reconnects.
    let e = ch
        .unary(RawCodec, "/test.T/BigHeaders", Bytes::from(vec![20u8]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    let reply = ch
        .unary(RawCodec, "/test.T/Echo", b("still"))
        .await
        .unwrap();
    assert_eq!(reply.into_inner(), b("still"));
}

/// Calls of `/x.X/RefusedOnce` the misbehaving server has seen.
static REFUSED_ONCE: AtomicUsize = AtomicUsize::new(0);

/// A bare HTTP/2 server (h2) that answers each path with one way a gRPC response can be
/// wrong: the client must end each call with the status gRPC specifies, never hang.
async fn misbehaving_server() -> u16 {
    use http::{HeaderMap, HeaderValue, Response, StatusCode};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    fn grpc_head(status: StatusCode, content_type: &'static str) -> Response<()> {
        let mut r = Response::new(());
        *r.status_mut() = status;
        r.headers_mut()
            .insert("content-type", HeaderValue::from_static(content_type));
        r
    }
    fn trailers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut t = HeaderMap::new();
        for (k, v) in pairs {
            t.insert(*k, HeaderValue::from_static(v));
        }
        t
    }
    tokio::spawn(async move {
        while let Ok((sock, _)) = l.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(sock).await else {
                    return;
                };
                let mut held = Vec::new();
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let path = req.uri().path().to_owned();
                    let grpc = "application/grpc";
                    let msg = |body: &[u8]| {
                        let mut m = vec![0, 0, 0, 0, body.len() as u8];
                        m.extend_from_slice(body);
                        Bytes::from(m)
                    };
                    match path.as_str() {
                        "/x.X/Http503" => {
                            let _ = respond.send_response(
                                grpc_head(StatusCode::SERVICE_UNAVAILABLE, "text/plain"),
                                true,
                            );
                        }
                        "/x.X/Http404" => {
                            let _ = respond
                                .send_response(grpc_head(StatusCode::NOT_FOUND, "text/html"), true);
                        }
                        "/x.X/Html" => {
                            let mut s = respond
                                .send_response(grpc_head(StatusCode::OK, "text/html"), false)
                                .unwrap();
                            let _ = s.send_data(Bytes::from_static(b"<html>"), true);
                        }
                        "/x.X/NoStatus" => {
                            let mut s = respond
                                .send_response(grpc_head(StatusCode::OK, grpc), false)
                                .unwrap();
                            let _ = s.send_data(msg(b"hi"), false);
                            let _ = s.send_trailers(trailers(&[("x-other", "1")]));
                        }
                        "/x.X/NoTrailers" => {
                            let mut s = respond
                                .send_response(grpc_head(StatusCode::OK, grpc), false)
                                .unwrap();
                            let _ = s.send_data(msg(b"hi"), true);
                        }
                        "/x.X/BadStatus" => {
                            let mut s = respond
                                .send_response(grpc_head(StatusCode::OK, grpc), false)
                                .unwrap();
                            let _ = s.send_data(msg(b"hi"), false);
                            let _ = s.send_trailers(trailers(&[("grpc-status", "zero")]));
                        }
                        "/x.X/UnknownCode" => {
                            let mut s = respond
                                .send_response(grpc_head(StatusCode::OK, grpc), false)
                                .unwrap();
                            let _ = s.send_trailers(trailers(&[
                                ("grpc-status", "42"),
                                ("grpc-message", "odd"),
                            ]));
                        }
                        "/x.X/TwoMessages" => {
                            let mut s = respond
                                .send_response(grpc_head(StatusCode::OK, grpc), false)
                                .unwrap();
                            let _ = s.send_data(msg(b"a"), false);
                            let _ = s.send_data(msg(b"b"), false);
                            let _ = s.send_trailers(trailers(&[("grpc-status", "0")]));
                        }
                        "/x.X/CutShort" => {
                            let mut s = respond
                                .send_response(grpc_head(StatusCode::OK, grpc), false)
                                .unwrap();
                            let _ = s.send_data(Bytes::from_static(&[0, 0, 0, 0, 9, b'a']), false);
                            let _ = s.send_trailers(trailers(&[("grpc-status", "0")]));
                        }
                        "/x.X/CompressedUnannounced" => {
                            let mut s = respond
                                .send_response(grpc_head(StatusCode::OK, grpc), false)
                                .unwrap();
                            let _ = s.send_data(Bytes::from_static(&[1, 0, 0, 0, 1, b'a']), false);
                            let _ = s.send_trailers(trailers(&[("grpc-status", "0")]));
                        }
                        "/x.X/Huge" => {
                            let mut s = respond
                                .send_response(grpc_head(StatusCode::OK, grpc), false)
                                .unwrap();
                            let _ = s
                                .send_data(Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff]), false);
                            // Kept open: the client must act on the prefix alone.
                            held.push(s);
                        }
                        // As grpc-go does when its copy of the deadline runs out: a CANCEL.
                        "/x.X/CancelAtDeadline" => {
                            let t = req.headers()["grpc-timeout"].to_str().unwrap().to_owned();
                            let (n, unit) = t.split_at(t.len() - 1);
                            let n: u64 = n.parse().unwrap();
                            let after = match unit {
                                "m" => Duration::from_millis(n),
                                "u" => Duration::from_micros(n),
                                "n" => Duration::from_nanos(n),
                                _ => Duration::from_secs(n),
                            };
                            // A thread's sleep, as precise as Go's timer (tokio's timers
                            // round up to the next millisecond, as the client's does).
                            std::thread::spawn(move || {
                                std::thread::sleep(after);
                                respond.send_reset(h2::Reason::CANCEL);
                            });
                        }
                        "/x.X/Cancel" => respond.send_reset(h2::Reason::CANCEL),
                        "/x.X/Refused" => respond.send_reset(h2::Reason::REFUSED_STREAM),
                        // Refused the first time (the server never processed it), then
                        // answered: a client that sends it again gets the answer.
                        "/x.X/RefusedOnce" if REFUSED_ONCE.fetch_add(1, Ordering::SeqCst) == 0 => {
                            respond.send_reset(h2::Reason::REFUSED_STREAM)
                        }
                        "/x.X/RefusedOnce" => {
                            let mut s = respond
                                .send_response(grpc_head(StatusCode::OK, grpc), false)
                                .unwrap();
                            let _ = s.send_data(msg(b"again"), false);
                            let _ = s.send_trailers(trailers(&[("grpc-status", "0")]));
                        }
                        "/x.X/Calm" => respond.send_reset(h2::Reason::ENHANCE_YOUR_CALM),
                        _ => respond.send_reset(h2::Reason::INTERNAL_ERROR),
                    }
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn what_a_broken_grpc_response_ends_with() {
    let port = misbehaving_server().await;
    let ch = Endpoint::new(format!("grpc://127.0.0.1:{port}"))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    for (method, code) in [
        // http-grpc-status-mapping.md
        ("Http503", Code::Unavailable),
        ("Http404", Code::Unimplemented),
        ("Html", Code::Internal),
        // a missing or malformed grpc-status, an unknown code
        ("NoStatus", Code::Internal),
        ("NoTrailers", Code::Internal),
        ("BadStatus", Code::Internal),
        ("UnknownCode", Code::Unknown),
        // framing
        ("TwoMessages", Code::Internal),
        ("CutShort", Code::Internal),
        ("CompressedUnannounced", Code::Internal),
        ("Huge", Code::ResourceExhausted),
        // RST_STREAM mapping
        ("Cancel", Code::Cancelled),
        ("Refused", Code::Unavailable),
        ("Calm", Code::ResourceExhausted),
        ("Other", Code::Internal),
    ] {
        let path = format!("/x.X/{method}");
        let e = common::within(15, ch.unary(RawCodec, path, b("x")))
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{method}: {e}");
    }
    // The same on a response stream.
    let r = common::within(15, async {
        let mut s = ch
            .server_streaming(RawCodec, "/x.X/CutShort", b("x"))
            .await?
            .into_inner();
        while s.message().await?.is_some() {}
        Ok::<_, topspin::Status>(())
    })
    .await;
    assert_eq!(r.unwrap_err().code(), Code::Internal);
    // A server cancels a call when its copy of the deadline runs out (grpc-go does); that
    // reset may come before the client's own timer fires, and is the deadline's all the same.
    for _ in 0..5 {
        let e = common::within(
            15,
            ch.unary(
                RawCodec,
                "/x.X/CancelAtDeadline",
                Request::new(b("x")).with_timeout(Duration::from_millis(20)),
            ),
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    }
}

/// A stream the server refused (RST_STREAM REFUSED_STREAM: it never processed it) is marked
/// unprocessed, as a native call above a GOAWAY's last_call_id is, and sent again once without
/// any retry policy (transparent retry); the message of the first try's status is the reset.
#[tokio::test]
async fn a_refused_stream_is_sent_again_once() {
    let port = misbehaving_server().await;
    let ch = Endpoint::new(format!("grpc://127.0.0.1:{port}"))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    let r = common::within(15, ch.unary(RawCodec, "/x.X/RefusedOnce", b("x")))
        .await
        .expect("sent again");
    assert_eq!(r.into_inner(), b("again"));
    assert_eq!(REFUSED_ONCE.load(Ordering::SeqCst), 2, "two tries, no more");
    // Refused every time: one more try only, then the caller gets the status.
    let e = common::within(15, ch.unary(RawCodec, "/x.X/Refused", b("x")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.message().contains("refused stream"), "{e}");
}

#[tokio::test]
async fn an_idle_connection_is_closed_and_replaced() {
    let t = tonic_server(None).await;
    let r = relay(t.port).await;
    let ch = Endpoint::new(format!("grpc://127.0.0.1:{}", r.port))
        .unwrap()
        .config(topspin::Config::default().with_idle_timeout(Some(Duration::from_millis(200))))
        .connect()
        .await
        .unwrap();
    // A call longer than the idle timeout keeps the connection.
    let s = ch
        .server_streaming(RawCodec, "/test.T/Count", Bytes::from(vec![3u8]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(s.into_inner().count().await, 3);
    assert_eq!(r.accepted.load(Ordering::Relaxed), 1);
    // Idle past the timeout: the next call goes over a new connection.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let reply = ch
        .unary(RawCodec, "/test.T/Echo", b("again"))
        .await
        .unwrap();
    assert_eq!(reply.into_inner(), b("again"));
    assert_eq!(r.accepted.load(Ordering::Relaxed), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_stream_the_server_does_not_read_is_held_at_the_window() {
    let t = tonic_server(None).await;
    let ch = channel(&t).await;
    let made = Arc::new(AtomicUsize::new(0));
    let m = made.clone();
    let kib = Bytes::from(vec![1u8; 1024]);
    let requests = stream::repeat_with(move || {
        m.fetch_add(1, Ordering::Relaxed);
        kib.clone()
    });
    let call = ch.client_streaming(RawCodec, "/test.T/Stall", requests);
    assert!(tokio::time::timeout(Duration::from_millis(1500), call)
        .await
        .is_err());
    // The server's window (tonic: 1 MiB per stream), h2's send buffer (400 KiB) and one
    // message in flight: the pump waits for window instead of queueing without end.
    let made = made.load(Ordering::Relaxed);
    assert!(
        made < 4 * 1024,
        "{made} request messages of 1 KiB taken from the stream"
    );
}

/// The grpc-go server of `tests/grpc-go-server`, built by `scripts/test-grpcclient.sh`, which
/// names the binary in `GRPC_GO_SERVER`. Killed when dropped.
struct GrpcGo {
    child: std::process::Child,
    port: u16,
}

impl GrpcGo {
    fn start() -> GrpcGo {
        use std::io::BufRead;
        let bin = std::env::var("GRPC_GO_SERVER")
            .expect("GRPC_GO_SERVER names the grpc-go test server: run scripts/test-grpcclient.sh");
        let mut child = std::process::Command::new(bin)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the grpc-go server");
        let out = child.stdout.take().expect("stdout");
        let mut line = String::new();
        std::io::BufReader::new(out)
            .read_line(&mut line)
            .expect("read its port");
        let port = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        GrpcGo { child, port }
    }
}

impl Drop for GrpcGo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
#[ignore = "needs the grpc-go server binary: scripts/test-grpcclient.sh runs it"]
async fn grpc_go_every_call_kind_deadline_details_metadata_cancel() {
    let go = GrpcGo::start();
    let ch = common::within(15, async {
        Endpoint::new(format!("grpc://127.0.0.1:{}", go.port))?
            .timeout(Duration::from_secs(10))
            .connect()
            .await
    })
    .await
    .expect("connect to grpc-go");
    // Unary, metadata both ways, the timeout it saw, trailers.
    let md = Metadata::builder()
        .text("x-user", "ann")
        .unwrap()
        .binary("x-raw-bin", &[0, 255, 1])
        .unwrap()
        .build();
    let r = ch
        .unary(
            RawCodec,
            "/test.T/Echo",
            Request::new(b("ping"))
                .with_metadata(md)
                .with_timeout(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    assert_eq!(r.metadata().get_str("x-echo-user"), Some("ann"));
    assert_eq!(r.metadata().get("x-echo-raw-bin"), Some(&[0u8, 255, 1][..]));
    let left: u64 = r
        .metadata()
        .get_str("x-deadline-ms")
        .and_then(|ms| ms.parse().ok())
        .expect("the handler has the call's deadline (grpc-timeout)");
    assert!(left > 0 && left <= 5000, "{left} ms");
    assert_eq!(r.trailers().get_str("x-trailer"), Some("t"));
    assert_eq!(r.into_inner(), b("ping"));
    // A 2 MB message, and gzip.
    let big = Bytes::from(vec![42u8; 2_000_000]);
    let r = ch
        .unary(RawCodec, "/test.T/Echo", big.clone())
        .await
        .unwrap();
    assert_eq!(r.into_inner(), big);
    let gz = Request::new(big.clone()).with_compression(Some(Compression::new(Encoding::Gzip)));
    let r = ch.unary(RawCodec, "/test.T/Echo", gz).await.unwrap();
    assert_eq!(r.into_inner(), big);
    // An error with details (a google.rpc.Status) and trailing metadata.
    let e = ch
        .unary(RawCodec, "/test.T/Fail", b("k"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(e.message(), "no key 🍎 (100% gone)");
    assert!(!e.details().is_empty());
    assert_eq!(e.metadata().get("x-why-bin"), Some(&[9u8, 0, 9][..]));
    // Streaming kinds.
    let mut s = ch
        .server_streaming(RawCodec, "/test.T/Count", Bytes::from(vec![4u8]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(common::count_messages(&mut s).await, 4);
    let parts = (0..50).map(|i| Bytes::from(format!("{i};")));
    let all = ch
        .client_streaming(RawCodec, "/test.T/Sum", stream::iter(parts))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        all,
        Bytes::from((0..50).map(|i| format!("{i};")).collect::<String>())
    );
    let words = vec![b("go"), b("grpc")];
    let mut chat = ch
        .streaming(RawCodec, "/test.T/Chat", stream::iter(words))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(chat.message().await.unwrap(), Some(b("GO")));
    assert_eq!(chat.message().await.unwrap(), Some(b("GRPC")));
    assert_eq!(chat.message().await.unwrap(), None);
    // Deadline, then cancellation by dropping: both reach the Go handler's context.
    let e = ch
        .unary(
            RawCodec,
            "/test.T/Slow",
            Request::new(b("x")).with_timeout(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    let call = ch.unary(RawCodec, "/test.T/Slow", b("x"));
    assert!(tokio::time::timeout(Duration::from_millis(300), call)
        .await
        .is_err());
    let mut seen = 0;
    for _ in 0..100 {
        let r = ch
            .unary(RawCodec, "/test.T/Cancelled", b("?"))
            .await
            .unwrap();
        seen = String::from_utf8_lossy(&r.into_inner())
            .parse()
            .unwrap_or(0);
        if seen >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, 2, "the Go handlers saw both calls end");
    // Unknown method.
    let e = ch
        .unary(RawCodec, "/test.T/Nope", b("x"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{e}");
}

#[tokio::test]
async fn calls_past_the_servers_stream_limit_wait_their_turn_within_a_bound() {
    let t = tonic_server_with(None, Some(8)).await;
    let ch = channel(&t).await;
    // 200 calls, 8 at a time on the server: the rest wait in h2 for a stream.
    let calls = (0..200).map(|i| {
        let ch = ch.clone();
        async move {
            ch.unary(RawCodec, "/test.T/Nap", Bytes::from(format!("n{i}")))
                .await
        }
    });
    let replies = common::within(60, futures_util::future::join_all(calls)).await;
    for (i, r) in replies.into_iter().enumerate() {
        assert_eq!(r.unwrap().into_inner(), Bytes::from(format!("n{i}")));
    }
    // With room for 8 open and 10 waiting calls, the rest fail at once.
    let small = Endpoint::new(format!("grpc://127.0.0.1:{}", t.port))
        .unwrap()
        .config(topspin::Config::default().with_max_pending_calls(10))
        .connect()
        .await
        .unwrap();
    let calls = (0..100).map(|_| small.unary(RawCodec, "/test.T/Nap", b("x")));
    let results = common::within(60, futures_util::future::join_all(calls)).await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(e) if e.code() == Code::ResourceExhausted))
        .count();
    assert_eq!(ok + refused, 100);
    assert!((18..100).contains(&ok), "{ok} calls got through");
}
