//! Shared test fixtures: a test service with every call kind ([`builder`], [`standard`]),
//! started on any transport ([`Transport`], [`ALL`], [`serve`], [`each_transport`]) — or by
//! tonic, and called by tonic's client ([`each_client`]).
#![allow(dead_code)]

pub mod blocking;
mod tonic_client;
mod tonic_service;
/// tonic's codec for raw bytes (what a generated prost codec does, minus prost).
#[allow(unused_imports)]
pub use tonic_service::Raw as TonicRaw;

pub use tonic_client::Client;

use bytes::Bytes;
use futures_util::{stream, Stream, StreamExt};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use topspin::codec::RawCodec;
use topspin::{
    Address, Channel, Code, Compression, Config, Endpoint, Metadata, Request, Response, Server,
    ServerBuilder, ShutdownHandle, Status, Streaming,
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
pub const STREAM_FAIL: &str = "/test.Echo/StreamFail";
pub const EMPTY: &str = "/test.Echo/Empty";
pub const GATED: &str = "/test.Echo/Gated";

/// Every way a topspin `Channel` reaches a topspin `Server`: the one list the capability tests
/// (unary, streaming, deadlines, cancellation, metadata, limits, shutdown, reconnect,
/// concurrency, large messages, compression, …) run over, each test leaving out — by name and
/// with its reason ([`each_transport`]) — the entries where its capability does not apply.
///
/// `Grpc` is a topspin server's gRPC face dialled by topspin's own `grpc://` client mode, so it
/// exercises both together; `GrpcTonic` is the client mode against a tonic server serving the
/// same test service ([`standard`]), so it takes part only where a test's server is that
/// service; `TonicClient` is tonic's client against the face, not in [`ALL`] (it is no
/// `Channel`) but in the cells written over [`Client`] ([`each_client`]). Tonic's client's
/// own cases against the face stay in `grpc_face.rs`, and the client mode's against tonic in
/// `grpc_client.rs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// `tcp://127.0.0.1:0`.
    Tcp,
    /// `unix:///tmp/…sock`.
    Unix,
    /// `unix:@name` (Linux): an abstract socket, no file.
    UnixAbstract,
    /// `tls://` with a throw-away certificate for `localhost`.
    Tls,
    /// `ws://127.0.0.1:0/rpc`.
    Ws,
    /// `wss://127.0.0.1:0/rpc` with the same throw-away certificate.
    Wss,
    /// `shm://name` (Linux).
    Shm,
    /// `Channel::from_stream` over a `tokio::io::duplex`, served by `Server::serve_stream`.
    Stream,
    /// The server's gRPC face on its TCP port, dialled as `grpc://`.
    Grpc,
    /// A tonic server (`tests/common/tonic_service.rs`) serving the standard test service,
    /// dialled as `grpc://`: the gRPC client mode against a gRPC server no one here wrote.
    GrpcTonic,
    /// Tonic's client against a topspin server's gRPC face (on its TCP port). Not in [`ALL`]:
    /// tonic's client is no topspin `Channel`, so it takes part only in the cells written over
    /// [`Client`] ([`each_client`]).
    TonicClient,
}

/// Every transport this build has.
pub const ALL: &[Transport] = &[
    Transport::Tcp,
    Transport::Unix,
    #[cfg(target_os = "linux")]
    Transport::UnixAbstract,
    #[cfg(feature = "tls")]
    Transport::Tls,
    #[cfg(feature = "websocket")]
    Transport::Ws,
    #[cfg(all(feature = "websocket", feature = "tls"))]
    Transport::Wss,
    #[cfg(target_os = "linux")]
    Transport::Shm,
    Transport::Stream,
    #[cfg(feature = "grpc")]
    Transport::Grpc,
    Transport::GrpcTonic,
];

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Tcp => "tcp",
            Transport::Unix => "unix",
            Transport::UnixAbstract => "unix-abstract",
            Transport::Tls => "tls",
            Transport::Ws => "ws",
            Transport::Wss => "wss",
            Transport::Shm => "shm",
            Transport::Stream => "stream",
            Transport::Grpc => "grpc",
            Transport::GrpcTonic => "grpc-tonic-server",
            Transport::TonicClient => "grpc-tonic-client",
        })
    }
}

/// [`ALL`], and tonic's client against the gRPC face ([`Transport::TonicClient`]): the
/// entries of the cells written over [`Client`].
pub fn clients() -> Vec<Transport> {
    #[cfg_attr(not(feature = "grpc"), allow(unused_mut))]
    let mut all = ALL.to_vec();
    #[cfg(feature = "grpc")]
    all.push(Transport::TonicClient);
    all
}

/// [`each_transport`] over [`clients`], for a cell that calls through [`TestServer::client`].
pub async fn each_client<F, Fut>(skips: &[Skip], test: F)
where
    F: FnMut(Transport) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    each_of(clients(), skips, test).await
}

/// A transport a test leaves out, and why.
pub type Skip = (Transport, &'static str);

/// Why `Stream` cannot take part in tests that dial an address again.
pub const STREAM_NO_ADDRESS: &str =
    "a Channel::from_stream has no address: it cannot reconnect, pool or be dialled lazily";

/// Why `GrpcTonic` cannot take part in a test whose server is a topspin `ServerBuilder` of its
/// own (methods added, a handler of its own, settings only a topspin server has): the tonic
/// server serves the standard test service alone. Each test says what its server has.
pub const fn not_standard(what: &'static str) -> Skip {
    (Transport::GrpcTonic, what)
}

/// Why a slow cell is left out on a transport whose layers another cell already runs: the
/// abstract socket is the Unix socket's code with another address, wss:// is ws:// over tls://.
pub const TRIMMED: &str =
    "trimmed for test time: the same layers run on tcp/unix (abstract: unix's code) and ws + tls (wss)";

/// `skips` plus `trimmed`, each with [`TRIMMED`] as its reason.
pub fn trim(skips: &[Skip], trimmed: &[Transport]) -> Vec<Skip> {
    let mut all = skips.to_vec();
    all.extend(trimmed.iter().map(|t| (*t, TRIMMED)));
    all
}

/// Runs `test` once per transport of [`ALL`] not in `skips` (each skipped one is printed with
/// its reason), each bounded to `CELL_SECS`. Every transport runs even after one failed; the
/// test then fails naming each transport that failed and how.
pub async fn each_transport<F, Fut>(skips: &[Skip], test: F)
where
    F: FnMut(Transport) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    each_of(ALL.iter().copied(), skips, test).await
}

/// How long one (test × transport) cell may take.
pub const CELL_SECS: u64 = 120;

/// [`each_transport`] over a chosen list.
pub async fn each_of<F, Fut>(
    transports: impl IntoIterator<Item = Transport>,
    skips: &[Skip],
    mut test: F,
) where
    F: FnMut(Transport) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use futures_util::FutureExt;
    let mut failed = Vec::new();
    for t in transports {
        if let Some((_, why)) = skips.iter().find(|(s, _)| *s == t) {
            eprintln!("[{t}] skipped: {why}");
            continue;
        }
        let started = std::time::Instant::now();
        let cell = tokio::time::timeout(Duration::from_secs(CELL_SECS), test(t));
        match std::panic::AssertUnwindSafe(cell).catch_unwind().await {
            Ok(Ok(())) => eprintln!("[{t}] ok in {:?}", started.elapsed()),
            Ok(Err(_)) => failed.push(format!("[{t}] timed out after {CELL_SECS} s")),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "(a panic without a message)".into());
                failed.push(format!("[{t}] {what}"));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "failed on {} transport(s):\n{}",
        failed.len(),
        failed.join("\n")
    );
}

static NEXT_SOCK: AtomicUsize = AtomicUsize::new(0);

/// A fresh address to bind a server of transport `t` to (port 0 where there is a port; a new
/// name where there is a name; a placeholder TCP listener for `Stream`, whose connections come
/// through [`TestServer::channel`]).
pub fn listen_addr(t: Transport) -> String {
    let n = NEXT_SOCK.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    match t {
        Transport::Tcp
        | Transport::Tls
        | Transport::Grpc
        | Transport::GrpcTonic
        | Transport::TonicClient
        | Transport::Stream => {
            let scheme = if t == Transport::Tls { "tls" } else { "tcp" };
            format!("{scheme}://127.0.0.1:0")
        }
        Transport::Unix => {
            let dir = std::env::temp_dir();
            format!("unix://{}/topspin-test-{pid}-{n}.sock", dir.display())
        }
        Transport::UnixAbstract => format!("unix:@topspin-test-{pid}-{n}"),
        Transport::Ws => "ws://127.0.0.1:0/rpc".into(),
        Transport::Wss => "wss://127.0.0.1:0/rpc".into(),
        Transport::Shm => format!("shm://topspin-test-{pid}-{n}"),
    }
}

/// A fixed address no server is bound to yet, for `t` (a port the kernel just handed out and
/// took back, where there is a port): what to bind, and what a client dials.
pub fn unbound_addr(t: Transport) -> String {
    let any = listen_addr(t);
    if !any.contains("127.0.0.1:0") {
        return any;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    any.replace("127.0.0.1:0", &format!("127.0.0.1:{port}"))
}

/// The throw-away certificate (for `localhost`) of the `Tls` and `Wss` transports, made once per
/// test process.
#[cfg(feature = "tls")]
fn test_tls() -> &'static (topspin::tls::ServerTls, topspin::tls::ClientTls) {
    static TLS: std::sync::OnceLock<(topspin::tls::ServerTls, topspin::tls::ClientTls)> =
        std::sync::OnceLock::new();
    TLS.get_or_init(|| {
        let ca = Ca::new("topspin test CA");
        let pair = ca.issue("server", &["localhost"], false);
        let server =
            topspin::tls::ServerTls::from_pem_files(&pair.cert, &pair.key).expect("server TLS");
        let client = topspin::tls::ClientTls::ca_pem_file(&ca.cert)
            .expect("client TLS")
            .server_name("localhost")
            .expect("server name");
        (server, client)
    })
}

/// A running test server and how to reach it over its transport.
pub struct TestServer {
    pub transport: Transport,
    /// What a client dials (`grpc://…` for `Grpc`; a placeholder that fails to connect for
    /// `Stream`, whose channels come from [`TestServer::channel`]).
    pub addr: Address,
    /// The address the server is bound to (to bind another server there after this one).
    pub bound: String,
    /// The task serving: aborting it drops every connection, as a crash would (but for
    /// `Stream`, whose connections run on tasks of their own).
    pub task: tokio::task::JoinHandle<()>,
    /// A topspin server's; `None` for the tonic server of `GrpcTonic`.
    handle: Option<ShutdownHandle>,
    /// The tonic server's (`GrpcTonic`).
    tonic: Option<tonic_service::Running>,
    acceptor: Option<topspin::StreamAcceptor>,
}

impl TestServer {
    pub async fn channel(&self) -> Channel {
        self.connect_with(|e| e)
            .await
            .unwrap_or_else(|e| panic!("[{}] connect: {e}", self.transport))
    }

    /// A client of this server: tonic's for `TonicClient`, else a topspin channel.
    pub async fn client(&self) -> Client {
        if self.transport != Transport::TonicClient {
            return Client::Topspin(self.channel().await);
        }
        let host_port = self.bound.strip_prefix("tcp://").expect("a TCP port");
        Client::tonic(host_port)
            .await
            .unwrap_or_else(|e| panic!("[{}] connect: {e}", self.transport))
    }

    /// An endpoint to dial this server with (its client TLS settings set); not for `Stream`.
    pub fn endpoint(&self) -> Endpoint {
        endpoint_for(self.transport, self.addr.clone())
    }

    /// A channel from [`TestServer::endpoint`] after `f` (limits, timeouts, …); for `Stream` a
    /// new pipe served by the server, with the endpoint's settings.
    pub async fn connect_with(
        &self,
        f: impl FnOnce(Endpoint) -> Endpoint,
    ) -> Result<Channel, Status> {
        assert!(
            self.transport != Transport::TonicClient,
            "[{}] tonic's client is no topspin Channel: a cell over it calls through \
             TestServer::client",
            self.transport
        );
        let endpoint = f(self.endpoint());
        match &self.acceptor {
            Some(acceptor) => {
                let (a, b) = tokio::io::duplex(256 * 1024);
                tokio::spawn(acceptor.serve(a));
                endpoint.connect_stream(b).await
            }
            None => endpoint.connect().await,
        }
    }

    /// `Stream` only: the client's end of a new pipe the server serves, for a test to write
    /// raw bytes into.
    pub fn pipe(&self) -> tokio::io::DuplexStream {
        let acceptor = self.acceptor.as_ref().expect("a Stream server");
        let (a, b) = tokio::io::duplex(256 * 1024);
        tokio::spawn(acceptor.serve(a));
        b
    }

    /// The topspin server's shutdown handle (not for `GrpcTonic`: use [`TestServer::shutdown`]).
    pub fn handle(&self) -> &ShutdownHandle {
        self.handle.as_ref().unwrap_or_else(|| {
            panic!(
                "[{}] a tonic server has no topspin ShutdownHandle",
                self.transport
            )
        })
    }

    /// Stops accepting, lets calls in flight finish for up to `grace`, then ends the rest;
    /// returns when every connection is closed (a topspin server's
    /// [`ShutdownHandle::shutdown`]; a tonic server's graceful shutdown, then its connections
    /// dropped).
    pub async fn shutdown(&self, grace: Duration) {
        match (&self.handle, &self.tonic) {
            (Some(handle), _) => handle.shutdown(grace).await,
            (None, Some(tonic)) => tonic.shutdown(grace).await,
            (None, None) => unreachable!("a test server is topspin's or tonic's"),
        }
    }

    pub async fn stop(self) {
        self.shutdown(Duration::from_secs(1)).await;
        let _ = self.task.await;
    }
}

/// What a client of transport `t` dials to reach a server bound to `bound` (`grpc://` for the
/// gRPC face of a TCP port).
pub fn dial_addr(t: Transport, bound: &str) -> Address {
    let dial = match t {
        Transport::Grpc | Transport::GrpcTonic => bound.replacen("tcp://", "grpc://", 1),
        _ => bound.to_owned(),
    };
    dial.parse().expect("a valid address")
}

/// An endpoint for `addr` over transport `t` (with the test certificate's client settings).
pub fn endpoint_for(t: Transport, addr: Address) -> Endpoint {
    let e = Endpoint::new(addr).expect("a valid address");
    #[cfg(feature = "tls")]
    if matches!(t, Transport::Tls | Transport::Wss) {
        return e.tls(test_tls().1.clone());
    }
    let _ = t;
    e
}

/// What a test server serves.
pub enum TestService {
    /// The standard test service ([`builder`]) with settings both a topspin and a tonic
    /// server have: every transport, `GrpcTonic` included, can serve it.
    Standard(Standard),
    /// A topspin server the test built itself: every transport but `GrpcTonic` (whose tonic
    /// server serves the standard service alone; such a test skips it with
    /// [`not_standard`]).
    Custom(Box<ServerBuilder>),
}

impl From<ServerBuilder> for TestService {
    fn from(b: ServerBuilder) -> TestService {
        TestService::Custom(Box::new(b))
    }
}

impl From<Standard> for TestService {
    fn from(s: Standard) -> TestService {
        TestService::Standard(s)
    }
}

/// The standard test service ([`builder`]) reporting to `probe`, with the default settings.
pub fn standard(probe: Probe) -> Standard {
    Standard {
        probe,
        options: StandardOptions::default(),
    }
}

/// The standard test service and the server settings it runs with ([`standard`]).
pub struct Standard {
    pub probe: Probe,
    options: StandardOptions,
}

/// The server settings a test of the standard service may change: those a tonic server has
/// too (`max_concurrent_streams`, `max_decoding_message_size`, `send_compressed`).
#[derive(Clone, Copy)]
pub struct StandardOptions {
    pub max_message_size: u32,
    pub max_concurrent_calls: Option<u32>,
    pub compression: Option<Compression>,
}

impl Default for StandardOptions {
    fn default() -> StandardOptions {
        StandardOptions {
            max_message_size: Config::default().max_message_size(),
            max_concurrent_calls: None,
            compression: None,
        }
    }
}

impl Standard {
    /// Largest request message the server accepts.
    pub fn max_message_size(mut self, bytes: u32) -> Standard {
        self.options.max_message_size = bytes;
        self
    }

    /// Most calls one connection may have open at once.
    pub fn max_concurrent_calls(mut self, n: u32) -> Standard {
        self.options.max_concurrent_calls = Some(n);
        self
    }

    /// The server's response compression (where the client accepts it).
    pub fn compression(mut self, c: Option<Compression>) -> Standard {
        self.options.compression = c;
        self
    }

    /// The topspin server of this service.
    pub fn into_builder(self) -> ServerBuilder {
        let o = self.options;
        let mut config = Config::default()
            .with_max_message_size(o.max_message_size)
            .with_compression(o.compression);
        if let Some(n) = o.max_concurrent_calls {
            config = config.with_max_concurrent_calls(n);
        }
        builder(self.probe).config(config)
    }
}

/// Starts `service` on a fresh address of transport `t`.
pub async fn serve(service: impl Into<TestService>, t: Transport) -> TestServer {
    serve_at(service, t, &listen_addr(t)).await
}

/// Starts `service` on `addr` (of transport `t`): the one way the tests start a server.
pub async fn serve_at(service: impl Into<TestService>, t: Transport, addr: &str) -> TestServer {
    let builder = match (service.into(), t) {
        (TestService::Standard(s), Transport::GrpcTonic) => {
            let (bound, task, running) = tonic_service::start(s.probe, s.options, addr).await;
            return TestServer {
                transport: t,
                addr: dial_addr(t, &bound),
                bound,
                task,
                handle: None,
                tonic: Some(running),
                acceptor: None,
            };
        }
        (TestService::Custom(_), Transport::GrpcTonic) => panic!(
            "[{t}] this test's server is a topspin ServerBuilder of its own, which the tonic \
             server cannot serve: skip {t} with common::not_standard(\"what its server has\")"
        ),
        (TestService::Standard(s), _) => s.into_builder(),
        (TestService::Custom(b), _) => *b,
    };
    #[cfg(feature = "tls")]
    let builder = if matches!(t, Transport::Tls | Transport::Wss) {
        builder.tls(test_tls().0.clone())
    } else {
        builder
    };
    let server = builder
        .bind(addr)
        .await
        .unwrap_or_else(|e| panic!("[{t}] bind {addr}: {e}"));
    started(server, t)
}

/// Serves a server already bound (on an address of transport `t`) as a [`TestServer`].
pub fn started(server: Server, t: Transport) -> TestServer {
    let bound = server.local_addr().to_string();
    let (addr, acceptor) = match t {
        Transport::Stream => (
            Address::Unix("(a stream has no address)".into()),
            Some(server.stream_acceptor()),
        ),
        _ => (dial_addr(t, &bound), None),
    };
    let handle = server.shutdown_handle();
    let task = tokio::spawn(server.serve());
    TestServer {
        transport: t,
        addr,
        bound,
        task,
        handle: Some(handle),
        tonic: None,
        acceptor,
    }
}

/// Signals from handlers to tests.
#[derive(Clone, Default)]
pub struct Probe {
    /// Calls whose handler saw cancellation (dropped or cancelled), by their request text.
    pub cancelled: Arc<std::sync::Mutex<Vec<String>>>,
    pub started: Arc<tokio::sync::Notify>,
    pub cancelled_notify: Arc<tokio::sync::Notify>,
    /// Lets the Gated method's calls answer (one per `notify_one`).
    pub release: Arc<tokio::sync::Notify>,
    /// The encoding of each compressed request the Unary method saw, in order.
    pub encodings: Arc<std::sync::Mutex<Vec<&'static str>>>,
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
/// - Unary: echo (the encoding of a compressed request goes to the probe);
/// - ServerStream: request "N" or "N:SIZE" → N messages ("0", "1", … or SIZE bytes each);
/// - ClientStream: concatenation of the requests;
/// - Bidi: echoes each request, prefixed "echo:";
/// - Fail: request "CODE:message" → that status (with details "d" and trailer "why");
/// - Slow: waits until cancelled (records it in the probe) or 30 s;
/// - Headers: echoes request metadata as response headers and trailers, and the remaining
///   deadline in ms as header "remaining-ms";
/// - StreamFail: request "N:CODE:message" → N messages ("0", "1", …), then that status;
/// - Empty: an empty response stream with header "h: v" (request "later": answered after a
///   yield, not in the handler's first poll);
/// - Gated: signals `started`, waits for `release`, then echoes.
pub fn builder(probe: Probe) -> ServerBuilder {
    let p_slow = probe.clone();
    let p_unary = probe.clone();
    let p_gated = probe.clone();
    Server::builder()
        .unary(UNARY, RawCodec, move |req: Request<Bytes>| {
            if let Some(e) = req.encoding() {
                p_unary.encodings.lock().unwrap().push(e.name());
            }
            async move { Ok(Response::new(req.into_inner())) }
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
        .server_streaming(STREAM_FAIL, RawCodec, |req: Request<Bytes>| async move {
            let spec = text(req.get_ref());
            let mut parts = spec.splitn(3, ':');
            let n = parts
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0);
            let code = parts
                .next()
                .and_then(Code::from_name)
                .unwrap_or(Code::Unknown);
            let status = Status::new(code, parts.next().unwrap_or(""));
            let messages = (0..n).map(|i| Ok(Bytes::from(i.to_string())));
            Ok(Response::new(stream::iter(
                messages.chain(std::iter::once(Err(status))),
            )))
        })
        .unary(GATED, RawCodec, move |req: Request<Bytes>| {
            let probe = p_gated.clone();
            async move {
                probe.started.notify_one();
                probe.release.notified().await;
                Ok(Response::new(req.into_inner()))
            }
        })
        .server_streaming(EMPTY, RawCodec, |req: Request<Bytes>| async move {
            if req.get_ref().as_ref() == b"later" {
                tokio::task::yield_now().await;
            }
            let md = Metadata::builder().text("h", "v").unwrap().build();
            Ok(Response::new(stream::empty::<Result<Bytes, Status>>()).with_metadata(md))
        })
}

/// A request over a server's message limit, as the server refuses it: a topspin server with
/// `RESOURCE_EXHAUSTED` naming the setting (`max_message_size`), a tonic server (`GrpcTonic`)
/// with its own `OUT_OF_RANGE` ("decoded message length too large"); both name each of
/// `numbers` (the size, the limit). The gRPC client mode sends such a request as it is: a gRPC
/// server announces no message limit.
pub fn assert_over_servers_limit(t: Transport, err: &Status, numbers: &[usize]) {
    for n in numbers {
        assert!(
            err.message().contains(&n.to_string()),
            "[{t}] names {n}: {err}"
        );
    }
    if t == Transport::GrpcTonic {
        assert_eq!(err.code(), Code::OutOfRange, "[{t}] {err}");
    } else {
        assert_eq!(err.code(), Code::ResourceExhausted, "[{t}] {err}");
        assert!(
            err.message().contains("max_message_size"),
            "[{t}] names the setting: {err}"
        );
    }
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
/// callers that give up and streams, on both runtimes and every transport: every call ends as it
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
        rt.block_on(each_transport(&[], |t| async move {
            let probe = Probe::default();
            let server = serve(standard(probe), t).await;
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
                                assert_eq!(unary(&ch, UNARY, &body).await.unwrap(), bytes(&body));
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
                            let _ = tokio::time::timeout(give_up, unary(&ch, UNARY, "maybe")).await;
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
        }));
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

// Certificates made at test time (rcgen), for the TLS and WebSocket-over-TLS transports.

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// A certificate authority that issues server and client certificates into PEM files.
pub struct Ca {
    pub dir: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
}

/// A certificate and its key, as PEM files.
pub struct Pair {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

fn temp_dir() -> std::path::PathBuf {
    let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("topspin-pki-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let dir = temp_dir();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("self-signed CA");
        let path = dir.join("ca.pem");
        std::fs::write(&path, cert.pem()).expect("write CA");
        Ca {
            dir,
            cert: path,
            params,
            key,
        }
    }

    /// A certificate for `names` (DNS names or IP addresses), valid now unless `expired`.
    pub fn issue(&self, file: &str, names: &[&str], expired: bool) -> Pair {
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            names.first().copied().unwrap_or("x"),
        );
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let key = rcgen::KeyPair::generate().expect("key");
        let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("sign");
        self.write(file, &cert.pem(), &key.serialize_pem())
    }

    /// Writes a certificate and key (replacing files of the same name).
    pub fn write(&self, file: &str, cert: &str, key: &str) -> Pair {
        let pair = Pair {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&pair.cert, cert).expect("write cert");
        std::fs::write(&pair.key, key).expect("write key");
        pair
    }
}

impl Drop for Ca {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
