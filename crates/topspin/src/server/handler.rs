//! Type-erased method handlers for the four call kinds, and the wrapper that drops a handler
//! promptly when its call is cancelled.

use crate::codec::Codec;
use crate::codec::Payload;
use crate::compression::Compressed;
use crate::request::{Cancellation, ServerContext};
use crate::streaming::{CreditReturn, Item, Streaming};
use crate::{Request, Response, Status};
use bytes::Bytes;
use futures_util::{FutureExt, Stream, StreamExt};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::ReusableBoxFuture;
use topspin_proto::Metadata;

/// The four call kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// One request, one response.
    Unary,
    /// One request, a stream of responses.
    ServerStreaming,
    /// A stream of requests, one response.
    ClientStreaming,
    /// Streams both ways.
    Bidirectional,
}

impl CallKind {
    /// Whether the client sends a stream.
    pub fn client_streams(self) -> bool {
        matches!(self, CallKind::ClientStreaming | CallKind::Bidirectional)
    }

    /// Whether the server sends a stream.
    pub fn server_streams(self) -> bool {
        matches!(self, CallKind::ServerStreaming | CallKind::Bidirectional)
    }
}

/// Commands from running handlers to their connection task.
#[derive(Debug)]
pub(crate) enum SCmd {
    Headers {
        id: u32,
        metadata: Metadata,
    },
    Send {
        id: u32,
        message: Payload,
        ack: oneshot::Sender<Result<(), Status>>,
        /// Whether a face that compresses in its own frames (gRPC) compresses this one: the
        /// response's [`MessageCompression`](crate::MessageCompression) was on. (The native
        /// face's messages come encoded already.)
        compress: bool,
    },
    Credit {
        id: u32,
        bytes: u32,
    },
}

impl SCmd {
    /// The call the command is for.
    pub(crate) fn id(&self) -> u32 {
        match self {
            SCmd::Headers { id, .. } | SCmd::Send { id, .. } | SCmd::Credit { id, .. } => *id,
        }
    }
}

/// How a handler's call is to be answered.
pub(crate) enum Outcome {
    /// One response (unary, client streaming): message, headers, trailers.
    Reply(Result<(Payload, Metadata, Metadata), Status>),
    /// A response stream finished (its messages were already sent): trailers or error.
    Finished(Result<Metadata, Status>),
}

/// A handler's future, in a box whose memory is reused by the next call of the same method
/// (same layout), so dispatch allocates nothing per call in steady state.
pub(crate) type BoxFut = ReusableBoxFuture<'static, Outcome>;

/// Puts `f` in a recycled box if there is one (reallocating only if its layout differs).
pub(crate) fn place<F>(recycled: Option<BoxFut>, f: F) -> BoxFut
where
    F: Future<Output = Outcome> + Send + 'static,
{
    match recycled {
        Some(mut b) => {
            b.set(f);
            b
        }
        None => ReusableBoxFuture::new(f),
    }
}

/// What a handler receives.
pub(crate) enum Input {
    One(Bytes),
    Stream {
        rx: mpsc::UnboundedReceiver<Item>,
        credit: Box<dyn CreditReturn>,
    },
}

/// Sends a streaming handler's output through its connection task.
#[derive(Clone, Debug)]
pub(crate) struct CallIo {
    pub(crate) tx: mpsc::Sender<SCmd>,
    pub(crate) id: u32,
}

/// A call's [`CallIo`] not yet cloned: only handlers that send through it (response
/// streams) take an owned one, so that a unary call clones and drops no channel sender.
#[derive(Clone, Copy)]
pub(crate) struct IoRef<'a> {
    pub(crate) tx: &'a mpsc::Sender<SCmd>,
    pub(crate) id: u32,
}

impl IoRef<'_> {
    /// An owned handle, for a handler that sends through it.
    pub(crate) fn to_owned(self) -> CallIo {
        CallIo {
            tx: self.tx.clone(),
            id: self.id,
        }
    }
}

impl CallIo {
    /// A borrowed handle, for [`Handler::call`].
    pub(crate) fn as_ref(&self) -> IoRef<'_> {
        IoRef {
            tx: &self.tx,
            id: self.id,
        }
    }

    async fn headers(&self, metadata: Metadata) {
        let _ = self
            .tx
            .send(SCmd::Headers {
                id: self.id,
                metadata,
            })
            .await;
    }

    /// Sends one message, waiting for flow-control credit.
    async fn send(&self, message: Payload, compress: bool) -> Result<(), Status> {
        let (ack, done) = oneshot::channel();
        self.tx
            .send(SCmd::Send {
                id: self.id,
                message,
                ack,
                compress,
            })
            .await
            .map_err(|_| Status::unavailable("connection closed"))?;
        done.await
            .map_err(|_| Status::unavailable("connection closed"))?
    }
}

/// A first poll of a handler on its connection's task that takes longer than this (in ms)
/// marks its method: its calls start on a task of their own from then on ([`Inline`]).
pub(crate) const INLINE_LIMIT_MS: u64 = 20;

/// A coarse monotonic clock, in milliseconds: `CLOCK_MONOTONIC_COARSE` on Linux (a few
/// instructions to read, ticks of 1–4 ms), enough to tell a handler that blocked its thread
/// from one that answered.
pub(crate) fn coarse_ms() -> u64 {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
        (t.tv_sec as u64) * 1000 + (t.tv_nsec as u64) / 1_000_000
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_millis() as u64
    }
}

/// What a server learned of one method's handler: whether a first poll of it, run on the
/// connection's task to answer without a trip through the scheduler, ever held that task
/// longer than [`INLINE_LIMIT_MS`] — a blocking call before its first `.await`
/// (`std::thread::sleep`, blocking I/O, a long computation), which holds up every other call
/// of the connection. Such a method's calls are polled on a task of their own from then on,
/// on every face, and a warning names it once.
#[derive(Debug)]
pub(crate) struct Inline {
    method: Box<str>,
    blocking: std::sync::atomic::AtomicBool,
}

impl Inline {
    pub(crate) fn new(method: &str) -> Inline {
        Inline {
            method: method.into(),
            blocking: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether a first poll may run on the connection's task.
    pub(crate) fn allows(&self) -> bool {
        !self.blocking.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A first poll on the connection's task took `ms`.
    pub(crate) fn took(&self, ms: u64) {
        if ms > INLINE_LIMIT_MS
            && !self
                .blocking
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(
                method = %self.method,
                took_ms = ms,
                "a handler blocked its connection for {ms} ms before its first .await \
                 (std::thread::sleep, blocking I/O or a long computation in an async fn): its \
                 other calls waited. This method's calls now start on a task of their own. \
                 Fix: tokio::task::spawn_blocking, or an async API"
            );
        }
    }
}

pub(crate) trait Handler: Send + Sync + 'static {
    /// What the server learned of this method's first polls (`None`: nothing kept).
    fn inline(&self) -> Option<&Inline> {
        None
    }
    fn kind(&self) -> CallKind;
    fn codec(&self) -> u8;
    fn call(
        &self,
        input: Input,
        metadata: Metadata,
        ctx: ServerContext,
        io: IoRef<'_>,
        recycled: Option<BoxFut>,
    ) -> BoxFut;
}

fn wrong_input(recycled: Option<BoxFut>) -> BoxFut {
    place(
        recycled,
        std::future::ready(Outcome::Reply(Err(Status::internal(
            "handler received the wrong kind of input",
        )))),
    )
}

fn typed_stream<C: Codec>(codec: Compressed<C>, input: Input) -> Option<Streaming<C::Decode>> {
    match input {
        Input::Stream { rx, credit } => {
            // Native messages keep their flag byte, which tells the stream which arrived
            // compressed; the gRPC face says so beside each message.
            let flagged = codec.recv.is_some();
            Some(Streaming::new(
                rx,
                Box::new(move |b| codec.decode(b)),
                credit,
                flagged,
            ))
        }
        Input::One(_) => None,
    }
}

/// The outcome of a one-response call: `fut`'s response encoded with `codec`. A combinator,
/// not an `async fn`: an `async fn` keeps its argument and the future it awaits in separate
/// slots, which doubles the size of the state (the handler's future, moved into the call's
/// box for every call) and moves the handler's future once more at the first poll. `Map`
/// holds the future in place and drops it as soon as it completes.
fn reply<C: Codec>(
    codec: Compressed<C>,
    fut: impl Future<Output = Result<Response<C::Encode>, Status>>,
) -> impl Future<Output = Outcome> {
    fut.map(move |r| {
        Outcome::Reply(match r {
            Ok(r) => {
                let choice = r.compression_choice();
                let (m, h, t) = r.into_parts();
                let mut codec = codec;
                let h = codec.respond_with(choice, h);
                codec.encode_payload(m).map(|b| (b, codec.announce(h), t))
            }
            Err(s) => Err(s),
        })
    })
}

/// The call's codec with the call's compression (protocol.md §15) around it.
fn call_codec<C: Codec>(
    codec: &C,
    md: &Metadata,
    ctx: &ServerContext,
) -> Result<Compressed<C>, Status> {
    if ctx.conn.protocol == crate::Protocol::Grpc {
        // The gRPC face compresses and decompresses in its own frames (`grpc-encoding`): the
        // handler's messages go plain, and nothing in the metadata is looked up.
        let mut c = Compressed::plain(codec.clone());
        c.face_compresses = true;
        return Ok(c);
    }
    Compressed::for_server_call(codec.clone(), md, ctx.conn.compression, || ctx.conn.room())
}

async fn stream_out<C, S>(
    codec: Compressed<C>,
    io: CallIo,
    fut: impl Future<Output = Result<Response<S>, Status>>,
) -> Outcome
where
    C: Codec,
    S: Stream<Item = Result<C::Encode, Status>> + Send,
{
    let mut resp = match fut.await {
        Ok(r) => r,
        Err(s) => return Outcome::Finished(Err(s)),
    };
    let switch = resp.take_message_compression();
    let choice = resp.compression_choice();
    let (stream, headers, trailers) = resp.into_parts();
    let mut codec = codec;
    let headers = codec.respond_with(choice, headers);
    // Headers go at once, so a client waiting for the stream to open is not held up until the
    // first message.
    io.headers(codec.announce(headers)).await;
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        let on = crate::compression::switched_on(switch.as_ref());
        let msg = match item.and_then(|m| codec.encode_payload_if(m, on)) {
            Ok(b) => b,
            Err(s) => return Outcome::Finished(Err(keep_trailers(s, &trailers))),
        };
        if let Err(s) = io.send(msg, on).await {
            return Outcome::Finished(Err(keep_trailers(s, &trailers)));
        }
    }
    Outcome::Finished(Ok(trailers))
}

/// A streaming response that ends in an error keeps the trailers the handler set on it: they
/// go out after the status's own metadata (gRPC and grpc-go do the same).
fn keep_trailers(status: Status, trailers: &Metadata) -> Status {
    if trailers.is_empty() {
        return status;
    }
    let merged = status
        .metadata()
        .iter()
        .chain(trailers.iter())
        .try_fold(Metadata::builder(), |b, (k, v)| b.entry(k, v));
    match merged {
        Ok(b) => status.with_metadata(b.build()),
        Err(_) => status, // not reached: both blocks were validated
    }
}

pub(crate) struct Unary<C, F>(pub(crate) C, pub(crate) F);
pub(crate) struct ServerStreaming<C, F>(pub(crate) C, pub(crate) F);
pub(crate) struct ClientStreaming<C, F>(pub(crate) C, pub(crate) F);
pub(crate) struct Bidi<C, F>(pub(crate) C, pub(crate) F);

impl<C, F, Fut> Handler for Unary<C, F>
where
    C: Codec,
    F: Fn(Request<C::Decode>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<C::Encode>, Status>> + Send + 'static,
{
    fn kind(&self) -> CallKind {
        CallKind::Unary
    }
    fn codec(&self) -> u8 {
        C::ID
    }
    fn call(
        &self,
        input: Input,
        md: Metadata,
        ctx: ServerContext,
        _io: IoRef<'_>,
        recycled: Option<BoxFut>,
    ) -> BoxFut {
        let Input::One(b) = input else {
            return wrong_input(recycled);
        };
        let mut ctx = ctx;
        let codec = match call_codec(&self.0, &md, &ctx) {
            Ok(c) => c,
            Err(s) => return place(recycled, std::future::ready(Outcome::Reply(Err(s)))),
        };
        // The native flag byte (a face that decompressed the message set this already).
        match codec.decode_noting(b, &mut ctx.compressed) {
            Ok(m) => place(
                recycled,
                reply(codec, (self.1)(Request::from_server(m, md, ctx))),
            ),
            Err(s) => place(recycled, std::future::ready(Outcome::Reply(Err(s)))),
        }
    }
}

impl<C, F, Fut, S> Handler for ServerStreaming<C, F>
where
    C: Codec,
    F: Fn(Request<C::Decode>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<S>, Status>> + Send + 'static,
    S: Stream<Item = Result<C::Encode, Status>> + Send + 'static,
{
    fn kind(&self) -> CallKind {
        CallKind::ServerStreaming
    }
    fn codec(&self) -> u8 {
        C::ID
    }
    fn call(
        &self,
        input: Input,
        md: Metadata,
        ctx: ServerContext,
        io: IoRef<'_>,
        recycled: Option<BoxFut>,
    ) -> BoxFut {
        let Input::One(b) = input else {
            return wrong_input(recycled);
        };
        let mut ctx = ctx;
        let codec = match call_codec(&self.0, &md, &ctx) {
            Ok(c) => c,
            Err(s) => return place(recycled, std::future::ready(Outcome::Finished(Err(s)))),
        };
        // The native flag byte (a face that decompressed the message set this already).
        match codec.decode_noting(b, &mut ctx.compressed) {
            Ok(m) => place(
                recycled,
                stream_out(
                    codec,
                    io.to_owned(),
                    (self.1)(Request::from_server(m, md, ctx)),
                ),
            ),
            Err(s) => place(recycled, std::future::ready(Outcome::Finished(Err(s)))),
        }
    }
}

impl<C, F, Fut> Handler for ClientStreaming<C, F>
where
    C: Codec,
    F: Fn(Request<Streaming<C::Decode>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<C::Encode>, Status>> + Send + 'static,
{
    fn kind(&self) -> CallKind {
        CallKind::ClientStreaming
    }
    fn codec(&self) -> u8 {
        C::ID
    }
    fn call(
        &self,
        input: Input,
        md: Metadata,
        ctx: ServerContext,
        _io: IoRef<'_>,
        recycled: Option<BoxFut>,
    ) -> BoxFut {
        let codec = match call_codec(&self.0, &md, &ctx) {
            Ok(c) => c,
            Err(s) => return place(recycled, std::future::ready(Outcome::Reply(Err(s)))),
        };
        let Some(stream) = typed_stream(codec.clone(), input) else {
            return wrong_input(recycled);
        };
        place(
            recycled,
            reply(codec, (self.1)(Request::from_server(stream, md, ctx))),
        )
    }
}

impl<C, F, Fut, S> Handler for Bidi<C, F>
where
    C: Codec,
    F: Fn(Request<Streaming<C::Decode>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<S>, Status>> + Send + 'static,
    S: Stream<Item = Result<C::Encode, Status>> + Send + 'static,
{
    fn kind(&self) -> CallKind {
        CallKind::Bidirectional
    }
    fn codec(&self) -> u8 {
        C::ID
    }
    fn call(
        &self,
        input: Input,
        md: Metadata,
        ctx: ServerContext,
        io: IoRef<'_>,
        recycled: Option<BoxFut>,
    ) -> BoxFut {
        let codec = match call_codec(&self.0, &md, &ctx) {
            Ok(c) => c,
            Err(s) => return place(recycled, std::future::ready(Outcome::Finished(Err(s)))),
        };
        let Some(stream) = typed_stream(codec.clone(), input) else {
            return wrong_input(recycled);
        };
        place(
            recycled,
            stream_out(
                codec,
                io.to_owned(),
                (self.1)(Request::from_server(stream, md, ctx)),
            ),
        )
    }
}

/// A running handler, dropped as soon as its call is cancelled.
pub(crate) struct Running {
    pub(crate) id: u32,
    pub(crate) cancel: Cancellation,
    pub(crate) fut: Option<BoxFut>,
}

/// A handler that finished: its call, its outcome (`None`: cancelled) and its box for reuse
/// (only after completion: a finished future holds nothing any more).
pub(crate) type Done = (u32, Option<Outcome>, Option<BoxFut>);

impl Running {
    /// The first poll, on the connection task (with a waker that does nothing), right after
    /// the caller saw that the call is not cancelled: nothing can cancel it in between (only
    /// the connection task does), and a handler that goes on is polled again on a task of its
    /// own, which registers for the cancellation then.
    ///
    /// `Pending` without polling when `inline` says the method blocks: the handler then runs
    /// on a task of its own from the start. Otherwise the poll is timed and `inline` told.
    #[inline]
    pub(crate) fn poll_first(
        &mut self,
        cx: &mut Context<'_>,
        inline: Option<&Inline>,
    ) -> Poll<Done> {
        let Some(inline) = inline else {
            return self.poll_handler(cx);
        };
        if !inline.allows() {
            return Poll::Pending;
        }
        let start = coarse_ms();
        let r = self.poll_handler(cx);
        inline.took(coarse_ms().saturating_sub(start));
        r
    }

    #[inline]
    fn poll_handler(&mut self, cx: &mut Context<'_>) -> Poll<Done> {
        let Some(fut) = self.fut.as_mut() else {
            return Poll::Ready((self.id, None, None));
        };
        // A panic ends this call alone (INTERNAL); the connection and its other calls go on.
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(Poll::Ready(o)) => Poll::Ready((self.id, Some(o), self.fut.take())),
            Ok(Poll::Pending) => Poll::Pending,
            Err(_) => {
                let fut = self.fut.take();
                // What is left of the handler may panic again as it drops.
                let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(fut)));
                tracing::error!(
                    call = self.id,
                    "a handler panicked; its call ends with INTERNAL"
                );
                Poll::Ready((self.id, Some(Outcome::Finished(Err(panicked()))), None))
            }
        }
    }
}

impl Future for Running {
    type Output = Done;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Done> {
        if self.cancel.poll_cancelled(cx) {
            self.fut = None; // drop the handler now
            return Poll::Ready((self.id, None, None));
        }
        self.poll_handler(cx)
    }
}

/// A handler that did not finish in its first poll, running on a task of its own so that it
/// holds up no other call of its connection (it may block its thread, await for long, burn
/// CPU). The connection task polls this handle for the outcome.
pub(crate) struct Spawned {
    id: u32,
    task: tokio::task::JoinHandle<Done>,
}

impl Spawned {
    /// Moves a running handler to a task of its own. Its call's cancellation still reaches it
    /// (`Running` drops the handler when it fires).
    pub(crate) fn spawn(running: Running) -> Spawned {
        Spawned {
            id: running.id,
            task: tokio::spawn(running),
        }
    }
}

impl Future for Spawned {
    type Output = Done;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Done> {
        match Pin::new(&mut self.task).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(done)) => Poll::Ready(done),
            // `Running` catches a handler's panics; this is the same answer should one escape.
            Poll::Ready(Err(e)) if e.is_panic() => {
                tracing::error!(
                    call = self.id,
                    "a handler task panicked; its call ends with INTERNAL"
                );
                Poll::Ready((self.id, Some(Outcome::Finished(Err(panicked()))), None))
            }
            // Aborted (the runtime is shutting down): the call is over.
            Poll::Ready(Err(_)) => Poll::Ready((self.id, None, None)),
        }
    }
}

impl Drop for Spawned {
    /// The connection is gone: its handlers stop too (they were told through their calls'
    /// cancellation already; this covers a handler between two polls).
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn panicked() -> Status {
    Status::internal("the handler panicked (the server's log has the details)")
}

/// Credit for a server-side request stream goes back through the connection task.
pub(crate) struct ServerCredit {
    pub(crate) tx: mpsc::Sender<SCmd>,
    pub(crate) id: u32,
}

impl CreditReturn for ServerCredit {
    fn give_back(&self, credit: u32) {
        crate::connection::send_now(
            &self.tx,
            SCmd::Credit {
                id: self.id,
                bytes: credit,
            },
        );
    }
    fn abandon(&self) {}
}

pub(crate) type HandlerRef = Arc<dyn Handler>;
