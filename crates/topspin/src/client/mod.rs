//! The client: [`Channel`] (cheap to clone, multiplexes calls over one connection or a small
//! pool) and [`Endpoint`] (where and how to connect).
//!
//! - `endpoint.rs`: the builder; `pool.rs`: the connections and reconnecting;
//! - `resolve.rs`: where the servers of a balanced channel are (static, DNS, any stream);
//!   `balance.rs`: one pool per server and the pick of one per call;
//! - `call.rs`: the one bytes-level call path every call kind uses (start, guard, request
//!   pump, waiting for the answer); this file: the typed call API on top;
//! - `conn.rs`: the client's role in the connection loop (call bookkeeping);
//!   `completion.rs`: the reusable completion a unary caller waits on;
//! - `retry.rs`: retries, hedging, transparent retry and wait-for-ready, a layer over the
//!   call path (each attempt is one `call::begin` plus its answer).
//! - `grpc.rs`: the gRPC client mode (`grpc://`, `grpcs://`): a connection task taking the
//!   same commands and feeding the same sinks over HTTP/2; its wire details are
//!   `crate::grpc::wire`'s, shared with the server's gRPC face.

pub(crate) mod balance;
pub(crate) mod call;
mod completion;
pub(crate) mod conn;
mod endpoint;
mod grpc;
pub(crate) mod pool;
pub mod resolve;
pub mod retry;

pub use balance::{Balancing, Policy};
pub use endpoint::Endpoint;

use crate::codec::Codec;
use crate::compression;
use crate::streaming::{Item, Streaming};
use crate::{Compression, IntoRequest, IntoStreamingRequest, Request, Response, Status};
use bytes::Bytes;
use bytestring::ByteString;
use call::{CallGuard, ClientCredit};
use conn::{CallStart, Cmd, Sink};
use pool::Pool;
use std::sync::Arc;
use std::time::Instant;
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
    inner: Arc<Pool>,
}

/// Feeds a request stream into a call, compressed when the call is.
fn pump<C: Codec, S>(
    codec: C,
    compression: Option<Compression>,
    tx: mpsc::Sender<Cmd>,
    token: u64,
    requests: S,
) where
    S: futures_util::Stream<Item = C::Encode> + Send + Unpin + 'static,
{
    match compression {
        None => call::pump(codec, tx, token, requests),
        Some(c) => call::pump(
            compression::Compressed {
                inner: codec,
                send: Some(c),
                recv: None,
                room: compression::Room::default(),
            },
            tx,
            token,
            requests,
        ),
    }
}

fn decoder<C: Codec>(codec: C) -> Box<dyn FnMut(Bytes) -> Result<C::Decode, Status> + Send> {
    Box::new(move |b| codec.decode(b))
}

impl Channel {
    pub(crate) fn from_pool(pool: Pool) -> Channel {
        Channel {
            inner: Arc::new(pool),
        }
    }

    /// A channel over a pool another owner shares (a balancer's subchannel).
    pub(crate) fn from_shared(inner: Arc<Pool>) -> Channel {
        Channel { inner }
    }

    /// A channel over one connected transport (an in-memory pipe, a TLS stream …), which it
    /// does not replace once it closes. `endpoint` gives the limits and the name used in errors.
    pub(crate) async fn over_transport<T: crate::transport::Transport>(
        transport: T,
        endpoint: Endpoint,
    ) -> Result<Channel, Status> {
        let handle = conn::start(transport, &endpoint.address, &endpoint.config).await?;
        Ok(Channel::from_pool(Pool::fixed(endpoint, handle)))
    }

    /// A channel over one connected byte stream: anything `AsyncRead + AsyncWrite` (a TLS or
    /// SSH stream set up by the application, a serial line, an in-memory pipe). The topspin
    /// handshake runs now; the channel does not reconnect once the stream ends. Default limits:
    /// [`Endpoint::connect_stream`] takes an endpoint's.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use topspin::{Channel, Server};
    /// let server = Server::builder().bind("tcp://127.0.0.1:0").await.unwrap();
    /// let (a, b) = tokio::io::duplex(64 * 1024);
    /// tokio::spawn(server.serve_stream(a));
    /// let channel = Channel::from_stream(b).await.unwrap();
    /// # drop(channel); }
    /// ```
    pub async fn from_stream<S>(stream: S) -> Result<Channel, Status>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        Endpoint::for_stream().connect_stream(stream).await
    }

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

    /// The servers this channel spreads its calls over now: a balanced channel's current
    /// endpoint set (after subsetting; empty before its first use), else its one address.
    pub fn endpoints(&self) -> Vec<crate::Address> {
        self.inner.endpoints()
    }

    /// A call's start from a request: a token, and the deadline running from now.
    fn call_start<T>(
        &self,
        method: ByteString,
        codec: u8,
        request: Request<T>,
    ) -> (CallStart, T, Option<Compression>, bool) {
        let compression = request
            .compression()
            .unwrap_or(self.inner.endpoint.config.compression());
        let wait_for_ready = request.wait_for_ready();
        let (message, mut metadata, timeout) = request.into_parts();
        if let Some(c) = compression {
            metadata = compression::client_metadata(metadata, c);
        }
        let timeout = timeout.or(self.inner.endpoint.default_timeout);
        // A timeout too far away to represent is no deadline at all.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let start = CallStart {
            token: self.inner.token(),
            method,
            codec,
            deadline,
            metadata,
            message: None,
        };
        (start, message, compression, wait_for_ready)
    }

    /// Largest response this channel accepts (also after decompression).
    fn limit(&self) -> usize {
        self.inner.endpoint.config.max_message_size() as usize
    }

    /// What a decompressed response may take: `max_message_size`, charged to the channel's
    /// memory budget.
    fn room(&self) -> compression::Room {
        let config = &self.inner.endpoint.config;
        compression::Room::new(self.limit(), Some(config.memory_budget()))
    }

    /// A call with one request message, encoded.
    fn encoded<C: Codec>(
        &self,
        codec: &C,
        method: ByteString,
        request: Request<C::Encode>,
    ) -> Result<(CallStart, bool), Status> {
        let (mut start, message, compression, ready) = self.call_start(method, C::ID, request);
        let message = codec.encode_payload(message)?;
        start.message = Some(match compression {
            Some(c) => c.encode_payload(message)?,
            None => message,
        });
        Ok((start, ready))
    }

    /// A unary call: one request, one response. Retried or hedged as the endpoint's policy
    /// for the method says ([`Endpoint::retry_policy`]); sent again once if it never left the
    /// client.
    pub async fn unary<C: Codec>(
        &self,
        codec: C,
        method: impl Into<MethodName>,
        request: impl IntoRequest<C::Encode>,
    ) -> Result<Response<C::Decode>, Status> {
        let (start, ready) = self.encoded(&codec, method.into().0, request.into_request())?;
        let pool = &*self.inner;
        let r = match retry::Plan::of(&pool.endpoint.retries, &start.method, ready) {
            // The fast path: one attempt, and one more only if it never left the client.
            None => {
                let copy = retry::again(&start, start.token, 0);
                match retry::unary_attempt(pool, start).await {
                    Err(s) if retry::is_unsent(&s) => {
                        let copy = retry::again(&copy, pool.token(), 0);
                        Box::pin(retry::unary_attempt(pool, copy)).await
                    }
                    r => r,
                }
            }
            Some(plan) => match plan.hedging() {
                Some(h) => Box::pin(retry::hedge(pool, plan, h, start)).await,
                None => {
                    let attempt = |s| retry::unary_attempt(pool, s);
                    Box::pin(retry::run(pool, plan, start, attempt)).await
                }
            },
        };
        let (m, md, tr) = r?.into_parts();
        let m = compression::response_message(&md, m, &self.room())?;
        Ok(Response::from_parts(codec.decode(m)?, md, tr))
    }

    /// Several unary calls to one method, written to the socket together (one write for all
    /// of them when they fit). Results come back in the order of `requests`. Batched calls are
    /// not retried and do not wait for readiness (a batch with interceptors runs its calls one
    /// by one, as [`Channel::unary`] would, retries included).
    pub async fn unary_batch<C: Codec>(
        &self,
        codec: C,
        method: impl Into<MethodName>,
        requests: Vec<Request<C::Encode>>,
    ) -> Vec<Result<Response<C::Decode>, Status>> {
        let method = method.into();
        if crate::interceptor::client::wanted(&self.inner.endpoint.interceptors, method.as_str()) {
            // Interceptors and spans see each call: they start one by one (still concurrently).
            let calls = requests
                .into_iter()
                .map(|r| self.unary(codec.clone(), method.clone(), r));
            return futures_util::future::join_all(calls).await;
        }
        let encoded: Vec<_> = requests
            .into_iter()
            .map(|req| self.encoded(&codec, method.0.clone(), req).map(|(s, _)| s))
            .collect();
        // The batch waits (to connect, for room) no longer than its earliest deadline.
        let deadline = encoded
            .iter()
            .filter_map(|s| s.as_ref().ok().and_then(|s| s.deadline))
            .min();
        let h = match self.inner.pick(deadline).await {
            Ok(h) => h,
            Err(e) => return encoded.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut starts = Vec::with_capacity(encoded.len());
        let mut waits = Vec::with_capacity(encoded.len());
        for start in encoded {
            match start {
                Ok(start) => {
                    let (tx, rx) = self.inner.replies.pair();
                    waits.push(Ok((rx, CallGuard::new(&h, start.token))));
                    starts.push(start.into_start(Sink::Unary(tx)));
                }
                Err(e) => waits.push(Err(e)),
            }
        }
        if let Err(e) = call::queue(&h, Cmd::Batch(starts), deadline).await {
            return waits.into_iter().map(|_| Err(e.clone())).collect();
        }
        let mut out = Vec::with_capacity(waits.len());
        for w in waits {
            out.push(match w {
                Err(e) => Err(e),
                Ok((rx, guard)) => call::reply(&codec, rx, guard, self.room()).await,
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
        let (start, ready) = self.encoded(&codec, method.into().0, request.into_request())?;
        let pool = &*self.inner;
        let plan = retry::Plan::of(&pool.endpoint.retries, &start.method, ready)
            .unwrap_or(retry::Plan::start_only(false));
        // The request is one message: the call can be sent again until the response headers
        // (or the first message) arrive; the stream it returns is not retried.
        let attempt = |s| self.open_stream(codec.clone(), s, ready, |_, _| {});
        retry::run(pool, plan, start, attempt).await
    }

    /// Starts a call whose responses are a stream; `after_start` runs once the call's start is
    /// queued on its connection (a request pump goes there, so it can never overtake it), with
    /// the token of the attempt that started.
    async fn open_stream<C: Codec>(
        &self,
        codec: C,
        start: CallStart,
        wait_for_ready: bool,
        after_start: impl FnOnce(&mpsc::Sender<Cmd>, u64),
    ) -> Result<Response<Streaming<C::Decode>>, Status> {
        let sink = || {
            let (htx, hrx) = oneshot::channel();
            // Flow-controlled: the server sends at most a window ahead of what the stream
            // consumed.
            let (itx, irx) = mpsc::unbounded_channel::<Item>();
            let sink = Sink::Stream {
                headers: Some(htx),
                items: itx,
            };
            (sink, (hrx, irx))
        };
        let (h, guard, (hrx, irx), token) =
            retry::start_call(&self.inner, start, wait_for_ready, sink).await?;
        after_start(&h.tx, token);
        let headers = call::headers(hrx, guard).await?;
        let credit = Box::new(ClientCredit {
            tx: h.tx.clone(),
            token,
        });
        let decode = match compression::encoding_of(&headers)? {
            None => decoder(codec),
            Some(e) => decoder(compression::Compressed {
                inner: codec,
                send: None,
                recv: Some(e),
                room: self.room(),
            }),
        };
        let stream = Streaming::new(irx, decode, credit);
        Ok(Response::from_parts(stream, headers, Metadata::new()))
    }

    /// A client-streaming call: a stream of requests, one response. `request` is a stream of
    /// messages or a [`Request`] around one (for metadata or a timeout).
    ///
    /// ```no_run
    /// # async fn f(channel: topspin::Channel) -> Result<(), topspin::Status> {
    /// use bytes::Bytes;
    /// use futures_util::stream;
    /// use topspin::{codec::RawCodec, Request};
    /// let parts = [Bytes::from_static(b"a"), Bytes::from_static(b"b")];
    /// let all = channel.client_streaming(RawCodec, "/t.S/Concat", stream::iter(parts.clone())).await?;
    /// let all = channel.client_streaming(RawCodec, "/t.S/Concat", Request::new(stream::iter(parts))).await?;
    /// # Ok(()) }
    /// ```
    pub async fn client_streaming<C, R>(
        &self,
        codec: C,
        method: impl Into<MethodName>,
        request: R,
    ) -> Result<Response<C::Decode>, Status>
    where
        C: Codec,
        R: IntoStreamingRequest<Message = C::Encode>,
    {
        let request = request.into_streaming_request();
        let (start, requests, compression, ready) =
            self.call_start(method.into().0, C::ID, request);
        let replies = &self.inner.replies;
        let sink = || {
            let (tx, rx) = replies.pair();
            (Sink::Unary(tx), rx)
        };
        // Only a start that never left the client is sent again: the request stream is
        // consumed as it goes out and cannot be replayed.
        let (h, guard, rx, token) = retry::start_call(&self.inner, start, ready, sink).await?;
        pump(
            codec.clone(),
            compression,
            h.tx.clone(),
            token,
            Box::pin(requests),
        );
        call::reply(&codec, rx, guard, self.room()).await
    }

    /// A bidirectional streaming call. Returns once the response headers (or the first
    /// message, or the end) arrive; requests are sent as the stream yields them. `request` is
    /// a stream of messages or a [`Request`] around one.
    pub async fn streaming<C, R>(
        &self,
        codec: C,
        method: impl Into<MethodName>,
        request: R,
    ) -> Result<Response<Streaming<C::Decode>>, Status>
    where
        C: Codec,
        R: IntoStreamingRequest<Message = C::Encode>,
    {
        let request = request.into_streaming_request();
        let (start, requests, compression, ready) =
            self.call_start(method.into().0, C::ID, request);
        // The request pump runs before the headers arrive: a server may wait for a first
        // request before it answers anything. Only a start that never left the client is
        // sent again (the request stream cannot be replayed).
        let pump_codec = codec.clone();
        self.open_stream(codec, start, ready, move |tx, token| {
            pump(
                pump_codec,
                compression,
                tx.clone(),
                token,
                Box::pin(requests),
            )
        })
        .await
    }
}
