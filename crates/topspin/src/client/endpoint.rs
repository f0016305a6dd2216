//! [`Endpoint`]: where and how a [`Channel`] connects.

use super::Channel;
use crate::interceptor::{AsyncInterceptor, Chain, Interceptor, Layer};
use crate::{Address, Config, Status};
use std::sync::Arc;
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
}

impl Endpoint {
    /// An endpoint for an address (`tcp://host:port`, `unix:///path`).
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
        })
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
        self.interceptors = self
            .interceptors
            .push(None, Layer::Sync(Arc::new(interceptor)));
        self
    }

    /// Adds an interceptor run on the calls of one service only: the methods whose name
    /// starts with `prefix`, e.g. `/kv.Store/`.
    pub fn service_interceptor(mut self, prefix: &str, interceptor: impl Interceptor) -> Endpoint {
        self.interceptors = self
            .interceptors
            .push(Some(prefix), Layer::Sync(Arc::new(interceptor)));
        self
    }

    /// Adds an interceptor that may wait before a call is sent (its future is boxed).
    pub fn async_interceptor(mut self, interceptor: impl AsyncInterceptor) -> Endpoint {
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
    ) -> Endpoint {
        self.interceptors = self
            .interceptors
            .push(Some(prefix), Layer::Async(Arc::new(interceptor)));
        self
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
    pub fn connect_lazy(self) -> Channel {
        Channel::from_pool(super::pool::Pool::new(self))
    }
}
