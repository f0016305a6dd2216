//! Shared test fixtures: a test service with every call kind, started on TCP or a Unix socket.
#![allow(dead_code)]

use bytes::Bytes;
use futures_util::{stream, Stream, StreamExt};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use topspin::codec::RawCodec;
use topspin::{
    Address, Channel, Code, Metadata, Request, Response, Server, ServerBuilder, ShutdownHandle,
    Status, Streaming,
};

/// Reads a response stream to its end (panicking on an error status); how many messages came.
pub async fn count_messages<T>(s: &mut Streaming<T>) -> usize {
    let mut n = 0;
    while s.message().await.unwrap().is_some() {
        n += 1;
    }
    n
}

pub const UNARY: &str = "/test.Echo/Unary";
pub const SERVER_STREAM: &str = "/test.Echo/ServerStream";
pub const CLIENT_STREAM: &str = "/test.Echo/ClientStream";
pub const BIDI: &str = "/test.Echo/Bidi";
pub const FAIL: &str = "/test.Echo/Fail";
pub const SLOW: &str = "/test.Echo/Slow";
pub const HEADERS: &str = "/test.Echo/Headers";

/// Which transport a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Unix,
}

pub const BOTH: [Transport; 2] = [Transport::Tcp, Transport::Unix];

static NEXT_SOCK: AtomicUsize = AtomicUsize::new(0);

pub fn listen_addr(t: Transport) -> String {
    match t {
        Transport::Tcp => "tcp://127.0.0.1:0".into(),
        Transport::Unix => {
            let n = NEXT_SOCK.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir();
            format!(
                "unix://{}/topspin-test-{}-{n}.sock",
                dir.display(),
                std::process::id()
            )
        }
    }
}

pub struct TestServer {
    pub addr: Address,
    pub handle: ShutdownHandle,
    pub task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    pub async fn channel(&self) -> Channel {
        Channel::connect(self.addr.clone()).await.expect("connect")
    }

    pub async fn stop(self) {
        self.handle.shutdown(Duration::from_secs(1)).await;
        let _ = self.task.await;
    }
}

pub async fn serve(builder: ServerBuilder, t: Transport) -> TestServer {
    let server = builder.bind(listen_addr(t)).await.expect("bind");
    let addr = server.local_addr().clone();
    let handle = server.shutdown_handle();
    let task = tokio::spawn(server.serve());
    TestServer { addr, handle, task }
}

/// Signals from handlers to tests.
#[derive(Clone, Default)]
pub struct Probe {
    /// Calls whose handler saw cancellation (dropped or cancelled), by their request text.
    pub cancelled: Arc<std::sync::Mutex<Vec<String>>>,
    pub started: Arc<tokio::sync::Notify>,
    pub cancelled_notify: Arc<tokio::sync::Notify>,
}

/// Runs `f` when dropped: tells a test that a handler's future went away.
pub struct OnDrop<F: FnMut()>(pub F);
impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

fn text(b: &Bytes) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The test service:
/// - Unary: echo;
/// - ServerStream: request "N" or "N:SIZE" → N messages ("0", "1", … or SIZE bytes each);
/// - ClientStream: concatenation of the requests;
/// - Bidi: echoes each request, prefixed "echo:";
/// - Fail: request "CODE:message" → that status (with details "d" and trailer "why");
/// - Slow: waits until cancelled (records it in the probe) or 30 s;
/// - Headers: echoes request metadata as response headers and trailers, and the remaining
///   deadline in ms as header "remaining-ms".
pub fn builder(probe: Probe) -> ServerBuilder {
    let p_slow = probe.clone();
    Server::builder()
        .unary(UNARY, RawCodec, |req: Request<Bytes>| async move {
            Ok(Response::new(req.into_inner()))
        })
        .server_streaming(SERVER_STREAM, RawCodec, |req: Request<Bytes>| async move {
            let spec = text(req.get_ref());
            let (n, size) = match spec.split_once(':') {
                Some((n, s)) => (n.parse::<usize>().unwrap_or(0), s.parse::<usize>().ok()),
                None => (spec.parse::<usize>().unwrap_or(0), None),
            };
            let chunk = size.map(|s| Bytes::from(vec![7u8; s]));
            let s = stream::iter(0..n).map(move |i| {
                Ok(match &chunk {
                    Some(c) => c.clone(),
                    None => Bytes::from(i.to_string()),
                })
            });
            Ok(Response::new(s))
        })
        .client_streaming(
            CLIENT_STREAM,
            RawCodec,
            |req: Request<Streaming<Bytes>>| async move {
                let mut s = req.into_inner();
                let mut all = Vec::new();
                while let Some(m) = s.message().await? {
                    all.extend_from_slice(&m);
                }
                Ok(Response::new(Bytes::from(all)))
            },
        )
        .streaming(
            BIDI,
            RawCodec,
            |req: Request<Streaming<Bytes>>| async move {
                let s = req.into_inner();
                let out = s.map(|m| m.map(|m| Bytes::from([&b"echo:"[..], &m[..]].concat())));
                Ok(Response::new(out))
            },
        )
        .unary(FAIL, RawCodec, |req: Request<Bytes>| async move {
            let spec = text(req.get_ref());
            let (code, msg) = spec.split_once(':').unwrap_or(("UNKNOWN", ""));
            let code = Code::from_name(code).unwrap_or(Code::Unknown);
            let trailers = Metadata::builder().text("why", "asked").unwrap().build();
            Err::<Response<Bytes>, _>(
                Status::new(code, msg)
                    .with_details(Bytes::from_static(b"d"))
                    .with_metadata(trailers),
            )
        })
        .unary(SLOW, RawCodec, move |req: Request<Bytes>| {
            let probe = p_slow.clone();
            async move {
                let tag = text(req.get_ref());
                let p2 = probe.clone();
                let _guard = OnDrop(move || {
                    p2.cancelled.lock().unwrap().push(tag.clone());
                    p2.cancelled_notify.notify_one();
                });
                probe.started.notify_one();
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(Response::new(req.into_inner()))
            }
        })
        .unary(HEADERS, RawCodec, |req: Request<Bytes>| async move {
            let mut b = Metadata::builder();
            for (k, v) in req.metadata().iter() {
                b = b.entry(k, v).unwrap();
            }
            if let Some(r) = req.remaining() {
                b = b.text("remaining-ms", &r.as_millis().to_string()).unwrap();
            }
            if let Some(p) = req.peer_addr() {
                b = b.text("peer", &p.to_string()).unwrap();
            }
            let md = b.build();
            Ok(Response::new(req.into_inner())
                .with_metadata(md.clone())
                .with_trailers(md))
        })
}

pub fn bytes(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

pub async fn unary(ch: &Channel, method: &'static str, body: &str) -> Result<Bytes, Status> {
    ch.unary(RawCodec, method, Request::new(bytes(body)))
        .await
        .map(|r| r.into_inner())
}

/// A request stream fed by the returned sender.
pub fn feed() -> (
    mpsc::UnboundedSender<Bytes>,
    impl Stream<Item = Bytes> + Send + 'static,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        tx,
        stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) }),
    )
}

/// Bounds a test step in time.
pub async fn within<T>(secs: u64, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("test step timed out")
}

/// Lone calls (read by their callers when the spin is off) mixed with calls from other tasks, deadlines passing,
/// callers that give up and streams, on both runtimes and transports: every call ends as it
/// should, and promptly (a wake-up lost between a caller and the connection's task would
/// leave a call waiting for ever).
pub fn lone_calls_mixed() {
    for multi in [false, true] {
        let rt = if multi {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
        .unwrap();
        rt.block_on(async {
            for t in BOTH {
                let probe = Probe::default();
                let server = serve(builder(probe), t).await;
                let ch = server.channel().await;
                within(60, async {
                    for round in 0..40 {
                        // Alone: its caller reads the reply.
                        for i in 0..20 {
                            let body = format!("{round}.{i}");
                            assert_eq!(unary(&ch, UNARY, &body).await.unwrap(), bytes(&body));
                        }
                        // Another task's calls join while one is read by its caller.
                        let other = tokio::spawn({
                            let ch = ch.clone();
                            async move {
                                for i in 0..5 {
                                    let body = format!("other {round}.{i}");
                                    assert_eq!(
                                        unary(&ch, UNARY, &body).await.unwrap(),
                                        bytes(&body)
                                    );
                                }
                            }
                        });
                        for i in 0..5 {
                            let body = format!("mine {round}.{i}");
                            assert_eq!(unary(&ch, UNARY, &body).await.unwrap(), bytes(&body));
                        }
                        other.await.unwrap();
                        match round % 4 {
                            // A deadline passes while its caller reads for itself.
                            0 => {
                                let r = ch
                                    .unary(
                                        RawCodec,
                                        SLOW,
                                        Request::new(bytes("late"))
                                            .with_timeout(Duration::from_millis(20)),
                                    )
                                    .await
                                    .unwrap_err();
                                assert_eq!(r.code(), Code::DeadlineExceeded, "{r}");
                            }
                            // A caller gives up (its future is dropped) while reading for
                            // itself, possibly just after the reply woke it.
                            1 => {
                                let give_up = Duration::from_micros(50 + 100 * round as u64);
                                let _ =
                                    tokio::time::timeout(give_up, unary(&ch, UNARY, "maybe")).await;
                            }
                            // A stream in between.
                            2 => {
                                let mut s = ch
                                    .server_streaming(RawCodec, SERVER_STREAM, bytes("3"))
                                    .await
                                    .unwrap()
                                    .into_inner();
                                assert_eq!(count_messages(&mut s).await, 3);
                            }
                            _ => {
                                let e = unary(&ch, FAIL, "NOT_FOUND:gone").await.unwrap_err();
                                assert_eq!(e.code(), Code::NotFound);
                            }
                        }
                    }
                })
                .await;
                server.stop().await;
            }
        });
    }
}

/// A server that completes the handshake, then reads and ignores everything — or, with
/// `hang_up`, reads a little and closes the connection.
pub async fn fake_server(hang_up: bool) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use topspin_proto::frame::Frame;
    use topspin_proto::preface::PREFACE;
    use topspin_proto::Settings;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut hello = PREFACE.to_vec();
                hello.extend_from_slice(&Frame::Settings(Settings::default()).to_bytes());
                if sock.write_all(&hello).await.is_err() {
                    return;
                }
                let mut buf = vec![0u8; 64 * 1024];
                if hang_up {
                    let _ = sock.read(&mut buf).await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    return;
                }
                while matches!(sock.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    format!("tcp://{addr}")
}
