//! The server: [`ServerBuilder`] registers methods, [`Server`] accepts connections and serves
//! them until a graceful [`ShutdownHandle::shutdown`].

mod conn;
pub(crate) mod handler;

pub use handler::CallKind;

use crate::codec::Codec;
use crate::streaming::Streaming;
use crate::transport::Listener;
use crate::{Address, Config, Request, Response, Status};
use futures_util::Stream;
use handler::{Bidi, ClientStreaming, HandlerRef, ServerStreaming, Unary};
use rustc_hash::FxHashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Why a server could not start or serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The address string is invalid.
    #[error(transparent)]
    Address(#[from] crate::AddressError),
    /// The address needs settings the builder was not given (a `tls://` address without
    /// [`ServerBuilder::tls`]), or a feature this build lacks.
    #[error("cannot serve {address}: {reason}")]
    Transport {
        /// Where.
        address: Address,
        /// Why.
        reason: String,
    },
    /// Binding the listener failed.
    #[error("could not listen on {address}: {source}")]
    Bind {
        /// Where.
        address: Address,
        /// Why.
        source: std::io::Error,
    },
}

/// The methods a server offers, by full name.
#[derive(Default)]
pub(crate) struct Registry {
    methods: FxHashMap<Box<str>, HandlerRef>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.methods.keys()).finish()
    }
}

impl Registry {
    pub(crate) fn get(&self, method: &str) -> Option<HandlerRef> {
        self.methods.get(method).cloned()
    }
}

/// A set of methods registered together, such as a generated service.
pub trait Service {
    /// Adds the service's methods to the builder.
    fn register(self, builder: ServerBuilder) -> ServerBuilder;
}

/// Configures and builds a [`Server`].
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use topspin::{codec::RawCodec, Request, Response, Server};
/// let server = Server::builder()
///     .unary("/echo.Echo/Echo", RawCodec, |req: Request<bytes::Bytes>| async move {
///         Ok(Response::new(req.into_inner()))
///     })
///     .bind("tcp://127.0.0.1:50051")
///     .await?;
/// server.serve().await;
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct ServerBuilder {
    config: Config,
    registry: Registry,
    kinds: Vec<(String, CallKind)>,
    #[cfg(feature = "tls")]
    tls: Option<crate::tls::ServerTls>,
    #[cfg(feature = "websocket")]
    websocket: crate::ws::WebSocketSettings,
    #[cfg(any(feature = "tls", feature = "websocket"))]
    sniff: Option<Duration>,
}

impl ServerBuilder {
    /// Limits and timeouts (see [`Config`]).
    pub fn config(mut self, config: Config) -> ServerBuilder {
        self.config = config;
        self
    }

    /// Largest request message accepted (default 64 MiB).
    pub fn max_message_size(mut self, bytes: u32) -> ServerBuilder {
        self.config = self.config.with_max_message_size(bytes);
        self
    }

    /// Most calls one connection may have open at once (default 1024).
    pub fn max_concurrent_calls(mut self, n: u32) -> ServerBuilder {
        self.config = self.config.with_max_concurrent_calls(n);
        self
    }

    /// TLS settings: needed to bind a `tls://` or `wss://` address, and accepted on a sniffing
    /// port ([`ServerBuilder::sniff_transports`]).
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: crate::tls::ServerTls) -> ServerBuilder {
        self.tls = Some(tls);
        self
    }

    /// WebSocket settings (origin allow-list, message size bound, the path of a sniffing
    /// port) for `ws://` and `wss://` addresses.
    #[cfg(feature = "websocket")]
    pub fn websocket(mut self, settings: crate::ws::WebSocketSettings) -> ServerBuilder {
        self.websocket = settings;
        self
    }

    /// One port, many faces: a `tcp://` listener tells native topspin, TLS (when
    /// [`ServerBuilder::tls`] is set) and WebSocket upgrades apart by the client's first byte,
    /// which it peeks without consuming; a client that sends nothing within `timeout` is
    /// dropped. Native connections then run on the same socket fast path as without sniffing.
    #[cfg(any(feature = "tls", feature = "websocket"))]
    pub fn sniff_transports(mut self, timeout: Duration) -> ServerBuilder {
        self.sniff = Some(timeout);
        self
    }

    /// The faces of a listener on `address`; `None` for the plain socket fast path.
    #[cfg(any(feature = "tls", feature = "websocket"))]
    #[allow(unused_mut, unused_variables)]
    fn faces(
        &self,
        address: &Address,
    ) -> Result<Option<crate::transport::sniff::Faces>, ServeError> {
        let err = |reason: &str| ServeError::Transport {
            address: address.clone(),
            reason: reason.to_owned(),
        };
        let mut faces = crate::transport::sniff::Faces {
            #[cfg(feature = "tls")]
            tls: None,
            #[cfg(feature = "websocket")]
            ws: None,
            sniff: false,
            sniff_timeout: self.sniff.unwrap_or(Duration::from_secs(5)),
        };
        match address {
            Address::Tcp(_) => {
                if self.sniff.is_none() {
                    return Ok(None);
                }
                faces.sniff = true;
                #[cfg(feature = "tls")]
                {
                    faces.tls = self
                        .tls
                        .as_ref()
                        .map(|t| t.with_alpn(&[crate::tls::ALPN, b"http/1.1"]));
                }
                #[cfg(feature = "websocket")]
                {
                    faces.ws = Some((self.websocket.clone(), self.websocket.get_path().to_owned()));
                }
            }
            #[cfg(feature = "tls")]
            Address::Tls(_) => {
                let tls = self
                    .tls
                    .as_ref()
                    .ok_or_else(|| err("a tls:// address needs ServerBuilder::tls"))?;
                faces.tls = Some(tls.clone());
            }
            #[cfg(feature = "websocket")]
            Address::Ws(_, path) => {
                faces.ws = Some((self.websocket.clone(), path.clone()));
            }
            #[cfg(all(feature = "tls", feature = "websocket"))]
            Address::Wss(_, path) => {
                let tls = self
                    .tls
                    .as_ref()
                    .ok_or_else(|| err("a wss:// address needs ServerBuilder::tls"))?;
                faces.tls = Some(tls.with_alpn(&[b"http/1.1"]));
                faces.ws = Some((self.websocket.clone(), path.clone()));
            }
            Address::Unix(_) => return Ok(None),
            #[allow(unreachable_patterns)]
            _ => return Err(err("this build lacks the feature for it (tls, websocket)")),
        }
        Ok(Some(faces))
    }

    fn add(mut self, method: &str, handler: HandlerRef) -> ServerBuilder {
        self.kinds.push((method.to_owned(), handler.kind()));
        self.registry.methods.insert(method.into(), handler);
        self
    }

    /// Registers a unary method: `async fn(Request<Req>) -> Result<Response<Resp>, Status>`.
    pub fn unary<C, F, Fut>(self, method: &str, codec: C, f: F) -> ServerBuilder
    where
        C: Codec,
        F: Fn(Request<C::Decode>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Response<C::Encode>, Status>> + Send + 'static,
    {
        self.add(method, Arc::new(Unary(codec, f)))
    }

    /// Registers a server-streaming method: returns a stream of `Result<Resp, Status>`.
    pub fn server_streaming<C, F, Fut, S>(self, method: &str, codec: C, f: F) -> ServerBuilder
    where
        C: Codec,
        F: Fn(Request<C::Decode>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Response<S>, Status>> + Send + 'static,
        S: Stream<Item = Result<C::Encode, Status>> + Send + 'static,
    {
        self.add(method, Arc::new(ServerStreaming(codec, f)))
    }

    /// Registers a client-streaming method: takes a [`Streaming`] of requests.
    pub fn client_streaming<C, F, Fut>(self, method: &str, codec: C, f: F) -> ServerBuilder
    where
        C: Codec,
        F: Fn(Request<Streaming<C::Decode>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Response<C::Encode>, Status>> + Send + 'static,
    {
        self.add(method, Arc::new(ClientStreaming(codec, f)))
    }

    /// Registers a bidirectional streaming method.
    pub fn streaming<C, F, Fut, S>(self, method: &str, codec: C, f: F) -> ServerBuilder
    where
        C: Codec,
        F: Fn(Request<Streaming<C::Decode>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Response<S>, Status>> + Send + 'static,
        S: Stream<Item = Result<C::Encode, Status>> + Send + 'static,
    {
        self.add(method, Arc::new(Bidi(codec, f)))
    }

    /// Registers a whole service (for example a generated one).
    pub fn add_service(self, service: impl Service) -> ServerBuilder {
        service.register(self)
    }

    /// The registered methods and their kinds, in registration order.
    pub fn methods(&self) -> &[(String, CallKind)] {
        &self.kinds
    }

    /// Binds the listener (`tcp://host:port`, port 0 for any; `unix:///path`).
    pub async fn bind(self, address: impl crate::IntoAddress) -> Result<Server, ServeError> {
        let address = address.into_address()?;
        #[cfg(any(feature = "tls", feature = "websocket"))]
        let faces = self.faces(&address)?.map(Arc::new);
        #[cfg(not(any(feature = "tls", feature = "websocket")))]
        if !matches!(address, Address::Tcp(_) | Address::Unix(_)) {
            return Err(ServeError::Transport {
                address,
                reason: "this build lacks the `tls` and `websocket` features".into(),
            });
        }
        let listener = Listener::bind(&address)
            .await
            .map_err(|source| ServeError::Bind {
                address: address.clone(),
                source,
            })?;
        let local = listener.local_addr().map_err(|source| ServeError::Bind {
            address: address.clone(),
            source,
        })?;
        // The real port, under the address's own scheme.
        let local = match (&address, local) {
            (Address::Tls(_), Address::Tcp(hp)) => Address::Tls(hp),
            (Address::Ws(_, p), Address::Tcp(hp)) => Address::Ws(hp, p.clone()),
            (Address::Wss(_, p), Address::Tcp(hp)) => Address::Wss(hp, p.clone()),
            (_, local) => local,
        };
        let (done_tx, done_rx) = watch::channel(false);
        let mut config = self.config;
        let gauges = crate::Gauges::new(config.memory_budget());
        config.gauges = Some(gauges.clone());
        Ok(Server {
            gauges,
            #[cfg(any(feature = "tls", feature = "websocket"))]
            faces,
            listener,
            local,
            registry: Arc::new(self.registry),
            config,
            shutdown: ShutdownHandle {
                signal: Shutdown::default(),
                done: done_rx,
            },
            done: done_tx,
        })
    }
}

/// The shutdown signal a server shares with its connections: a token, and the end of the grace
/// period (set before the token is cancelled).
#[derive(Clone, Debug, Default)]
pub(crate) struct Shutdown {
    pub(crate) token: CancellationToken,
    deadline: Arc<OnceLock<Instant>>,
}

impl Shutdown {
    /// The end of the grace period, once a shutdown has begun.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        if self.token.is_cancelled() {
            Some(self.deadline.get().copied().unwrap_or_else(Instant::now))
        } else {
            None
        }
    }
}

/// Starts or awaits a server's graceful shutdown. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ShutdownHandle {
    signal: Shutdown,
    done: watch::Receiver<bool>,
}

impl ShutdownHandle {
    /// Begins a graceful shutdown: stop accepting, send GOAWAY on every connection, let calls
    /// in flight finish for up to `grace`, then end the rest with `UNAVAILABLE`. Returns when
    /// every connection is closed.
    pub async fn shutdown(&self, grace: Duration) {
        let deadline = Instant::now()
            .checked_add(grace)
            .unwrap_or_else(Instant::now);
        // The first shutdown's grace period stands.
        let _ = self.signal.deadline.set(deadline);
        self.signal.token.cancel();
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }
}

/// A bound server. Run it with [`Server::serve`].
#[derive(Debug)]
pub struct Server {
    listener: Listener,
    /// TLS, WebSocket or sniffing, for a listener that is not the plain socket fast path.
    #[cfg(any(feature = "tls", feature = "websocket"))]
    faces: Option<Arc<crate::transport::sniff::Faces>>,
    local: Address,
    registry: Arc<Registry>,
    config: Config,
    shutdown: ShutdownHandle,
    done: watch::Sender<bool>,
    gauges: crate::Gauges,
}

impl Server {
    /// A builder.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    /// The address it listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> &Address {
        &self.local
    }

    /// Live gauges of this server's connections: connections, open calls, unsent bytes, bytes
    /// reserved for incoming messages (see [`Gauges`](crate::Gauges)).
    pub fn gauges(&self) -> crate::Gauges {
        self.gauges.clone()
    }

    /// A handle to shut it down gracefully.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Serves one connection over a connected byte stream — anything `AsyncRead + AsyncWrite`
    /// (a stream the application accepted itself: TLS it terminates, an SSH channel, an
    /// in-memory pipe) — with this server's methods, limits and shutdown. Spawn the returned
    /// future; it ends when the connection does. [`Server::stream_acceptor`] does the same
    /// after [`Server::serve`] has taken the server.
    pub fn serve_stream<S>(&self, stream: S) -> impl Future<Output = ()> + Send + 'static
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        self.stream_acceptor().serve(stream)
    }

    /// A cheap, cloneable handle that serves connected byte streams with this server's
    /// methods, limits and shutdown, usable while [`Server::serve`] runs.
    pub fn stream_acceptor(&self) -> StreamAcceptor {
        StreamAcceptor {
            registry: self.registry.clone(),
            config: self.config.clone(),
            signal: self.shutdown.signal.clone(),
        }
    }

    /// Serves one connection over a connected transport, with this server's methods, limits
    /// and shutdown (which it obeys like any accepted connection).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn serve_transport<T: crate::transport::Transport>(
        &self,
        transport: T,
    ) -> impl Future<Output = ()> + Send + 'static {
        conn::serve(
            transport,
            self.registry.clone(),
            self.config.clone(),
            self.shutdown.signal.clone(),
        )
    }

    /// Serves connections until a shutdown completes. Each connection is a task of its own;
    /// its calls are handled on it.
    pub async fn serve(self) {
        let Server {
            listener,
            registry,
            config,
            shutdown,
            done,
            #[cfg(any(feature = "tls", feature = "websocket"))]
            faces,
            ..
        } = self;
        let signal = shutdown.signal.clone();
        let mut conns = JoinSet::new();
        let mut listener = Some(listener);
        loop {
            tokio::select! {
                accepted = async {
                    let l = listener.as_ref().expect("listener present");
                    #[cfg(any(feature = "tls", feature = "websocket"))]
                    if let Some(faces) = &faces {
                        if let Some(r) = l.accept_tcp().await {
                            return r.map(|(tcp, addr)| Accepted::Layered(faces.clone(), tcp, addr));
                        }
                    }
                    l.accept().await.map(Accepted::Socket)
                }, if listener.is_some() => {
                    match accepted {
                        Ok(Accepted::Socket(transport)) => {
                            conns.spawn(conn::serve(transport, registry.clone(), config.clone(), signal.clone()));
                        }
                        #[cfg(any(feature = "tls", feature = "websocket"))]
                        Ok(Accepted::Layered(faces, tcp, addr)) => {
                            conns.spawn(serve_layered(faces, tcp, addr, registry.clone(), config.clone(), signal.clone()));
                        }
                        Err(e) => {
                            // Out of file descriptors and the like: keep serving the rest.
                            tracing::warn!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                _ = signal.token.cancelled(), if listener.is_some() => {
                    listener = None; // stop accepting (and remove a Unix socket file)
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                else => break,
            }
            if listener.is_none() && conns.is_empty() {
                break;
            }
        }
        let _ = done.send(true);
    }

    /// Serves until `signal` completes, then shuts down gracefully with `grace` (a GOAWAY on
    /// every connection, no new calls, calls in flight get `grace`, then the rest end
    /// `UNAVAILABLE`). With [`shutdown_signal`] a server drains on Ctrl-C and on SIGTERM.
    ///
    /// ```no_run
    /// # async fn f(server: topspin::Server) {
    /// use std::time::Duration;
    /// server
    ///     .serve_with_shutdown(topspin::shutdown_signal(), Duration::from_secs(5))
    ///     .await;
    /// # }
    /// ```
    pub async fn serve_with_shutdown(self, signal: impl Future<Output = ()>, grace: Duration) {
        let handle = self.shutdown_handle();
        let serve = self.serve();
        tokio::pin!(serve);
        tokio::select! {
            _ = &mut serve => return,
            _ = signal => {}
        }
        tokio::join!(serve, handle.shutdown(grace));
    }
}

/// What the accept loop took.
enum Accepted {
    Socket(crate::transport::socket::SocketTransport),
    #[cfg(any(feature = "tls", feature = "websocket"))]
    Layered(
        Arc<crate::transport::sniff::Faces>,
        tokio::net::TcpStream,
        std::net::SocketAddr,
    ),
}

/// Sets up a connection's TLS and WebSocket layers (within the handshake timeout) on its own
/// task, then serves it; a failed handshake ends that connection only.
#[cfg(any(feature = "tls", feature = "websocket"))]
async fn serve_layered(
    faces: Arc<crate::transport::sniff::Faces>,
    tcp: tokio::net::TcpStream,
    addr: std::net::SocketAddr,
    registry: Arc<Registry>,
    config: Config,
    signal: Shutdown,
) {
    use crate::transport::sniff::Upgraded;
    // A shutdown drops connections still in their TLS or WebSocket handshake.
    let upgraded = tokio::select! {
        r = faces.upgrade(tcp, addr, config.handshake_timeout()) => r,
        _ = signal.token.cancelled() => Err("the server is shutting down".into()),
    };
    match upgraded {
        Ok(Upgraded::Native(t)) => conn::serve(t, registry, config, signal).await,
        #[cfg(feature = "tls")]
        Ok(Upgraded::Tls(t)) => conn::serve(t, registry, config, signal).await,
        #[cfg(feature = "websocket")]
        Ok(Upgraded::Ws(t)) => conn::serve(t, registry, config, signal).await,
        #[cfg(all(feature = "tls", feature = "websocket"))]
        Ok(Upgraded::Wss(t)) => conn::serve(t, registry, config, signal).await,
        Err(why) => tracing::debug!(peer = %addr, "connection refused: {why}"),
    }
}

/// Serves connections over byte streams the application accepted itself (see
/// [`Server::stream_acceptor`]). Cheap to clone.
#[derive(Clone, Debug)]
pub struct StreamAcceptor {
    registry: Arc<Registry>,
    config: Config,
    signal: Shutdown,
}

impl StreamAcceptor {
    /// Serves one connection over `stream` until it ends (spawn the future). Its peer address
    /// is [`PeerAddr::Stream`](crate::PeerAddr::Stream).
    pub fn serve<S>(&self, stream: S) -> impl Future<Output = ()> + Send + 'static
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let transport =
            crate::transport::stream::StreamTransport::new(stream, crate::PeerAddr::Stream);
        conn::serve(
            transport,
            self.registry.clone(),
            self.config.clone(),
            self.signal.clone(),
        )
    }
}

/// Completes when the process is asked to stop: SIGINT (Ctrl-C) or SIGTERM, which process
/// managers, systemd and Kubernetes send before they kill a process. Give it to
/// [`Server::serve_with_shutdown`] so that a server drains instead of dying mid-call.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot watch SIGTERM ({e}); shutting down on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
