//! [`Endpoint`]: where and how a [`Channel`] connects.

use super::retry::{HedgingPolicy, Policy, Retries, RetryBudget, RetryPolicy};
use super::Channel;
use crate::interceptor::{AsyncInterceptor, Chain, Interceptor};
use crate::transport::{Dial, Layers, Start, Transport};
use crate::{Address, Config, Status};
use std::time::Duration;

/// Where and how a [`Channel`] connects: address, limits, pool size and reconnect backoff.
///
/// ```no_run
/// # async fn f() -> Result<(), topspin::Status> {
/// use std::time::Duration;
/// use topspin::Endpoint;
/// let channel = Endpoint::new("tcp://127.0.0.1:50051")?
///     .connections(2)
///     .timeout(Duration::from_secs(5))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub(crate) address: Address,
    pub(super) config: Config,
    pub(super) connections: usize,
    pub(super) default_timeout: Option<Duration>,
    pub(super) backoff_initial: Duration,
    pub(super) backoff_max: Duration,
    /// Interceptors of every call, in registration order (outer to inner).
    pub(crate) interceptors: Chain,
    /// TLS and WebSocket settings of `tls://`, `ws://`, `wss://` and `grpcs://` addresses.
    pub(super) layers: Layers,
    /// Retry and hedging policies and the retry budget (`None`: no method is retried).
    pub(crate) retries: Option<std::sync::Arc<Retries>>,
    /// How calls are spread over many endpoints (used when there are several).
    pub(super) balancing: super::balance::Balancing,
    /// Where the endpoints come from, for a balanced channel (`dns:///` gets its own).
    pub(super) resolver: Option<super::balance::SharedResolver>,
}

impl Endpoint {
    /// An endpoint for an address (`tcp://host:port`, `unix:///path`, … see [`Address`]).
    /// `grpc://host:port` and `grpcs://host:port` call an existing gRPC server (tonic,
    /// grpc-go, grpcio, …) over HTTP/2 instead of speaking the topspin protocol: every call
    /// kind, deadlines (`grpc-timeout`), metadata, status details, compression and
    /// cancellation work as with a topspin server.
    pub fn new(address: impl crate::IntoAddress) -> Result<Endpoint, Status> {
        let address = address
            .into_address()
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Endpoint {
            address,
            config: Config::default(),
            connections: 1,
            default_timeout: None,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            interceptors: Chain::default(),
            layers: Layers::default(),
            retries: None,
            balancing: super::balance::Balancing::default(),
            resolver: None,
        })
    }

    /// An endpoint balancing its channel's calls over a fixed list of servers (each with its
    /// own pool of [`connections`](Endpoint::connections)); see [`Balancing`](crate::Balancing)
    /// for how. Settings made on the returned endpoint (limits, TLS, interceptors) apply to
    /// every server. `dns:///host:port` addresses take every server of a name instead, and
    /// [`Endpoint::with_resolver`] any source of endpoint sets.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), topspin::Status> {
    /// use topspin::{Balancing, Endpoint};
    /// let channel = Endpoint::balanced(["tcp://10.0.0.1:50051", "tcp://10.0.0.2:50051"])?
    ///     .balancing(Balancing::round_robin())
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn balanced<A: crate::IntoAddress>(
        addresses: impl IntoIterator<Item = A>,
    ) -> Result<Endpoint, Status> {
        let addresses = addresses
            .into_iter()
            .map(|a| a.into_address())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        if let Some(dns) = addresses.iter().find(|a| matches!(a, Address::Dns(_))) {
            return Err(Status::invalid_argument(format!(
                "{dns} in a static list: pass it to Endpoint::new alone"
            )));
        }
        let first = addresses.first().cloned().ok_or_else(|| {
            Status::invalid_argument("Endpoint::balanced needs at least one address")
        })?;
        let mut e = Endpoint::new(first)?;
        e.resolver = Some(super::balance::SharedResolver::new(
            super::resolve::StaticResolver::new(addresses),
        ));
        Ok(e)
    }

    /// An endpoint whose servers come from `resolver`: a stream of endpoint sets (a
    /// Kubernetes endpoints watch, Consul, xDS; see [`resolve`](crate::resolve)). Calls are
    /// balanced over the current set; servers added or removed change the channel's
    /// subchannels without disturbing calls in flight on the others.
    pub fn with_resolver(resolver: impl super::resolve::Resolver) -> Endpoint {
        let mut e = Endpoint::new(Address::Unix("(resolver)".into())).expect("a valid address");
        e.resolver = Some(super::balance::SharedResolver::new(resolver));
        e
    }

    /// How calls are spread over the servers of a balanced endpoint (default
    /// [`Balancing::default`](crate::Balancing::default): least outstanding calls of two
    /// random choices, passive ejection, no health checks, no subsetting). No effect on an
    /// endpoint of one address.
    pub fn balancing(mut self, balancing: super::balance::Balancing) -> Endpoint {
        self.balancing = balancing;
        self
    }

    /// The endpoint of [`Channel::from_stream`]: default settings, named `stream` in errors.
    pub(crate) fn for_stream() -> Endpoint {
        let mut e = Endpoint::new(Address::Unix("(stream)".into())).expect("a valid address");
        e.connections = 1;
        e
    }

    /// A channel over one connected byte stream (anything `AsyncRead + AsyncWrite`) with this
    /// endpoint's limits; its address only names the peer in errors. The handshake runs now;
    /// the channel does not reconnect once the stream ends (see [`Channel::from_stream`]).
    pub async fn connect_stream<S>(self, stream: S) -> Result<Channel, Status>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let transport =
            crate::transport::stream::StreamTransport::new(stream, crate::PeerAddr::Stream);
        Channel::over_transport(transport, self).await
    }

    /// Limits and timeouts of the client side (see [`Config`]).
    pub fn config(mut self, config: Config) -> Endpoint {
        self.config = config;
        self
    }

    /// Largest response message accepted (default 64 MiB).
    pub fn max_message_size(mut self, bytes: u32) -> Endpoint {
        self.config = self.config.with_max_message_size(bytes);
        self
    }

    /// Number of connections calls are spread over, round robin (default 1).
    pub fn connections(mut self, n: usize) -> Endpoint {
        self.connections = n.max(1);
        self
    }

    /// Timeout applied to calls whose request sets none.
    pub fn timeout(mut self, timeout: Duration) -> Endpoint {
        self.default_timeout = Some(timeout);
        self
    }

    /// Reconnect backoff after a failed connection attempt: starts at `initial`, grows ×1.6 per
    /// failure up to `max`, each delay jittered by ±20% (defaults 100 ms and 10 s).
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Endpoint {
        self.backoff_initial = initial;
        self.backoff_max = max.max(initial);
        self
    }

    /// Adds an interceptor run on every call of the channel (after those added before it:
    /// registration order is outer to inner). See [`crate::interceptor`].
    ///
    /// ```
    /// use topspin::interceptor::{from_fn, CallInfo};
    /// use topspin::{Endpoint, Status};
    /// let endpoint = Endpoint::new("tcp://127.0.0.1:50051")?
    ///     .interceptor(from_fn(|call: &mut CallInfo| {
    ///         call.append_metadata("authorization", b"Bearer s3cret")
    ///             .map_err(|e| Status::internal(e.to_string()))
    ///     }));
    /// # Ok::<(), Status>(())
    /// ```
    pub fn interceptor(mut self, interceptor: impl Interceptor) -> Endpoint {
        self.interceptors = self.interceptors.with_sync(None, interceptor);
        self
    }

    /// Adds an interceptor run on the calls of one service only: the methods whose name
    /// starts with `prefix`, e.g. `/kv.Store/`.
    pub fn service_interceptor(mut self, prefix: &str, interceptor: impl Interceptor) -> Endpoint {
        self.interceptors = self.interceptors.with_sync(Some(prefix), interceptor);
        self
    }

    /// Adds an interceptor that may wait before a call is sent (its future is boxed).
    pub fn async_interceptor(mut self, interceptor: impl AsyncInterceptor) -> Endpoint {
        self.interceptors = self.interceptors.with_async(None, interceptor);
        self
    }

    /// Adds an asynchronous interceptor for the methods whose name starts with `prefix`.
    pub fn service_async_interceptor(
        mut self,
        prefix: &str,
        interceptor: impl AsyncInterceptor,
    ) -> Endpoint {
        self.interceptors = self.interceptors.with_async(Some(prefix), interceptor);
        self
    }

    /// Retries the calls of `methods` that fail with one of the policy's codes (see
    /// [`RetryPolicy`] and `docs/deploying.md`). `methods` is a full method name
    /// (`/kv.Store/Get`), a service (`/kv.Store/`) or `""` for every method; the most specific
    /// setting applies. A policy is the application's word that the methods are safe to run
    /// more than once: methods no policy covers are never retried (but see transparent retry,
    /// [`crate::retry`]). Unary and server-streaming calls are retried until the first
    /// response arrives; client-streaming and bidirectional calls are not (their request
    /// stream is consumed as it is sent and cannot be replayed).
    ///
    /// ```
    /// use topspin::{Endpoint, RetryBudget, RetryPolicy};
    /// let endpoint = Endpoint::new("tcp://127.0.0.1:50051")?
    ///     .retry_policy("/kv.Store/", RetryPolicy::default())
    ///     .no_retry("/kv.Store/Increment")
    ///     .retry_budget(RetryBudget::default());
    /// # Ok::<(), topspin::Status>(())
    /// ```
    pub fn retry_policy(mut self, methods: &str, policy: RetryPolicy) -> Endpoint {
        self.retries = Some(Retries::with_rule(
            self.retries,
            methods,
            Policy::Retry(policy),
        ));
        self
    }

    /// Hedges the unary calls of `methods` (which must be idempotent: several attempts may
    /// run on servers at once). See [`HedgingPolicy`]; `methods` as for
    /// [`Endpoint::retry_policy`].
    pub fn hedging_policy(mut self, methods: &str, policy: HedgingPolicy) -> Endpoint {
        self.retries = Some(Retries::with_rule(
            self.retries,
            methods,
            Policy::Hedge(policy),
        ));
        self
    }

    /// Never retries nor hedges `methods` (not safe to repeat), whatever a broader policy
    /// says. A call that never left the client is still sent again once (the server never saw
    /// it).
    pub fn no_retry(mut self, methods: &str) -> Endpoint {
        self.retries = Some(Retries::with_rule(self.retries, methods, Policy::Never));
        self
    }

    /// The budget of retries and hedges of each channel made from this endpoint (default
    /// [`RetryBudget::default`]: 20% of recent calls plus 10 per second).
    pub fn retry_budget(mut self, budget: RetryBudget) -> Endpoint {
        self.retries = Some(Retries::with_budget(self.retries, budget));
        self
    }

    /// TLS settings for `tls://`, `wss://` and `grpcs://` addresses: the CA to trust, a client
    /// certificate for mutual TLS, a server-name override (default: the webpki roots, the
    /// address's host).
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: crate::tls::ClientTls) -> Endpoint {
        self.layers.tls = Some(tls);
        self
    }

    /// WebSocket settings for `ws://` and `wss://` addresses.
    #[cfg(feature = "websocket")]
    pub fn websocket(mut self, settings: crate::ws::WebSocketSettings) -> Endpoint {
        self.layers.websocket = settings;
        self
    }

    /// Opens one connection: the dial of the address's transport (TCP or Unix on the socket
    /// fast path; shared memory over its rings; TLS and WebSocket as byte streams; gRPC over
    /// HTTP/2), within the handshake timeout, then the connection's own handshake.
    pub(super) async fn connect_one(&self) -> Result<super::conn::ConnHandle, Status> {
        let dial = Dial {
            address: &self.address,
            config: &self.config,
            layers: &self.layers,
        };
        let start = Starting {
            address: &self.address,
            config: &self.config,
        };
        crate::transport::dial(&dial, start).await
    }

    /// The address.
    pub fn address(&self) -> &Address {
        &self.address
    }

    /// Connects now (every pooled connection) and returns the channel.
    pub async fn connect(self) -> Result<Channel, Status> {
        let channel = self.connect_lazy();
        channel.inner.connect_all().await?;
        Ok(channel)
    }

    /// A channel that connects on its first call.
    pub fn connect_lazy(mut self) -> Channel {
        // Each channel gets a budget of its own.
        self.retries = self.retries.map(|r| std::sync::Arc::new((*r).clone()));
        Channel::from_pool(super::balance::pool_for(self))
    }
}

/// The client's faces for a dialled connection: the native engine or the gRPC client mode.
struct Starting<'a> {
    address: &'a Address,
    config: &'a Config,
}

impl Start for Starting<'_> {
    type Conn = super::conn::ConnHandle;

    fn native<T: Transport>(
        self,
        transport: T,
    ) -> impl std::future::Future<Output = Result<Self::Conn, Status>> + Send {
        super::conn::start(transport, self.address, self.config)
    }

    fn grpc<S>(
        self,
        io: S,
        scheme: http::uri::Scheme,
    ) -> impl std::future::Future<Output = Result<Self::Conn, Status>> + Send
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        super::grpc::start(io, self.address, self.config, scheme)
    }
}
