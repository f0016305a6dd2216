//! The server: [`ServerBuilder`] registers methods, [`Server`] accepts connections and serves
//! them until a graceful [`ShutdownHandle::shutdown`].

mod conn;
pub(crate) mod handler;

pub use handler::CallKind;

use crate::codec::Codec;
use crate::interceptor::{AsyncInterceptor, Chain, Interceptor, Layer};
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
    interceptors: Chain,
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
        self.interceptors = self
            .interceptors
            .push(None, Layer::Sync(Arc::new(interceptor)));
        self
    }

    /// Adds an interceptor run on the calls of one service only: the methods whose name
    /// starts with `prefix`, e.g. `/kv.Store/`.
    pub fn service_interceptor(
        mut self,
        prefix: &str,
        interceptor: impl Interceptor,
    ) -> ServerBuilder {
        self.interceptors = self
            .interceptors
            .push(Some(prefix), Layer::Sync(Arc::new(interceptor)));
        self
    }

    /// Adds an interceptor that may wait before the handler runs (its future is boxed).
    pub fn async_interceptor(mut self, interceptor: impl AsyncInterceptor) -> ServerBuilder {
        self.interceptors = self
            .interceptors
            .push(None, Layer::Async(Arc::new(interceptor)));
        self
    }

    /// Adds an asynchronous interceptor for the methods whose name starts with `prefix`.
    pub fn service_async_interceptor(
        mut self,
        prefix: &str,
        interceptor: impl AsyncInterceptor,
    ) -> ServerBuilder {
        self.interceptors = self
            .interceptors
            .push(Some(prefix), Layer::Async(Arc::new(interceptor)));
        self
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
        let (done_tx, done_rx) = watch::channel(false);
        // Every handler runs behind its method's interceptors and span (a direct call when
        // there are none and no subscriber wants spans).
        let mut registry = self.registry;
        for (method, handler) in registry.methods.iter_mut() {
            *handler =
                crate::interceptor::server::wrap(handler.clone(), method, &self.interceptors);
        }
        Ok(Server {
            listener,
            local,
            registry: Arc::new(registry),
            config: self.config,
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
    local: Address,
    registry: Arc<Registry>,
    config: Config,
    shutdown: ShutdownHandle,
    done: watch::Sender<bool>,
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

    /// A handle to shut it down gracefully.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
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
            ..
        } = self;
        let signal = shutdown.signal.clone();
        let mut conns = JoinSet::new();
        let mut listener = Some(listener);
        loop {
            tokio::select! {
                accepted = async { listener.as_ref().map(|l| l.accept()).expect("listener present").await }, if listener.is_some() => {
                    match accepted {
                        Ok(transport) => {
                            conns.spawn(conn::serve(transport, registry.clone(), config.clone(), signal.clone()));
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
