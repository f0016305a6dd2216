//! [`Request`] and [`Response`]: a message with its metadata, and on the server the call's
//! context (deadline, cancellation, peer).

use crate::transport::PeerAddr;
use crate::{Compression, MessageCompression};
use futures_util::Stream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use topspin_proto::Metadata;

/// A request: a message (or a stream of them) with metadata and, on the client, a timeout.
///
/// ```
/// use std::time::Duration;
/// use topspin::{Metadata, Request};
/// let req = Request::new("hello")
///     .with_timeout(Duration::from_millis(250))
///     .with_metadata(Metadata::builder().text("user", "ann").unwrap().build());
/// assert_eq!(req.metadata().get_str("user"), Some("ann"));
/// assert_eq!(*req.get_ref(), "hello");
/// ```
#[derive(Debug)]
pub struct Request<T> {
    message: T,
    metadata: Metadata,
    timeout: Option<Duration>,
    ctx: Option<ServerContext>,
    /// Client: this call's compression; `None` follows the channel's `Config::compression`.
    compression: Option<Option<Compression>>,
    /// Client: wait for a connection (until the deadline) instead of failing fast.
    wait_for_ready: bool,
    /// Client: turns the compression of a request stream's messages off and on.
    switch: Option<MessageCompression>,
}

impl<T> Request<T> {
    /// A request with no metadata and no timeout.
    pub fn new(message: T) -> Request<T> {
        Request {
            message,
            metadata: Metadata::new(),
            timeout: None,
            ctx: None,
            compression: None,
            wait_for_ready: false,
            switch: None,
        }
    }

    /// Sets the request metadata (headers).
    pub fn with_metadata(mut self, metadata: Metadata) -> Request<T> {
        self.metadata = metadata;
        self
    }

    /// Sets the call's timeout: sent to the server as its deadline; the client fails the call
    /// with `DEADLINE_EXCEEDED` when it passes.
    pub fn with_timeout(mut self, timeout: Duration) -> Request<T> {
        self.timeout = Some(timeout);
        self
    }

    /// Client: compresses this call's request messages (and accepts compressed responses),
    /// whatever the channel's `Config::compression` says; `None` sends them as they are.
    ///
    /// ```
    /// use topspin::{Compression, Encoding, Request};
    /// let req = Request::new(vec![0u8; 100_000]).with_compression(Some(Compression::new(Encoding::Zstd)));
    /// # let _ = req;
    /// ```
    pub fn with_compression(mut self, compression: Option<Compression>) -> Request<T> {
        self.compression = Some(compression);
        self
    }

    /// Client: whether the call waits for a connection (gRPC's `wait_for_ready`). By default
    /// (`false`) a call fails fast with `UNAVAILABLE` when the server cannot be reached (the
    /// connection is refused, or the channel backs off after failed attempts). With `true` it
    /// keeps trying to start — reconnecting with the channel's backoff — until its deadline
    /// (then `DEADLINE_EXCEEDED`) or until it is dropped; a call without a deadline waits for
    /// ever. Only the wait for a connection is affected: once the call reached a server, its
    /// outcome is the server's (and the retry policy's, see [`crate::RetryPolicy`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use topspin::Request;
    /// let req = Request::new("hi").with_wait_for_ready(true).with_timeout(Duration::from_secs(5));
    /// assert!(req.wait_for_ready());
    /// ```
    pub fn with_wait_for_ready(mut self, wait: bool) -> Request<T> {
        self.wait_for_ready = wait;
        self
    }

    /// Client: whether the call waits for a connection ([`Request::with_wait_for_ready`]).
    pub fn wait_for_ready(&self) -> bool {
        self.wait_for_ready
    }

    /// The message.
    pub fn get_ref(&self) -> &T {
        &self.message
    }

    /// The message, mutably.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.message
    }

    /// Takes the message.
    pub fn into_inner(self) -> T {
        self.message
    }

    /// The request metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The timeout set by the client, if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Server: the time left before the call's deadline (`None` if it has none).
    pub fn remaining(&self) -> Option<Duration> {
        let d = self.ctx.as_ref()?.deadline?;
        Some(d.saturating_duration_since(Instant::now()))
    }

    /// Server: the call's deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.ctx.as_ref()?.deadline
    }

    /// Server: the address of the client.
    pub fn peer_addr(&self) -> Option<&PeerAddr> {
        self.ctx.as_ref().map(|c| &c.conn.peer)
    }

    /// Server, over TLS: what the handshake established about the client — its verified
    /// certificate chain under mutual TLS ([`TlsPeer::certificates`](crate::tls::TlsPeer),
    /// `dns_names`), the ALPN protocol, the server name it asked for.
    #[cfg(feature = "tls")]
    pub fn tls_peer(&self) -> Option<&crate::tls::TlsPeer> {
        self.ctx.as_ref()?.conn.tls.as_deref()
    }

    /// Server, over mutual TLS: the client's certificate chain (DER, leaf first).
    #[cfg(feature = "tls")]
    pub fn peer_certificates(
        &self,
    ) -> Option<&[crate::tls::rustls::pki_types::CertificateDer<'static>]> {
        let c = self.tls_peer()?.certificates();
        (!c.is_empty()).then_some(c)
    }

    /// Server: the protocol the call came in on — native topspin, or gRPC over HTTP/2 on the
    /// same port ([`ServerBuilder::grpc`](crate::ServerBuilder::grpc)). Handlers need not care:
    /// every call reaches the same handler with the same metadata, deadline and cancellation;
    /// this is the only way to tell the two apart. `None` on a client's request.
    ///
    /// ```
    /// use topspin::{Protocol, Request};
    /// assert_eq!(Request::new(()).protocol(), None); // a client's request has no context
    /// assert_ne!(Protocol::Topspin, Protocol::Grpc);
    /// ```
    pub fn protocol(&self) -> Option<Protocol> {
        self.ctx.as_ref().map(|c| c.conn.protocol)
    }

    /// Server: the encoding the request's messages came in (`topspin-encoding` on the native
    /// face, `grpc-encoding` on the gRPC face); `None` when they came uncompressed (and on a
    /// client's request). It is the call's: a call with an encoding may still send a message
    /// as it is (one under the client's threshold, say) — whether each message arrived
    /// compressed is [`Request::message_compressed`] (the one request) and
    /// [`Streaming::last_message_compressed`](crate::Streaming::last_message_compressed) (a
    /// request stream's).
    ///
    /// ```
    /// use topspin::Request;
    /// assert_eq!(Request::new(()).encoding(), None);
    /// ```
    pub fn encoding(&self) -> Option<crate::Encoding> {
        let ctx = self.ctx.as_ref()?;
        ctx.encoding.or_else(|| {
            crate::compression::encoding_of(&self.metadata)
                .ok()
                .flatten()
        })
    }

    /// Server: whether the request message arrived compressed (a unary or server-streaming
    /// call's one message; a request stream tells message by message,
    /// [`Streaming::last_message_compressed`](crate::Streaming::last_message_compressed)).
    /// [`Request::encoding`] is the call's encoding, which says how its messages *may* be
    /// compressed; each message still says whether it is — a client sends a message as it is
    /// (gRPC's compressed flag 0; topspin's flag byte 0, protocol.md §15) when it is under its
    /// compression's threshold or would not shrink. `false` on a client's request.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use bytes::Bytes;
    /// use topspin::codec::RawCodec;
    /// use topspin::{Compression, Config, Encoding, Endpoint, Request, Response, Server};
    ///
    /// let server = Server::builder()
    ///     .unary("/demo.D/Flag", RawCodec, |req: Request<Bytes>| async move {
    ///         let seen = format!("{:?} {}", req.encoding(), req.message_compressed());
    ///         Ok(Response::new(Bytes::from(seen)))
    ///     })
    ///     .bind("tcp://127.0.0.1:0")
    ///     .await?;
    /// let address = server.local_addr().clone();
    /// let shutdown = server.shutdown_handle();
    /// tokio::spawn(server.serve());
    ///
    /// // A gzip channel compresses messages of 1 KiB and more (the default threshold).
    /// let gzip = Config::default().with_compression(Some(Compression::new(Encoding::Gzip)));
    /// let channel = Endpoint::new(address)?.config(gzip).connect().await?;
    /// let big = Request::new(Bytes::from(vec![b'x'; 4096]));
    /// let r = channel.unary(RawCodec, "/demo.D/Flag", big).await?;
    /// assert_eq!(r.get_ref(), "Some(Gzip) true");
    /// let small = Request::new(Bytes::from_static(b"hi")); // under the threshold: as it is
    /// let r = channel.unary(RawCodec, "/demo.D/Flag", small).await?;
    /// assert_eq!(r.get_ref(), "Some(Gzip) false");
    /// assert!(!Request::new(()).message_compressed());
    /// shutdown.shutdown(std::time::Duration::from_secs(1)).await;
    /// # Ok(()) }
    /// ```
    pub fn message_compressed(&self) -> bool {
        self.ctx.as_ref().is_some_and(|c| c.compressed)
    }

    /// Server: the full method name, e.g. `/kv.Store/Get`.
    pub fn method(&self) -> Option<&str> {
        self.ctx.as_ref().map(|c| &*c.method)
    }

    /// Server: a handle that tells whether the call was cancelled (client cancel, deadline,
    /// connection loss, shutdown). The handler's future is also dropped promptly when that
    /// happens; the handle lets work spawned elsewhere stop too. It never fires for a call
    /// that ended normally (its handler returned an answer or an error status).
    pub fn cancellation(&self) -> Option<Cancellation> {
        self.ctx.as_ref().map(|c| c.cancel.clone())
    }

    /// Maps the message, keeping metadata and context.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Request<U> {
        Request {
            message: f(self.message),
            metadata: self.metadata,
            timeout: self.timeout,
            ctx: self.ctx,
            compression: self.compression,
            wait_for_ready: self.wait_for_ready,
            switch: self.switch,
        }
    }

    pub(crate) fn into_parts(self) -> (T, Metadata, Option<Duration>) {
        (self.message, self.metadata, self.timeout)
    }

    /// Client: compresses a streaming request's messages only while `switch` is on (see
    /// [`MessageCompression`]): the call's compression (`with_compression`, or the channel's)
    /// applies message by message. Nothing changes for a call that does not compress.
    ///
    /// ```
    /// use topspin::{Compression, Encoding, MessageCompression, Request};
    /// let switch = MessageCompression::new();
    /// let messages = futures_util::stream::iter([vec![0u8; 4096], vec![1u8; 4096]]);
    /// let req = Request::new(messages)
    ///     .with_compression(Some(Compression::new(Encoding::Zstd)))
    ///     .with_message_compression(&switch);
    /// # let _ = req;
    /// ```
    pub fn with_message_compression(mut self, switch: &MessageCompression) -> Request<T> {
        self.switch = Some(switch.clone());
        self
    }

    /// Client: the request stream's compression switch, if it has one.
    pub(crate) fn message_compression(&self) -> Option<MessageCompression> {
        self.switch.clone()
    }

    /// Client: the compression this call asked for, if it overrides the channel's.
    pub(crate) fn compression(&self) -> Option<Option<Compression>> {
        self.compression
    }

    pub(crate) fn from_server(message: T, metadata: Metadata, ctx: ServerContext) -> Request<T> {
        let timeout = ctx
            .deadline
            .map(|d| d.saturating_duration_since(Instant::now()));
        Request {
            message,
            metadata,
            timeout,
            ctx: Some(ctx),
            compression: None,
            wait_for_ready: false,
            switch: None,
        }
    }
}

/// Anything a call accepts as its request: a message alone, or a [`Request`] with metadata and
/// a timeout. Lets clients write `client.get(GetRequest { .. })`.
///
/// ```
/// use topspin::{IntoRequest, Request};
/// let a: Request<u32> = 7.into_request();
/// let b: Request<u32> = Request::new(7).into_request();
/// assert_eq!(a.get_ref(), b.get_ref());
/// ```
pub trait IntoRequest<T> {
    /// The request.
    fn into_request(self) -> Request<T>;
}

impl<T> IntoRequest<T> for T {
    fn into_request(self) -> Request<T> {
        Request::new(self)
    }
}

impl<T> IntoRequest<T> for Request<T> {
    fn into_request(self) -> Request<T> {
        self
    }
}

/// Anything a client-streaming or bidirectional call accepts as its requests: a stream of
/// messages alone, or a [`Request`] around one (with metadata and a timeout), as tonic's
/// `IntoStreamingRequest`.
///
/// ```
/// use futures_util::stream;
/// use topspin::{IntoStreamingRequest, Request};
/// let a = stream::iter([1u32, 2]).into_streaming_request();
/// let b = Request::new(stream::iter([1u32, 2])).into_streaming_request();
/// assert!(a.metadata().is_empty() && b.metadata().is_empty());
/// ```
pub trait IntoStreamingRequest {
    /// The stream of request messages.
    type Stream: Stream<Item = Self::Message> + Send + 'static;
    /// One request message.
    type Message;
    /// The request.
    fn into_streaming_request(self) -> Request<Self::Stream>;
}

impl<S> IntoStreamingRequest for S
where
    S: Stream + Send + 'static,
{
    type Stream = S;
    type Message = S::Item;
    fn into_streaming_request(self) -> Request<S> {
        Request::new(self)
    }
}

impl<S> IntoStreamingRequest for Request<S>
where
    S: Stream + Send + 'static,
{
    type Stream = S;
    type Message = S::Item;
    fn into_streaming_request(self) -> Request<S> {
        self
    }
}

/// What the server knows about a call besides its message.
#[derive(Clone, Debug)]
pub(crate) struct ServerContext {
    pub(crate) deadline: Option<Instant>,
    /// The request's encoding when the face read it out of the metadata (gRPC); the native
    /// face leaves `topspin-encoding` in the metadata, where [`Request::encoding`] finds it.
    pub(crate) encoding: Option<crate::Encoding>,
    /// The one request message of a unary or server-streaming call arrived compressed (set
    /// by the face that decompressed it, or by the handler that reads its flag byte).
    pub(crate) compressed: bool,
    pub(crate) method: bytestring::ByteString,
    pub(crate) cancel: Cancellation,
    /// What every call of its connection shares (one reference count per call, and a small
    /// context: it is moved with the request into the handler's future).
    pub(crate) conn: Arc<ConnContext>,
}

/// What the calls of one server connection share.
#[derive(Debug)]
pub(crate) struct ConnContext {
    pub(crate) peer: PeerAddr,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<std::sync::Arc<crate::tls::TlsPeer>>,
    /// The server's `Config::compression` and `max_message_size`, for the calls' messages.
    pub(crate) compression: Option<Compression>,
    pub(crate) max_message_size: u32,
    /// What decompressed requests are charged to (`Config::memory_budget`).
    pub(crate) budget: std::sync::Arc<topspin_proto::MemoryBudget>,
    /// The face the calls came in on.
    pub(crate) protocol: Protocol,
}

impl ConnContext {
    /// What one decompressed request message may take.
    pub(crate) fn room(&self) -> crate::compression::Room {
        crate::compression::Room::new(self.max_message_size as usize, Some(self.budget.clone()))
    }
}

/// The protocol a server-side call came in on ([`Request::protocol`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Protocol {
    /// Native topspin (`docs/protocol.md`), over any transport.
    Topspin,
    /// gRPC over HTTP/2 (h2c with prior knowledge, or TLS with ALPN `h2`), answered by the
    /// server's gRPC face on the same port.
    Grpc,
}

/// Tells a server handler whether its call was cancelled: by the client, by its deadline, by
/// the loss of its connection or by the server's shutdown (the grace period ran out). It
/// fires only then, never after the call ended normally, so a task spawned with a clone can
/// tell "the call was abandoned" from "the call is done".
#[derive(Clone, Debug, Default)]
pub struct Cancellation {
    inner: Arc<CancelInner>,
}

#[derive(Debug, Default)]
struct CancelInner {
    cancelled: std::sync::atomic::AtomicBool,
    notify: Notify,
    /// The connection task's wrapper around the handler, woken to drop it.
    waker: futures_util::task::AtomicWaker,
}

impl Cancellation {
    /// Whether the call was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.inner
            .cancelled
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Completes when the call is cancelled.
    pub async fn cancelled(&self) {
        loop {
            let notified = self.inner.notify.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }

    pub(crate) fn cancel(&self) {
        self.inner
            .cancelled
            .store(true, std::sync::atomic::Ordering::Release);
        self.inner.notify.notify_waiters();
        self.inner.waker.wake();
    }

    /// Takes this handle back for another call if nothing else holds it (no allocation for the
    /// next call's handle).
    pub(crate) fn recycle(self, pool: &mut Vec<Cancellation>) {
        if Arc::strong_count(&self.inner) == 1 && pool.len() < 1024 {
            self.inner
                .cancelled
                .store(false, std::sync::atomic::Ordering::Relaxed);
            pool.push(self);
        }
    }

    /// Registers `cx` to be woken on cancellation; returns whether it is cancelled.
    pub(crate) fn poll_cancelled(&self, cx: &mut std::task::Context<'_>) -> bool {
        if self.is_cancelled() {
            return true;
        }
        self.inner.waker.register(cx.waker());
        self.is_cancelled()
    }
}

/// A response: a message (or stream), response headers and, for unary calls, trailers.
///
/// ```
/// use topspin::{Metadata, Response};
/// let r = Response::new(42).with_metadata(Metadata::builder().text("server", "a").unwrap().build());
/// assert_eq!(*r.get_ref(), 42);
/// ```
#[derive(Debug)]
pub struct Response<T> {
    message: T,
    metadata: Metadata,
    trailers: Metadata,
    /// Server: the compression of this call's response messages, when the handler chose it.
    compression: Option<Option<Compression>>,
    /// Server: turns the compression of a response stream's messages off and on.
    switch: Option<MessageCompression>,
}

impl<T> Response<T> {
    /// A response with no metadata.
    pub fn new(message: T) -> Response<T> {
        Response {
            message,
            metadata: Metadata::new(),
            trailers: Metadata::new(),
            compression: None,
            switch: None,
        }
    }

    /// Sets the response headers.
    pub fn with_metadata(mut self, metadata: Metadata) -> Response<T> {
        self.metadata = metadata;
        self
    }

    /// Sets the trailers (sent with the final status).
    pub fn with_trailers(mut self, trailers: Metadata) -> Response<T> {
        self.trailers = trailers;
        self
    }

    /// Server: compresses this call's response messages with `compression` (`None`: not at
    /// all) instead of the server's [`Config::compression`](crate::Config::compression) — if
    /// the client accepts that encoding (it says so in its request); otherwise they go
    /// uncompressed. On every face: native (`topspin-encoding`) and gRPC (`grpc-encoding`).
    ///
    /// ```
    /// use topspin::{Compression, Encoding, Response};
    /// let r = Response::new(vec![0u8; 100_000]).with_compression(Some(Compression::new(Encoding::Gzip)));
    /// let small = Response::new(vec![1u8]).with_compression(None); // not worth it
    /// # let _ = (r, small);
    /// ```
    pub fn with_compression(mut self, compression: Option<Compression>) -> Response<T> {
        self.compression = Some(compression);
        self
    }

    /// Server: compresses a response stream's messages only while `switch` is on (see
    /// [`MessageCompression`]), on both faces; the call's compression (`with_compression`, or
    /// the server's) applies message by message.
    pub fn with_message_compression(mut self, switch: &MessageCompression) -> Response<T> {
        self.switch = Some(switch.clone());
        self
    }

    /// The response stream's compression switch, if the handler gave one.
    pub(crate) fn take_message_compression(&mut self) -> Option<MessageCompression> {
        self.switch.take()
    }

    /// The compression the handler chose, if it chose.
    pub(crate) fn compression_choice(&self) -> Option<Option<Compression>> {
        self.compression
    }

    /// The message.
    pub fn get_ref(&self) -> &T {
        &self.message
    }

    /// The message, mutably.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.message
    }

    /// Takes the message.
    pub fn into_inner(self) -> T {
        self.message
    }

    /// Response headers.
    ///
    /// A client's streaming call ([`Channel::server_streaming`], [`Channel::streaming`])
    /// returns before the server has answered, so its response has none here (empty): its
    /// headers come with the stream, [`Streaming::headers`](crate::Streaming::headers).
    ///
    /// [`Channel::server_streaming`]: crate::Channel::server_streaming
    /// [`Channel::streaming`]: crate::Channel::streaming
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Trailers (unary and client-streaming calls; for streams see
    /// [`Streaming::trailers`](crate::Streaming::trailers)).
    pub fn trailers(&self) -> &Metadata {
        &self.trailers
    }

    /// Maps the message.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Response<U> {
        Response {
            message: f(self.message),
            metadata: self.metadata,
            trailers: self.trailers,
            compression: self.compression,
            switch: self.switch,
        }
    }

    pub(crate) fn into_parts(self) -> (T, Metadata, Metadata) {
        (self.message, self.metadata, self.trailers)
    }

    pub(crate) fn from_parts(message: T, metadata: Metadata, trailers: Metadata) -> Response<T> {
        Response {
            message,
            metadata,
            trailers,
            compression: None,
            switch: None,
        }
    }
}
