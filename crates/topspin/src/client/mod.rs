//! The client: [`Channel`] (cheap to clone, multiplexes calls over one connection or a small
//! pool) and [`Endpoint`] (where and how to connect).
//!
//! - `endpoint.rs`: the builder; `pool.rs`: the connections and reconnecting;
//! - `resolve.rs`: where the servers of a balanced channel are (static, DNS, any stream);
//!   `balance.rs`: one pool per server and the pick of one per call;
//! - `call.rs`: the one bytes-level call path every call kind uses (start, guard, request
//!   pump, waiting for the answer); this file: the typed call API on top;
//! - `conn.rs`: the client's role in the connection loop (call bookkeeping); `conn/outcome.rs`:
//!   one call's outcome and its delivery rules, for both modes;
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
use crate::streaming::{CreditReturn, Decoder, Item, Opened, Opening, Streaming};
use crate::{Compression, IntoRequest, IntoStreamingRequest, Request, Response, Status};
use bytestring::ByteString;
use call::{CallGuard, ClientCredit};
use conn::{CallStart, Cmd, ConnHandle, Sink};
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

/// Feeds a request stream into a call, compressed when the call is (message by message
/// while its `switch` is on, if it has one).
fn pump<C: Codec, S>(
    codec: C,
    compression: Option<Compression>,
    switch: Option<compression::MessageCompression>,
    tx: mpsc::Sender<Cmd>,
    token: u64,
    requests: S,
) where
    S: futures_util::Stream<Item = C::Encode> + Send + Unpin + 'static,
{
    let Some(c) = compression else {
        return call::pump(codec, tx, token, requests);
    };
    let inner = compression::Compressed {
        send: Some(c),
        ..compression::Compressed::plain(codec)
    };
    match switch {
        None => call::pump(inner, tx, token, requests),
        Some(switch) => call::pump(compression::Switched { inner, switch }, tx, token, requests),
    }
}

fn decoder<C: Codec>(codec: C) -> Decoder<C::Decode> {
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
        let m = compression::response_message(&md, m, || self.room())?;
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
        if call::observed_wanted(&self.inner.endpoint.interceptors, method.as_str()) {
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
                Ok((rx, guard)) => call::reply(&codec, rx, guard, || self.room()).await,
            });
        }
        out
    }

    /// A server-streaming call: one request, a stream of responses. Returns as soon as the
    /// call is started (queued on its connection), without waiting for the server: a server
    /// may answer only when it has something to send (a quiet subscription). The response
    /// headers come with the stream's first item: [`Streaming::headers`]; the
    /// [`Response`]'s own metadata is empty. A failure before any response (a status from the
    /// server, a lost connection) is the stream's first item.
    ///
    /// Retries: until the response headers (or the first message, or the end) arrive, a
    /// failed call is sent again as the endpoint's policy for the method says (its request is
    /// one message) — while the caller waits for the stream's first item; once they have, the
    /// stream is not retried.
    ///
    /// ```no_run
    /// # async fn f(channel: topspin::Channel) -> Result<(), topspin::Status> {
    /// use bytes::Bytes;
    /// use topspin::codec::RawCodec;
    /// let mut events = channel
    ///     .server_streaming(RawCodec, "/feed.Feed/Subscribe", Bytes::from("prices"))
    ///     .await?
    ///     .into_inner();
    /// while let Some(event) = events.message().await? {
    ///     println!("{event:?}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn server_streaming<C: Codec>(
        &self,
        codec: C,
        method: impl Into<MethodName>,
        request: impl IntoRequest<C::Encode>,
    ) -> Result<Response<Streaming<C::Decode>>, Status> {
        let (start, ready) = self.encoded(&codec, method.into().0, request.into_request())?;
        let pool = &*self.inner;
        let plan = stream_plan(pool, &start, ready);
        plan.deposit();
        let mut tries = retry::Tries::default();
        let first = Some(start.token);
        let attempt = |s| stream_attempt(pool, s);
        let (begun, mut guard) =
            retry::run_from(pool, plan, &start, &mut tries, first, attempt).await?;
        // From here the stream cancels the call if it is dropped.
        guard.disarm();
        let again = Again {
            pool: self.inner.clone(),
            start,
            tries,
            ready,
        };
        let opening = opening(codec, self.room(), begun.headers, Some(again));
        Ok(stream_response(&begun.h, begun.token, begun.items, opening))
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
        let switch = request.message_compression();
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
            switch,
            h.tx.clone(),
            token,
            Box::pin(requests),
        );
        call::reply(&codec, rx, guard, || self.room()).await
    }

    /// A bidirectional streaming call. Returns as soon as the call is started (queued on its
    /// connection), without waiting for the server — which may wait for a first request
    /// before it answers anything; requests are sent as the stream yields them. The response
    /// headers come with the stream's first item: [`Streaming::headers`]; the
    /// [`Response`]'s own metadata is empty. `request` is a stream of messages or a
    /// [`Request`] around one. Only a start that never left the client is sent again (the
    /// request stream cannot be replayed).
    ///
    /// ```no_run
    /// # async fn f(channel: topspin::Channel) -> Result<(), topspin::Status> {
    /// use bytes::Bytes;
    /// use topspin::{codec::RawCodec, Request};
    /// let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    /// let requests = futures_util::stream::unfold(rx, |mut rx| async move {
    ///     rx.recv().await.map(|m| (m, rx))
    /// });
    /// let mut replies = channel
    ///     .streaming(RawCodec, "/chat.Chat/Talk", Request::new(requests))
    ///     .await? // the call is open; nothing has been sent or received yet
    ///     .into_inner();
    /// tx.send(Bytes::from("hi")).await.ok();
    /// let reply = replies.message().await?;
    /// let headers = replies.headers().await?; // here at the latest with the first reply
    /// # let _ = (reply, headers); Ok(()) }
    /// ```
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
        let switch = request.message_compression();
        let (start, requests, compression, ready) =
            self.call_start(method.into().0, C::ID, request);
        let (h, mut guard, (headers, items), token) =
            retry::start_call(&self.inner, start, ready, stream_sink).await?;
        // From here the stream cancels the call if it is dropped.
        guard.disarm();
        // The request pump goes after the start on the connection's queue, so it can never
        // overtake it; it runs whether or not the server has answered.
        let requests = Box::pin(requests);
        pump(
            codec.clone(),
            compression,
            switch,
            h.tx.clone(),
            token,
            requests,
        );
        let opening = opening(codec, self.room(), headers, None);
        Ok(stream_response(&h, token, items, opening))
    }
}

/// The receiving side of a response stream: its headers, then its items.
type StreamRx = (
    oneshot::Receiver<Result<Metadata, Status>>,
    mpsc::UnboundedReceiver<Item>,
);

/// A response stream's sink and its receiving side.
fn stream_sink() -> (Sink, StreamRx) {
    let (htx, hrx) = oneshot::channel();
    // Unbounded in type, bounded by flow control: the server may send only the call's window
    // (`Config::initial_call_window`, 1 MiB) ahead of what the stream consumed (credit goes back
    // as the application takes messages), plus one message of at most `max_message_size`.
    let (itx, irx) = mpsc::unbounded_channel::<Item>();
    let sink = Sink::Stream {
        headers: Some(htx),
        items: itx,
    };
    (sink, (hrx, irx))
}

/// One started attempt of a call whose responses are a stream.
struct Begun {
    h: ConnHandle,
    token: u64,
    headers: oneshot::Receiver<Result<Metadata, Status>>,
    items: mpsc::UnboundedReceiver<Item>,
}

/// Starts one attempt of a server-streaming call.
async fn stream_attempt(pool: &Pool, start: CallStart) -> Result<(Begun, CallGuard), Status> {
    let token = start.token;
    let (sink, (headers, items)) = stream_sink();
    let (h, guard) = call::begin(pool, start, sink).await.map_err(retry::began)?;
    let begun = Begun {
        h,
        token,
        headers,
        items,
    };
    Ok((begun, guard))
}

/// How a server-streaming call is retried: its method's policy, transparent retry and
/// wait_for_ready.
fn stream_plan<'a>(pool: &'a Pool, start: &CallStart, ready: bool) -> retry::Plan<'a> {
    retry::Plan::of(&pool.endpoint.retries, &start.method, ready)
        .unwrap_or(retry::Plan::start_only(false))
}

/// What a server-streaming call needs to start again while no response has arrived.
struct Again {
    pool: Arc<Pool>,
    start: CallStart,
    tries: retry::Tries,
    ready: bool,
}

/// Another attempt's response stream, to read instead of the first one's.
type Attempt = (mpsc::UnboundedReceiver<Item>, Box<dyn CreditReturn>);

impl Again {
    /// The stream's attempt failed with `status` before any response: further attempts as
    /// the plan allows, each until its response headers arrive.
    async fn retry(mut self, status: Status) -> Result<(Metadata, Attempt), Status> {
        let pool = &*self.pool;
        let plan = stream_plan(pool, &self.start, self.ready);
        plan.after(&mut self.tries, self.start.deadline, status)
            .await?;
        let attempt = |s| async move {
            let (begun, guard) = stream_attempt(pool, s).await?;
            // Until they arrive, dropping the stream cancels this attempt through its guard.
            let headers = call::headers(begun.headers, guard).await?;
            Ok((headers, begun.h, begun.token, begun.items))
        };
        let (headers, h, token, items) =
            retry::run_from(pool, plan, &self.start, &mut self.tries, None, attempt).await?;
        let credit: Box<dyn CreditReturn> = Box::new(ClientCredit {
            tx: h.tx.clone(),
            token,
        });
        Ok((headers, (items, credit)))
    }
}

/// A response stream's wait for its headers (protocol.md §5.4: the server's HEADERS, or empty
/// ones when its first message or its end comes first), then the decoder they select: the
/// encoding its messages use is named there. With `again`, a call that fails before any
/// response is retried.
fn opening<C: Codec>(
    codec: C,
    room: compression::Room,
    headers: oneshot::Receiver<Result<Metadata, Status>>,
    again: Option<Again>,
) -> Opening<C::Decode> {
    Box::pin(async move {
        let first = headers
            .await
            .map_err(|_| Status::unavailable("the connection task ended"))
            .and_then(|r| r);
        let (headers, attempt) = match (first, again) {
            (Ok(headers), _) => (headers, None),
            (Err(status), None) => return Err(status),
            (Err(status), Some(again)) => {
                let (headers, attempt) = again.retry(status).await?;
                (headers, Some(attempt))
            }
        };
        match decoder_for(codec, &headers, room) {
            Ok((decode, flagged)) => Ok(Opened {
                headers,
                decode,
                flagged,
                attempt,
            }),
            Err(status) => {
                if let Some((_, credit)) = &attempt {
                    credit.abandon();
                }
                Err(status)
            }
        }
    })
}

/// The decoder of a response stream whose headers are `headers`, and whether its messages
/// carry the native flag byte (the headers name an encoding).
fn decoder_for<C: Codec>(
    codec: C,
    headers: &Metadata,
    room: compression::Room,
) -> Result<(Decoder<C::Decode>, bool), Status> {
    Ok(match compression::encoding_of(headers)? {
        None => (decoder(codec), false),
        Some(e) => (
            decoder(compression::Compressed {
                recv: Some(e),
                room,
                ..compression::Compressed::plain(codec)
            }),
            true,
        ),
    })
}

/// A started call's response: the stream, its headers still to come.
fn stream_response<T>(
    h: &ConnHandle,
    token: u64,
    items: mpsc::UnboundedReceiver<Item>,
    opening: Opening<T>,
) -> Response<Streaming<T>> {
    let credit = Box::new(ClientCredit {
        tx: h.tx.clone(),
        token,
    });
    let stream = Streaming::opening(items, credit, opening);
    Response::from_parts(stream, Metadata::new(), Metadata::new())
}
