//! The client: [`Channel`] (cheap to clone, multiplexes calls over one connection or a small
//! pool) and [`Endpoint`] (where and how to connect).

mod completion;
mod driver;

use crate::codec::Codec;
use crate::streaming::{CreditReturn, Item, Streaming};
use crate::{Address, Config, IntoRequest, Request, Response, Status};
use bytes::Bytes;
use bytestring::ByteString;
use driver::{Cmd, ConnShared, Sink, Start};
use futures_util::{Stream, StreamExt};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use topspin_proto::Metadata;

/// A method's full name, e.g. `/kv.Store/Get`. Built from a `&'static str` without a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MethodName(ByteString);

impl From<&'static str> for MethodName {
    fn from(s: &'static str) -> MethodName {
        MethodName(ByteString::from_static(s))
    }
}

impl From<String> for MethodName {
    fn from(s: String) -> MethodName {
        MethodName(ByteString::from(s))
    }
}

impl MethodName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

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
    address: Address,
    config: Config,
    connections: usize,
    default_timeout: Option<Duration>,
    backoff_initial: Duration,
    backoff_max: Duration,
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
        })
    }

    /// Limits and timeouts of the client side (see [`Config`]).
    pub fn config(mut self, config: Config) -> Endpoint {
        self.config = config;
        self
    }

    /// Largest response message accepted (default 64 MiB).
    pub fn max_message_size(mut self, bytes: u32) -> Endpoint {
        self.config.max_message_size = bytes;
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

    /// The address.
    pub fn address(&self) -> &Address {
        &self.address
    }

    /// Connects now (every pooled connection) and returns the channel.
    pub async fn connect(self) -> Result<Channel, Status> {
        let channel = self.connect_lazy();
        for slot in 0..channel.inner.slots.len() {
            channel.inner.conn(slot).await?;
        }
        Ok(channel)
    }

    /// A channel that connects on its first call.
    pub fn connect_lazy(self) -> Channel {
        let slots = (0..self.connections).map(|_| Slot::default()).collect();
        Channel {
            inner: Arc::new(Inner {
                endpoint: self,
                slots,
                next: AtomicUsize::new(0),
                token: AtomicU64::new(1),
                replies: Arc::default(),
            }),
        }
    }
}

#[derive(Clone, Debug)]
struct ConnHandle {
    tx: mpsc::UnboundedSender<Cmd>,
    shared: Arc<ConnShared>,
}

impl ConnHandle {
    fn usable(&self) -> bool {
        !self.tx.is_closed() && !self.shared.unusable.load(Ordering::Acquire)
    }
}

#[derive(Debug, Default)]
struct SlotState {
    handle: Option<ConnHandle>,
    failures: u32,
    retry_at: Option<Instant>,
    last_error: Option<Status>,
}

#[derive(Debug, Default)]
struct Slot {
    state: Mutex<SlotState>,
    connecting: tokio::sync::Mutex<()>,
}

type Replies = completion::Pool<Result<Response<Bytes>, Status>>;

#[derive(Debug)]
struct Inner {
    endpoint: Endpoint,
    slots: Vec<Slot>,
    next: AtomicUsize,
    token: AtomicU64,
    /// Reused completions of unary-response calls.
    replies: Arc<Replies>,
}

impl Inner {
    fn cached(&self, slot: usize) -> Option<ConnHandle> {
        let st = self.slots[slot]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        st.handle.as_ref().filter(|h| h.usable()).cloned()
    }

    /// The slot's live connection, (re)connecting if needed, with backoff after failures.
    async fn conn(&self, slot: usize) -> Result<ConnHandle, Status> {
        if let Some(h) = self.cached(slot) {
            return Ok(h);
        }
        let _guard = self.slots[slot].connecting.lock().await;
        if let Some(h) = self.cached(slot) {
            return Ok(h);
        }
        {
            let st = self.slots[slot]
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let (Some(at), Some(err)) = (st.retry_at, &st.last_error) {
                let now = Instant::now();
                if now < at {
                    return Err(Status::unavailable(format!(
                        "{}; next connection attempt in {:?}",
                        err.message(),
                        at - now
                    )));
                }
            }
        }
        let ep = &self.endpoint;
        let r = driver::connect(&ep.address, &ep.config).await;
        let mut st = self.slots[slot]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match r {
            Ok((tx, shared)) => {
                let h = ConnHandle { tx, shared };
                st.handle = Some(h.clone());
                st.failures = 0;
                st.retry_at = None;
                st.last_error = None;
                Ok(h)
            }
            Err(status) => {
                st.handle = None;
                st.failures += 1;
                let base = ep.backoff_initial.as_secs_f64() * 1.6f64.powi(st.failures as i32 - 1);
                let capped = base.min(ep.backoff_max.as_secs_f64());
                let jittered = capped * (0.8 + 0.4 * fastrand::f64());
                st.retry_at = Some(Instant::now() + Duration::from_secs_f64(jittered));
                st.last_error = Some(status.clone());
                Err(status)
            }
        }
    }

    async fn pick(&self) -> Result<ConnHandle, Status> {
        let n = self.slots.len();
        let slot = if n == 1 {
            0
        } else {
            self.next.fetch_add(1, Ordering::Relaxed) % n
        };
        if let Some(h) = self.cached(slot) {
            return Ok(h);
        }
        // (Re)connecting is rare and its future is large: boxed, it stays out of every call's
        // future (which would otherwise be over a kilobyte, copied wherever calls are queued).
        Box::pin(self.conn(slot)).await
    }
}

/// A client connection to one server address: cheap to clone; all clones share the
/// connection (or pool) and multiplex their calls over it.
///
/// If the connection drops, calls in flight fail with `UNAVAILABLE` saying why, and the next
/// call reconnects (with exponential backoff and jitter after failed attempts). Dropping a
/// call's future cancels the call; the server's handler sees it promptly.
///
/// ```no_run
/// # async fn f() -> Result<(), topspin::Status> {
/// use bytes::Bytes;
/// use topspin::{codec::RawCodec, Channel, Request};
/// let channel = Channel::connect("tcp://127.0.0.1:50051").await?;
/// let reply = channel
///     .unary(RawCodec, "/echo.Echo/Echo", Request::new(Bytes::from_static(b"ping")))
///     .await?;
/// assert_eq!(reply.into_inner(), Bytes::from_static(b"ping"));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Channel {
    inner: Arc<Inner>,
}

/// Cancels a call when its future or stream is dropped before the end.
struct CallGuard {
    tx: Option<mpsc::UnboundedSender<Cmd>>,
    token: u64,
}

impl CallGuard {
    fn disarm(&mut self) {
        self.tx = None;
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Cmd::Cancel { token: self.token });
        }
    }
}

struct ClientCredit {
    tx: mpsc::UnboundedSender<Cmd>,
    token: u64,
}

impl CreditReturn for ClientCredit {
    fn give_back(&self, credit: u32) {
        let _ = self.tx.send(Cmd::Credit {
            token: self.token,
            bytes: credit,
        });
    }
    fn abandon(&self) {
        let _ = self.tx.send(Cmd::Cancel { token: self.token });
    }
}

/// Waits for a call's one response and decodes it; the call is no longer cancelled on drop once
/// its answer has arrived.
async fn reply<C: Codec>(
    codec: &C,
    rx: completion::Waiter<Result<Response<Bytes>, Status>>,
    mut guard: CallGuard,
) -> Result<Response<C::Decode>, Status> {
    let r = rx.await;
    guard.disarm();
    let resp = r.ok_or_else(|| Status::unavailable("the connection task ended"))??;
    let (m, md, tr) = resp.into_parts();
    Ok(Response::from_parts(codec.decode(m)?, md, tr))
}

fn decoder<C: Codec>(codec: C) -> Box<dyn FnMut(Bytes) -> Result<C::Decode, Status> + Send> {
    Box::new(move |b| codec.decode(b))
}

impl Channel {
    /// Connects to an address with default settings.
    pub async fn connect(address: impl crate::IntoAddress) -> Result<Channel, Status> {
        Endpoint::new(address)?.connect().await
    }

    /// A channel that connects on its first call.
    pub fn lazy(address: impl crate::IntoAddress) -> Result<Channel, Status> {
        Ok(Endpoint::new(address)?.connect_lazy())
    }

    /// The endpoint this channel connects to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.endpoint
    }

    fn start_parts<T>(&self, request: Request<T>) -> (u64, T, Metadata, Option<Duration>) {
        let (message, metadata, timeout) = request.into_parts();
        let token = self.inner.token.fetch_add(1, Ordering::Relaxed);
        (
            token,
            message,
            metadata,
            timeout.or(self.inner.endpoint.default_timeout),
        )
    }

    /// A unary call: one request, one response.
    pub async fn unary<C: Codec>(
        &self,
        codec: C,
        method: impl Into<MethodName>,
        request: impl IntoRequest<C::Encode>,
    ) -> Result<Response<C::Decode>, Status> {
        let (token, message, metadata, timeout) = self.start_parts(request.into_request());
        let message = codec.encode(message)?;
        let h = self.inner.pick().await?;
        let (tx, rx) = self.inner.replies.pair();
        let start = Start {
            token,
            method: method.into().0,
            codec: C::ID,
            timeout,
            metadata,
            message: Some(message),
            sink: Sink::Unary(tx),
        };
        let guard = CallGuard {
            tx: Some(h.tx.clone()),
            token,
        };
        h.tx.send(Cmd::Start(start)).map_err(|_| {
            Status::unavailable("the connection closed; the call was not sent and is safe to retry")
        })?;
        reply(&codec, rx, guard).await
    }

    /// Several unary calls to one method, written to the socket together (one write for all
    /// of them when they fit). Results come back in the order of `requests`.
    pub async fn unary_batch<C: Codec>(
        &self,
        codec: C,
        method: impl Into<MethodName>,
        requests: Vec<Request<C::Encode>>,
    ) -> Vec<Result<Response<C::Decode>, Status>> {
        let method = method.into();
        let h = match self.inner.pick().await {
            Ok(h) => h,
            Err(e) => return requests.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut starts = Vec::with_capacity(requests.len());
        let mut waits = Vec::with_capacity(requests.len());
        for req in requests {
            let (token, message, metadata, timeout) = self.start_parts(req);
            let (tx, rx) = self.inner.replies.pair();
            match codec.encode(message) {
                Ok(message) => {
                    starts.push(Start {
                        token,
                        method: method.0.clone(),
                        codec: C::ID,
                        timeout,
                        metadata,
                        message: Some(message),
                        sink: Sink::Unary(tx),
                    });
                    waits.push(Ok((
                        rx,
                        CallGuard {
                            tx: Some(h.tx.clone()),
                            token,
                        },
                    )));
                }
                Err(e) => waits.push(Err(e)),
            }
        }
        if h.tx.send(Cmd::Batch(starts)).is_err() {
            return waits
                .into_iter()
                .map(|_| {
                    Err(Status::unavailable(
                        "the connection closed; the calls were not sent",
                    ))
                })
                .collect();
        }
        let mut out = Vec::with_capacity(waits.len());
        for w in waits {
            out.push(match w {
                Err(e) => Err(e),
                Ok((rx, guard)) => reply(&codec, rx, guard).await,
            });
        }
        out
    }

    /// A server-streaming call: one request, a stream of responses. Returns once the
    /// response headers (or the first message, or the end) arrive.
    pub async fn server_streaming<C: Codec>(
        &self,
        codec: C,
        method: impl Into<MethodName>,
        request: impl IntoRequest<C::Encode>,
    ) -> Result<Response<Streaming<C::Decode>>, Status> {
        let (token, message, metadata, timeout) = self.start_parts(request.into_request());
        let message = codec.encode(message)?;
        self.open_stream(
            codec,
            method.into(),
            token,
            metadata,
            timeout,
            Some(message),
            |_| {},
        )
        .await
    }

    /// Starts a call whose responses are a stream; `after_start` runs once the call's start is
    /// queued on its connection (a request pump goes there, so it can never overtake it).
    #[allow(clippy::too_many_arguments)]
    async fn open_stream<C: Codec>(
        &self,
        codec: C,
        method: MethodName,
        token: u64,
        metadata: Metadata,
        timeout: Option<Duration>,
        message: Option<Bytes>,
        after_start: impl FnOnce(&mpsc::UnboundedSender<Cmd>),
    ) -> Result<Response<Streaming<C::Decode>>, Status> {
        let h = self.inner.pick().await?;
        let (htx, hrx) = oneshot::channel();
        let (itx, irx) = mpsc::unbounded_channel::<Item>();
        let start = Start {
            token,
            method: method.0,
            codec: C::ID,
            timeout,
            metadata,
            message,
            sink: Sink::Stream {
                headers: Some(htx),
                items: itx,
            },
        };
        let mut guard = CallGuard {
            tx: Some(h.tx.clone()),
            token,
        };
        h.tx.send(Cmd::Start(start)).map_err(|_| {
            Status::unavailable("the connection closed; the call was not sent and is safe to retry")
        })?;
        after_start(&h.tx);
        let headers = hrx
            .await
            .map_err(|_| Status::unavailable("the connection task ended"))??;
        guard.disarm();
        let stream = Streaming::new(
            irx,
            decoder(codec),
            Box::new(ClientCredit {
                tx: h.tx.clone(),
                token,
            }),
        );
        Ok(Response::from_parts(stream, headers, Metadata::new()))
    }

    /// Feeds a request stream into a call, waiting for flow-control credit before each message.
    fn pump<C: Codec, S>(codec: C, tx: mpsc::UnboundedSender<Cmd>, token: u64, mut requests: S)
    where
        S: Stream<Item = C::Encode> + Send + Unpin + 'static,
    {
        tokio::spawn(async move {
            while let Some(item) = requests.next().await {
                let message = match codec.encode(item) {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(
                            "request stream item failed to encode: {e}; cancelling the call"
                        );
                        let _ = tx.send(Cmd::Cancel { token });
                        return;
                    }
                };
                let (ack, done) = oneshot::channel();
                if tx
                    .send(Cmd::Send {
                        token,
                        message,
                        ack,
                    })
                    .is_err()
                {
                    return;
                }
                match done.await {
                    Ok(Ok(())) => {}
                    _ => return, // the call is over
                }
            }
            let _ = tx.send(Cmd::HalfClose { token });
        });
    }

    /// A client-streaming call: a stream of requests, one response.
    pub async fn client_streaming<C, S>(
        &self,
        codec: C,
        method: impl Into<MethodName>,
        request: Request<S>,
    ) -> Result<Response<C::Decode>, Status>
    where
        C: Codec,
        S: Stream<Item = C::Encode> + Send + 'static,
    {
        let (token, requests, metadata, timeout) = self.start_parts(request);
        let h = self.inner.pick().await?;
        let (tx, rx) = self.inner.replies.pair();
        let start = Start {
            token,
            method: method.into().0,
            codec: C::ID,
            timeout,
            metadata,
            message: None,
            sink: Sink::Unary(tx),
        };
        let guard = CallGuard {
            tx: Some(h.tx.clone()),
            token,
        };
        h.tx.send(Cmd::Start(start)).map_err(|_| {
            Status::unavailable("the connection closed; the call was not sent and is safe to retry")
        })?;
        Self::pump(codec.clone(), h.tx.clone(), token, Box::pin(requests));
        reply(&codec, rx, guard).await
    }

    /// A bidirectional streaming call. Returns once the response headers (or the first
    /// message, or the end) arrive; requests are sent as the stream yields them.
    pub async fn streaming<C, S>(
        &self,
        codec: C,
        method: impl Into<MethodName>,
        request: Request<S>,
    ) -> Result<Response<Streaming<C::Decode>>, Status>
    where
        C: Codec,
        S: Stream<Item = C::Encode> + Send + 'static,
    {
        let (token, requests, metadata, timeout) = self.start_parts(request);
        // The request pump runs before the headers arrive: a server may wait for a first
        // request before it answers anything.
        let pump_codec = codec.clone();
        self.open_stream(
            codec,
            method.into(),
            token,
            metadata,
            timeout,
            None,
            move |tx| Self::pump(pump_codec, tx.clone(), token, Box::pin(requests)),
        )
        .await
    }
}
