//! The standard test service ([`super::builder`]) served by tonic, for
//! [`super::Transport::GrpcTonic`]: topspin's `grpc://` client mode against a real gRPC server
//! no one here wrote. The same methods on the same paths, the same behaviour on raw bytes (a
//! tonic codec over `Bytes`, routed by path as tonic's generated servers do), the same
//! [`Probe`] signals.

use super::{
    OnDrop, Probe, StandardOptions, BIDI, CLIENT_STREAM, EMPTY, FAIL, GATED, HEADERS,
    SERVER_STREAM, SLOW, STREAM_FAIL, UNARY,
};
use bytes::{Buf, BufMut, Bytes};
use futures_util::{stream, Stream, StreamExt};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::codec::{CompressionEncoding, DecodeBuf, EncodeBuf};
use tonic::codegen::{http, Service};
use tonic::server::{Grpc, NamedService};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// tonic's codec for raw bytes (what a generated prost codec does, minus prost).
#[derive(Clone, Copy, Default)]
pub struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

type BoxStream = Pin<Box<dyn Stream<Item = Result<Bytes, tonic::Status>> + Send>>;

/// A tower service from a closure: tonic's `UnaryService` and friends are implemented for it.
struct Handler<F>(F);

impl<F, Req, Resp, Fut> Service<tonic::Request<Req>> for Handler<F>
where
    F: FnMut(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
{
    type Response = tonic::Response<Resp>;
    type Error = tonic::Status;
    type Future = Fut;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), tonic::Status>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: tonic::Request<Req>) -> Fut {
        (self.0)(req)
    }
}

fn text(b: &Bytes) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The request's `grpc-timeout` (gRPC's wire form: up to 8 digits and a unit).
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let v = headers.get("grpc-timeout")?.to_str().ok()?;
    let (n, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Headers that are HTTP's or gRPC's, not the application's metadata (as the gRPC face leaves
/// them out of what its handlers see).
fn reserved(key: &str) -> bool {
    key.starts_with("grpc-") || matches!(key, "te" | "content-type")
}

/// The test service, routed by path (`/test.Echo/…`).
#[derive(Clone)]
struct TestService {
    probe: Probe,
    options: StandardOptions,
}

impl NamedService for TestService {
    const NAME: &'static str = "test.Echo";
}

impl TestService {
    fn grpc(&self) -> Grpc<Raw> {
        let mut g = Grpc::new(Raw)
            .accept_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Zstd)
            .max_decoding_message_size(self.options.max_message_size as usize);
        if let Some(c) = self.options.compression {
            g = g.send_compressed(match c.encoding() {
                topspin::Encoding::Gzip => CompressionEncoding::Gzip,
                topspin::Encoding::Zstd => CompressionEncoding::Zstd,
                other => panic!(
                    "[grpc-tonic-server] tonic has no {} compression",
                    other.name()
                ),
            });
        }
        g
    }
}

impl Service<http::Request<tonic::body::Body>> for TestService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let arrived = Instant::now();
        let timeout = grpc_timeout(req.headers());
        let path = req.uri().path().to_owned();
        let mut g = self.grpc();
        let probe = self.probe.clone();
        Box::pin(async move {
            let res = match path.as_str() {
                UNARY => {
                    let encoding = match req.headers().get("grpc-encoding") {
                        Some(v) if v == "gzip" => Some("gzip"),
                        Some(v) if v == "zstd" => Some("zstd"),
                        _ => None,
                    };
                    if let Some(e) = encoding {
                        probe.encodings.lock().unwrap().push(e);
                    }
                    let h = |r: tonic::Request<Bytes>| async move {
                        Ok(tonic::Response::new(r.into_inner()))
                    };
                    g.unary(Handler(h), req).await
                }
                SERVER_STREAM => {
                    let h = |r: tonic::Request<Bytes>| async move {
                        let spec = text(r.get_ref());
                        let (n, size) = match spec.split_once(':') {
                            Some((n, s)) => {
                                (n.parse::<usize>().unwrap_or(0), s.parse::<usize>().ok())
                            }
                            None => (spec.parse::<usize>().unwrap_or(0), None),
                        };
                        let chunk = size.map(|s| Bytes::from(vec![7u8; s]));
                        let s = stream::iter(0..n).map(move |i| {
                            Ok(match &chunk {
                                Some(c) => c.clone(),
                                None => Bytes::from(i.to_string()),
                            })
                        });
                        Ok(tonic::Response::new(Box::pin(s) as BoxStream))
                    };
                    g.server_streaming(Handler(h), req).await
                }
                CLIENT_STREAM => {
                    let h = |r: tonic::Request<tonic::Streaming<Bytes>>| async move {
                        let mut s = r.into_inner();
                        let mut all = Vec::new();
                        while let Some(m) = s.message().await? {
                            all.extend_from_slice(&m);
                        }
                        Ok(tonic::Response::new(Bytes::from(all)))
                    };
                    g.client_streaming(Handler(h), req).await
                }
                BIDI => {
                    let h = |r: tonic::Request<tonic::Streaming<Bytes>>| async move {
                        let out = r
                            .into_inner()
                            .map(|m| m.map(|m| Bytes::from([&b"echo:"[..], &m[..]].concat())));
                        Ok(tonic::Response::new(Box::pin(out) as BoxStream))
                    };
                    g.streaming(Handler(h), req).await
                }
                FAIL => {
                    let h = |r: tonic::Request<Bytes>| async move {
                        let spec = text(r.get_ref());
                        let (code, msg) = spec.split_once(':').unwrap_or(("UNKNOWN", ""));
                        let code = topspin::Code::from_name(code).unwrap_or(topspin::Code::Unknown);
                        let mut trailers = tonic::metadata::MetadataMap::new();
                        trailers.insert("why", "asked".parse().unwrap());
                        Err::<tonic::Response<Bytes>, _>(tonic::Status::with_details_and_metadata(
                            tonic::Code::from_i32(code as u16 as i32),
                            msg,
                            Bytes::from_static(b"d"),
                            trailers,
                        ))
                    };
                    g.unary(Handler(h), req).await
                }
                SLOW => {
                    let h = move |r: tonic::Request<Bytes>| {
                        let probe = probe.clone();
                        async move {
                            let tag = text(r.get_ref());
                            let p2 = probe.clone();
                            let _guard = OnDrop(move || {
                                p2.cancelled.lock().unwrap().push(tag.clone());
                                p2.cancelled_notify.notify_one();
                            });
                            probe.started.notify_one();
                            tokio::time::sleep(Duration::from_secs(30)).await;
                            Ok(tonic::Response::new(r.into_inner()))
                        }
                    };
                    g.unary(Handler(h), req).await
                }
                HEADERS => {
                    // What comes back, as headers and as trailers: the request's metadata, the
                    // time left before its deadline, the peer's address.
                    let mut echo = http::HeaderMap::new();
                    for (k, v) in req.headers() {
                        if !reserved(k.as_str()) {
                            echo.append(k.clone(), v.clone());
                        }
                    }
                    if let Some(t) = timeout {
                        let left = t.saturating_sub(arrived.elapsed()).as_millis();
                        echo.insert("remaining-ms", left.to_string().parse().unwrap());
                    }
                    let peer = req.extensions().get::<TcpConnectInfo>();
                    if let Some(p) = peer.and_then(|i| i.remote_addr()) {
                        echo.insert("peer", p.to_string().parse().unwrap());
                    }
                    let md = tonic::metadata::MetadataMap::from_headers(echo.clone());
                    let h = move |r: tonic::Request<Bytes>| {
                        let md = md.clone();
                        async move {
                            let mut resp = tonic::Response::new(r.into_inner());
                            *resp.metadata_mut() = md;
                            Ok(resp)
                        }
                    };
                    // tonic has no trailers for an OK response but grpc-status: they are added
                    // to its body's trailers frame.
                    g.unary(Handler(h), req).await.map(|body| {
                        tonic::body::Body::new(WithTrailers {
                            inner: body,
                            extra: Some(echo),
                        })
                    })
                }
                STREAM_FAIL => {
                    let h = |r: tonic::Request<Bytes>| async move {
                        let spec = text(r.get_ref());
                        let mut parts = spec.splitn(3, ':');
                        let n = parts
                            .next()
                            .and_then(|n| n.parse::<usize>().ok())
                            .unwrap_or(0);
                        let code = parts.next().and_then(topspin::Code::from_name);
                        let code = code.unwrap_or(topspin::Code::Unknown) as u16 as i32;
                        let status = tonic::Status::new(
                            tonic::Code::from_i32(code),
                            parts.next().unwrap_or(""),
                        );
                        let messages = (0..n).map(|i| Ok(Bytes::from(i.to_string())));
                        let s = stream::iter(messages.chain(std::iter::once(Err(status))));
                        Ok(tonic::Response::new(Box::pin(s) as BoxStream))
                    };
                    g.server_streaming(Handler(h), req).await
                }
                GATED => {
                    let h = move |r: tonic::Request<Bytes>| {
                        let probe = probe.clone();
                        async move {
                            probe.started.notify_one();
                            probe.release.notified().await;
                            Ok(tonic::Response::new(r.into_inner()))
                        }
                    };
                    g.unary(Handler(h), req).await
                }
                EMPTY => {
                    let h = |r: tonic::Request<Bytes>| async move {
                        if r.get_ref().as_ref() == b"later" {
                            tokio::task::yield_now().await;
                        }
                        let mut resp = tonic::Response::new(Box::pin(stream::empty()) as BoxStream);
                        resp.metadata_mut().insert("h", "v".parse().unwrap());
                        Ok(resp)
                    };
                    g.server_streaming(Handler(h), req).await
                }
                _ => tonic::Status::unimplemented(format!("unknown method {path}")).into_http(),
            };
            Ok(res)
        })
    }
}

/// A response body with `extra` added to its trailers.
struct WithTrailers {
    inner: tonic::body::Body,
    extra: Option<http::HeaderMap>,
}

impl http_body::Body for WithTrailers {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        let frame = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
        Poll::Ready(frame.map(|f| {
            f.map(|f| match f.into_trailers() {
                Ok(mut trailers) => {
                    if let Some(extra) = self.extra.take() {
                        for (k, v) in &extra {
                            trailers.append(k.clone(), v.clone());
                        }
                    }
                    http_body::Frame::trailers(trailers)
                }
                Err(data) => data,
            })
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection the test can drop at once, whatever hyper is doing with it: reads and writes
/// fail from the moment `kill` is cancelled.
struct Killable {
    io: TcpStream,
    kill: CancellationToken,
    killed: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl Killable {
    fn new(io: TcpStream, kill: CancellationToken) -> Killable {
        let killed = Box::pin(kill.clone().cancelled_owned());
        Killable { io, kill, killed }
    }

    /// Whether the test killed the server (registering the task to be woken when it does).
    fn dead(&mut self, cx: &mut Context<'_>) -> bool {
        self.kill.is_cancelled() || self.killed.as_mut().poll(cx).is_ready()
    }
}

fn killed() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "test server killed")
}

impl AsyncRead for Killable {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.dead(cx) {
            return Poll::Ready(Err(killed()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Killable {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.dead(cx) {
            return Poll::Ready(Err(killed()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.dead(cx) {
            return Poll::Ready(Err(killed()));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.dead(cx) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl Connected for Killable {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

/// A running tonic test server: how to stop it.
pub struct Running {
    /// Cancelled: tonic stops accepting and closes its connections gracefully (GOAWAY).
    graceful: CancellationToken,
    /// Cancelled: every connection fails at once (on a shutdown's end, or when the server's
    /// task ends or is aborted).
    kill: CancellationToken,
    /// Cancelled when the server's task has ended (its listener closed).
    ended: CancellationToken,
}

impl Running {
    /// Stops accepting, lets calls in flight finish for up to `grace`, then drops every
    /// connection; returns once the server's task has ended.
    pub async fn shutdown(&self, grace: Duration) {
        self.graceful.cancel();
        let _ = tokio::time::timeout(grace, self.ended.cancelled()).await;
        self.kill.cancel();
        self.ended.cancelled().await;
    }
}

/// Starts the tonic test service on `addr` (`tcp://127.0.0.1:PORT`, port 0 for any); returns
/// the address bound, the serving task (aborting it drops every connection, as a crash would)
/// and how to stop it.
pub async fn start(
    probe: Probe,
    options: StandardOptions,
    addr: &str,
) -> (String, tokio::task::JoinHandle<()>, Running) {
    let host_port = addr.strip_prefix("tcp://").expect("a tcp:// address");
    let listener = TcpListener::bind(host_port)
        .await
        .unwrap_or_else(|e| panic!("[grpc-tonic-server] bind {addr}: {e}"));
    let bound = format!("tcp://{}", listener.local_addr().unwrap());
    let running = Running {
        graceful: CancellationToken::new(),
        kill: CancellationToken::new(),
        ended: CancellationToken::new(),
    };
    let kill = running.kill.clone();
    let incoming = stream::unfold(listener, move |l| {
        let kill = kill.clone();
        async move {
            let conn = l.accept().await.map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Killable::new(s, kill)
            });
            Some((conn, l))
        }
    });
    let router = tonic::transport::Server::builder()
        .max_concurrent_streams(options.max_concurrent_calls)
        .add_service(TestService { probe, options });
    let (graceful, kill, ended) = (
        running.graceful.clone(),
        running.kill.clone(),
        running.ended.clone(),
    );
    let task = tokio::spawn(async move {
        let _ended = ended.drop_guard();
        let _kill = kill.drop_guard();
        let _ = router
            .serve_with_incoming_shutdown(incoming, graceful.cancelled_owned())
            .await;
    });
    (bound, task, running)
}
