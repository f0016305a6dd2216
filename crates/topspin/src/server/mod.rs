//! The server: [`ServerBuilder`] registers methods, [`Server`] accepts connections and serves
//! them until a graceful [`ShutdownHandle::shutdown`].

mod accept;
pub(crate) mod call;
mod conn;
pub(crate) mod handler;
mod shutdown;

pub use accept::StreamAcceptor;
use accept::*;
pub(crate) use shutdown::Shutdown;
use shutdown::*;
pub use shutdown::{shutdown_signal, ShutdownHandle};

pub use handler::CallKind;

use crate::codec::Codec;
use crate::interceptor::{AsyncInterceptor, Chain, Interceptor};
use crate::streaming::Streaming;
use crate::transport::{Accepted, BindError, Listener};
use crate::{Address, Config, Request, Response, Status};
use futures_util::Stream;
use handler::{Bidi, ClientStreaming, HandlerRef, ServerStreaming, Unary};
use rustc_hash::FxHashMap;
use std::future::Future;
use std::sync::OnceLock;
use std::sync::{Arc, Mutex};
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
    hooks: Vec<ShutdownHook>,
    interceptors: Chain,
    /// TLS, WebSocket, sniffing and gRPC settings of its TCP listeners.
    faces: crate::transport::FaceSettings,
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
        self.faces.tls = Some(tls);
        self
    }

    /// A sniffing `tcp://` port whose TLS settings require client certificates (mutual TLS)
    /// serves TLS clients only by default: a native, h2c or WebSocket client in plaintext is
    /// refused, since it would reach the handlers without a certificate. `true` serves them
    /// too (for a port that must take both; handlers then check
    /// [`Request::tls_peer`](crate::Request::tls_peer) themselves).
    #[cfg(feature = "tls")]
    pub fn plaintext_beside_mtls(mut self, on: bool) -> ServerBuilder {
        self.faces.plaintext_beside_mtls = on;
        self
    }

    /// WebSocket settings (origin allow-list, message size bound, the path of a sniffing
    /// port) for `ws://` and `wss://` addresses.
    #[cfg(feature = "websocket")]
    pub fn websocket(mut self, settings: crate::ws::WebSocketSettings) -> ServerBuilder {
        self.faces.websocket = settings;
        self
    }

    /// One port, many faces: a `tcp://` listener tells native topspin, TLS (when
    /// [`ServerBuilder::tls`] is set) and WebSocket upgrades apart by the client's first byte,
    /// which it peeks without consuming; a client that sends nothing within `timeout` is
    /// dropped. Native connections then run on the same socket fast path as without sniffing.
    #[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
    pub fn sniff_transports(mut self, timeout: Duration) -> ServerBuilder {
        self.faces.sniff = Some(timeout);
        self
    }

    /// Whether the same methods also answer gRPC clients over HTTP/2 on this server's TCP and
    /// TLS ports (default: on). On a plain `tcp://` port a connection whose first byte is the
    /// `P` of HTTP/2's `PRI * HTTP/2.0` preface (h2c, "prior knowledge", what grpcurl
    /// `-plaintext`, grpcio's `insecure_channel` and tonic send) is served as gRPC; a native
    /// one goes on the usual socket fast path after one `recv(MSG_PEEK)`. On TLS the server
    /// offers ALPN `h2` next to `topspin/1`. Handlers see the same `Request` either way;
    /// [`Request::protocol`](crate::Request::protocol) tells them apart. Unix sockets and
    /// [`Server::serve_stream`] stay native. The bounds of the gRPC face are in
    /// `docs/architecture.md` ("The gRPC face").
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let server = topspin::Server::builder()
    ///     .grpc(false) // native topspin only: no peek, no HTTP/2
    ///     .bind("tcp://127.0.0.1:50051")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "grpc")]
    pub fn grpc(mut self, on: bool) -> ServerBuilder {
        self.faces.no_grpc = !on;
        self
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

    /// Adds an interceptor run on every call, before its handler (after those added before
    /// it: registration order is outer to inner). See [`crate::interceptor`].
    pub fn interceptor(mut self, interceptor: impl Interceptor) -> ServerBuilder {
        self.interceptors = self.interceptors.with_sync(None, interceptor);
        self
    }

    /// Adds an interceptor run on the calls of one service only: the methods whose name
    /// starts with `prefix`, e.g. `/kv.Store/`.
    pub fn service_interceptor(
        mut self,
        prefix: &str,
        interceptor: impl Interceptor,
    ) -> ServerBuilder {
        self.interceptors = self.interceptors.with_sync(Some(prefix), interceptor);
        self
    }

    /// Adds an interceptor that may wait before the handler runs (its future is boxed).
    pub fn async_interceptor(mut self, interceptor: impl AsyncInterceptor) -> ServerBuilder {
        self.interceptors = self.interceptors.with_async(None, interceptor);
        self
    }

    /// Adds an asynchronous interceptor for the methods whose name starts with `prefix`.
    pub fn service_async_interceptor(
        mut self,
        prefix: &str,
        interceptor: impl AsyncInterceptor,
    ) -> ServerBuilder {
        self.interceptors = self.interceptors.with_async(Some(prefix), interceptor);
        self
    }

    /// Registers a whole service (for example a generated one).
    pub fn add_service(self, service: impl Service) -> ServerBuilder {
        service.register(self)
    }

    /// Runs `hook` once, when a graceful shutdown begins ([`ShutdownHandle::shutdown`] or
    /// [`Server::serve_with_shutdown`]'s signal): before the server stops accepting and sends
    /// GOAWAY, so that what it changes (a health service turning `NOT_SERVING`, say) is seen by
    /// the calls still open. Hooks run in the order they were added, on the task that began
    /// the shutdown; keep them short and non-blocking.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let stopping = Arc::new(AtomicBool::new(false));
    /// let flag = stopping.clone();
    /// let server = topspin::Server::builder()
    ///     .on_shutdown(move || flag.store(true, Ordering::SeqCst))
    ///     .bind("tcp://127.0.0.1:0")
    ///     .await
    ///     .unwrap();
    /// let handle = server.shutdown_handle();
    /// tokio::spawn(server.serve());
    /// handle.shutdown(std::time::Duration::from_secs(1)).await;
    /// assert!(stopping.load(Ordering::SeqCst));
    /// # }
    /// ```
    pub fn on_shutdown(mut self, hook: impl FnOnce() + Send + 'static) -> ServerBuilder {
        self.hooks.push(Box::new(hook));
        self
    }

    /// The registered methods and their kinds, in registration order.
    pub fn methods(&self) -> &[(String, CallKind)] {
        &self.kinds
    }

    /// Binds the listener (`tcp://host:port`, port 0 for any; `unix:///path`; on Linux
    /// `unix:@name`, an abstract socket; on Linux `shm://name`, shared memory). A Unix socket file is bound under a lock
    /// (`<path>.lock`, removed once bound), replaces a stale socket file nothing answers on,
    /// never one a live server answers on, gets the permission bits of
    /// [`Config::unix_socket_mode`] (default `0o660`) and is removed when the server stops.
    pub async fn bind(self, address: impl crate::IntoAddress) -> Result<Server, ServeError> {
        let address = address.into_address()?;
        let listener = Listener::bind(&address, &self.config, &self.faces)
            .await
            .map_err(|e| match e {
                BindError::Transport(reason) => ServeError::Transport {
                    address: address.clone(),
                    reason,
                },
                BindError::Io(source) => ServeError::Bind {
                    address: address.clone(),
                    source,
                },
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
        // Every handler runs behind its method's interceptors and span (a direct call when
        // there are none and no subscriber wants spans).
        let mut registry = self.registry;
        for (method, handler) in registry.methods.iter_mut() {
            *handler =
                crate::interceptor::server::wrap(handler.clone(), method, &self.interceptors);
        }
        Ok(Server {
            gauges,
            listener,
            local,
            registry: Arc::new(registry),
            config,
            shutdown: ShutdownHandle {
                signal: Shutdown::default(),
                done: done_rx,
                hooks: ShutdownHooks(Arc::new(Mutex::new(self.hooks))),
            },
            done: done_tx,
        })
    }
}

/// A bound server. Run it with [`Server::serve`].
#[derive(Debug)]
pub struct Server {
    listener: Listener,
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
    ///
    /// At most [`Config::max_connections`] connections are served at once: one more is told
    /// why and closed (see there). When accepting fails — typically the process is out of file
    /// descriptors (`EMFILE`) — the server keeps serving the connections it has and tries
    /// again after a pause that doubles up to half a second, then accepts as soon as it can.
    pub async fn serve(self) {
        let Server {
            listener,
            registry,
            config,
            shutdown,
            done,
            ..
        } = self;
        let signal = shutdown.signal.clone();
        let mut conns = JoinSet::new();
        let mut refusals = JoinSet::new();
        let mut listener = Some(listener);
        let mut backoff = Duration::ZERO;
        let pause = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(pause);
        let mut paused = false;
        loop {
            tokio::select! {
                accepted = async {
                    listener.as_ref().expect("listener present").accept().await
                }, if listener.is_some() && !paused => {
                    match accepted {
                        Ok(Err(e)) => tracing::debug!("an accepted connection failed at once: {e}"),
                        Ok(Ok(accepted)) => {
                            backoff = Duration::ZERO;
                            if conns.len() < config.max_connections() {
                                let (registry, config) = (registry.clone(), config.clone());
                                match accepted {
                                    // The fast path: the connection's own future, no layer.
                                    Accepted::Socket(t) => {
                                        conns.spawn(serve_connection(t, registry, config, &signal));
                                    }
                                    other => {
                                        conns.spawn(serve_accepted(other, registry, config, signal.clone()));
                                    }
                                }
                            } else if refusals.len() < MAX_REFUSALS {
                                refusals.spawn(refuse_accepted(accepted, config.clone()));
                            } // else: dropped at once; the client sees the connection close.
                        }
                        Err(e) => {
                            // Out of file descriptors and the like: keep serving the rest, and
                            // try again after a pause (the error repeats until a descriptor
                            // is freed).
                            backoff = (backoff * 2).clamp(ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX);
                            tracing::warn!("accept failed: {e}; trying again in {backoff:?}");
                            pause.as_mut().reset(tokio::time::Instant::now() + backoff);
                            paused = true;
                        }
                    }
                }
                () = &mut pause, if paused => paused = false,
                _ = signal.token.cancelled(), if listener.is_some() => {
                    listener = None; // stop accepting (and remove a Unix socket file)
                    refusals.abort_all();
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                Some(_) = refusals.join_next(), if !refusals.is_empty() => {}
                else => break,
            }
            if listener.is_none() && conns.is_empty() && refusals.is_empty() {
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
