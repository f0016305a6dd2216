//! Interceptors: code that runs around every call (or every call of one service), on the
//! client and on the server — authentication, logging, metrics.
//!
//! An [`Interceptor`] sees a call when it starts ([`Interceptor::on_call`]: read and change the
//! request metadata, or reject the call with a [`Status`]) and when it ends
//! ([`Interceptor::on_end`]: its status code and duration). It is synchronous and costs no
//! allocation of its own; an [`AsyncInterceptor`] may wait (a token lookup …) and returns a
//! boxed future, paid for only by the calls it applies to.
//!
//! They are registered on a [`ServerBuilder`](crate::ServerBuilder) or an
//! [`Endpoint`](crate::Endpoint), for every call or for one service (a method-name prefix such
//! as `/kv.Store/`), and run in registration order, outer to inner: the first registered sees
//! the call first and its end last. When one rejects a call, the ones after it do not run
//! (neither their `on_call` nor their `on_end`); on a server the handler does not run either,
//! on a client nothing is sent. With none registered a call pays one `is_empty()` check.
//!
//! ```
//! use topspin::interceptor::{CallInfo, Interceptor};
//! use topspin::Status;
//!
//! /// Rejects calls without the right bearer token.
//! struct Auth(&'static str);
//!
//! impl Interceptor for Auth {
//!     fn on_call(&self, call: &mut CallInfo) -> Result<(), Status> {
//!         match call.metadata().get_str("authorization") {
//!             Some(v) if v.strip_prefix("Bearer ") == Some(self.0) => Ok(()),
//!             _ => Err(Status::unauthenticated("a valid bearer token is required")),
//!         }
//!     }
//! }
//!
//! let builder = topspin::Server::builder().interceptor(Auth("s3cret"));
//! # let _ = builder;
//! ```

pub(crate) mod server;

use crate::transport::PeerAddr;
use crate::{Code, Metadata, Status};
use bytestring::ByteString;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use topspin_proto::InvalidMetadata;

pub use crate::observe::Side;

/// A boxed future, as [`AsyncInterceptor::on_call`] returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A call as an interceptor sees it when it starts: its method, its request metadata (which
/// an interceptor may change), and what else is known of it.
#[derive(Debug)]
pub struct CallInfo {
    side: Side,
    method: ByteString,
    metadata: Metadata,
    peer: Option<PeerAddr>,
    deadline: Option<Instant>,
    id: u64,
}

impl CallInfo {
    pub(crate) fn new(
        side: Side,
        method: ByteString,
        metadata: Metadata,
        peer: Option<PeerAddr>,
        deadline: Option<Instant>,
        id: u64,
    ) -> CallInfo {
        CallInfo {
            side,
            method,
            metadata,
            peer,
            deadline,
            id,
        }
    }

    /// Client or server.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The full method name, e.g. `/kv.Store/Get`.
    pub fn method(&self) -> &str {
        &self.method
    }

    /// The request metadata (as changed by the interceptors before this one).
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Replaces the request metadata.
    pub fn set_metadata(&mut self, metadata: Metadata) {
        self.metadata = metadata;
    }

    /// Adds an entry to the request metadata (text, or binary for a key ending in `-bin`),
    /// after the ones already there.
    pub fn append_metadata(&mut self, key: &str, value: &[u8]) -> Result<(), InvalidMetadata> {
        let mut b = Metadata::builder();
        for (k, v) in self.metadata.iter() {
            b = b.entry(k, v)?;
        }
        self.metadata = b.entry(key, value)?.build();
        Ok(())
    }

    /// Server: the client's address.
    pub fn peer_addr(&self) -> Option<&PeerAddr> {
        self.peer.as_ref()
    }

    /// The call's deadline, if it has one.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// A number naming the call among the calls of its connection (server: the call id of the
    /// wire; client: the call's number on its channel).
    pub fn call_id(&self) -> u64 {
        self.id
    }
}

/// How a call ended, as [`Interceptor::on_end`] sees it.
#[derive(Debug)]
pub struct CallEnd<'a> {
    pub(crate) status: &'a Status,
    pub(crate) duration: Duration,
    pub(crate) request_bytes: u64,
    pub(crate) response_bytes: u64,
}

impl CallEnd<'_> {
    /// The status code (`OK` when it succeeded).
    pub fn code(&self) -> Code {
        self.status.code()
    }

    /// The whole status.
    pub fn status(&self) -> &Status {
        self.status
    }

    /// Time from the start of the call (on the server: its dispatch to the handler; on the
    /// client: the call's start) to its end.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// Bytes of request messages: the request of a unary or server-streaming call. On the
    /// server, for a request stream: the frames the handler consumed, as flow control counts
    /// them (each message plus its 12-byte frame header); on the client, 0 for a stream.
    pub fn request_bytes(&self) -> u64 {
        self.request_bytes
    }

    /// Bytes of response messages: the response of a unary or client-streaming call; on the
    /// client, every message of a response stream.
    pub fn response_bytes(&self) -> u64 {
        self.response_bytes
    }
}

/// Runs around calls, synchronously: no boxing, no allocation of its own.
///
/// Both methods have empty defaults: implement the ones you need.
pub trait Interceptor: Send + Sync + 'static {
    /// A call starts: read or change its metadata, or reject it (the server's handler does
    /// not run; the client sends nothing; the caller gets the status).
    fn on_call(&self, call: &mut CallInfo) -> Result<(), Status> {
        let _ = call;
        Ok(())
    }

    /// The call ended (called once for every call whose `on_call` ran, also when it rejected
    /// the call; inner interceptors first).
    fn on_end(&self, call: &CallInfo, end: &CallEnd<'_>) {
        let _ = (call, end);
    }
}

/// Runs around calls and may wait before a call goes on (a token lookup, a rate limiter).
/// Its future is boxed; only the calls it applies to pay for it.
///
/// ```
/// use topspin::interceptor::{AsyncInterceptor, BoxFuture, CallInfo};
/// use topspin::Status;
///
/// struct SlowAuth;
/// impl AsyncInterceptor for SlowAuth {
///     fn on_call<'a>(&'a self, call: &'a mut CallInfo) -> BoxFuture<'a, Result<(), Status>> {
///         Box::pin(async move {
///             tokio::task::yield_now().await; // ask a token service
///             match call.metadata().get_str("authorization") {
///                 Some(_) => Ok(()),
///                 None => Err(Status::unauthenticated("no token")),
///             }
///         })
///     }
/// }
/// ```
pub trait AsyncInterceptor: Send + Sync + 'static {
    /// A call starts; like [`Interceptor::on_call`], but may wait.
    fn on_call<'a>(&'a self, call: &'a mut CallInfo) -> BoxFuture<'a, Result<(), Status>>;

    /// The call ended; like [`Interceptor::on_end`].
    fn on_end(&self, call: &CallInfo, end: &CallEnd<'_>) {
        let _ = (call, end);
    }
}

/// An [`Interceptor`] from a closure run when a call starts (see [`from_fn`]).
pub struct FnInterceptor<F>(F);

impl<F> fmt::Debug for FnInterceptor<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnInterceptor")
    }
}

impl<F> Interceptor for FnInterceptor<F>
where
    F: Fn(&mut CallInfo) -> Result<(), Status> + Send + Sync + 'static,
{
    fn on_call(&self, call: &mut CallInfo) -> Result<(), Status> {
        (self.0)(call)
    }
}

/// An interceptor from a closure run when a call starts.
///
/// ```
/// use topspin::interceptor::{from_fn, CallInfo};
/// let add_token = from_fn(|call: &mut CallInfo| {
///     call.append_metadata("authorization", b"Bearer s3cret")
///         .map_err(|e| topspin::Status::internal(e.to_string()))
/// });
/// let endpoint = topspin::Endpoint::new("tcp://127.0.0.1:50051").unwrap().interceptor(add_token);
/// # let _ = endpoint;
/// ```
pub fn from_fn<F>(f: F) -> FnInterceptor<F>
where
    F: Fn(&mut CallInfo) -> Result<(), Status> + Send + Sync + 'static,
{
    FnInterceptor(f)
}

/// One registered interceptor.
#[derive(Clone)]
pub(crate) enum Layer {
    Sync(Arc<dyn Interceptor>),
    Async(Arc<dyn AsyncInterceptor>),
}

impl Layer {
    fn on_end(&self, call: &CallInfo, end: &CallEnd<'_>) {
        match self {
            Layer::Sync(i) => i.on_end(call, end),
            Layer::Async(i) => i.on_end(call, end),
        }
    }
}

/// An interceptor with the calls it applies to.
#[derive(Clone)]
pub(crate) struct Entry {
    /// A method-name prefix (`/pkg.Service/`), or every method.
    prefix: Option<Box<str>>,
    layer: Layer,
}

impl Entry {
    fn applies(&self, method: &str) -> bool {
        self.prefix.as_deref().is_none_or(|p| method.starts_with(p))
    }
}

/// The interceptors of a server or a channel, in registration order (outer to inner).
#[derive(Clone, Default)]
pub(crate) struct Chain {
    entries: Arc<[Entry]>,
}

impl fmt::Debug for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} interceptor(s)", self.entries.len())
    }
}

/// How far the synchronous part of a chain got.
pub(crate) enum Step {
    /// Every interceptor accepted the call.
    Done,
    /// The interceptor at this index is asynchronous: go on with [`Chain::run_from`].
    Async(usize),
    /// Rejected; the interceptors before `ran` ran (they see the end).
    Rejected { ran: usize, status: Status },
}

impl Chain {
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The chain with one more interceptor, innermost (at build time only).
    pub(crate) fn push(&self, prefix: Option<&str>, layer: Layer) -> Chain {
        let mut v: Vec<Entry> = self.entries.to_vec();
        v.push(Entry {
            prefix: prefix.map(Box::from),
            layer,
        });
        Chain { entries: v.into() }
    }

    /// The chain with one more synchronous interceptor (for `prefix`'s methods, or all).
    pub(crate) fn with_sync(&self, prefix: Option<&str>, i: impl Interceptor) -> Chain {
        self.push(prefix, Layer::Sync(Arc::new(i)))
    }

    /// The chain with one more asynchronous interceptor (for `prefix`'s methods, or all).
    pub(crate) fn with_async(&self, prefix: Option<&str>, i: impl AsyncInterceptor) -> Chain {
        self.push(prefix, Layer::Async(Arc::new(i)))
    }

    /// The interceptors that apply to `method`, in order.
    pub(crate) fn for_method(&self, method: &str) -> Chain {
        let v: Vec<Entry> = self
            .entries
            .iter()
            .filter(|e| e.applies(method))
            .cloned()
            .collect();
        Chain { entries: v.into() }
    }

    /// Whether any interceptor applies to `method`.
    pub(crate) fn any_for(&self, method: &str) -> bool {
        self.entries.iter().any(|e| e.applies(method))
    }

    /// Runs the synchronous `on_call`s from `from` on, up to the first asynchronous one.
    pub(crate) fn run_sync(&self, from: usize, call: &mut CallInfo) -> Step {
        for (i, e) in self.entries.iter().enumerate().skip(from) {
            if !e.applies(&call.method) {
                continue;
            }
            match &e.layer {
                Layer::Sync(s) => {
                    // A panicking interceptor fails its call alone (INTERNAL), never the
                    // connection task it may run on.
                    let r = std::panic::catch_unwind(AssertUnwindSafe(|| s.on_call(call)))
                        .unwrap_or_else(|_| {
                            tracing::error!(method = %call.method, "an interceptor panicked");
                            Err(Status::internal("an interceptor panicked"))
                        });
                    if let Err(status) = r {
                        return Step::Rejected { ran: i + 1, status };
                    }
                }
                Layer::Async(_) => return Step::Async(i),
            }
        }
        Step::Done
    }

    /// Runs every `on_call` from `from` on (the one at `from` is asynchronous). `ran` always
    /// tells how far it got (the interceptors before it have started their `on_call`), also
    /// when this future is dropped half-way (cancelled, deadline).
    pub(crate) async fn run_from(
        &self,
        from: usize,
        call: &mut CallInfo,
        ran: &mut usize,
    ) -> Result<(), Status> {
        let mut next = from;
        loop {
            match self.run_sync(next, call) {
                Step::Done => {
                    *ran = self.entries.len();
                    return Ok(());
                }
                Step::Rejected { ran: r, status } => {
                    *ran = r;
                    return Err(status);
                }
                Step::Async(i) => {
                    let Layer::Async(a) = &self.entries[i].layer else {
                        unreachable!("run_sync stops at asynchronous interceptors only")
                    };
                    *ran = i + 1;
                    a.on_call(call).await?;
                    next = i + 1;
                }
            }
        }
    }

    /// Tells the interceptors before `ran` (those whose `on_call` ran) how the call ended,
    /// inner first.
    pub(crate) fn end(&self, ran: usize, call: &CallInfo, end: &CallEnd<'_>) {
        for e in self.entries[..ran.min(self.entries.len())].iter().rev() {
            if e.applies(&call.method) {
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| e.layer.on_end(call, end)));
                if r.is_err() {
                    tracing::error!(method = %call.method, "an interceptor panicked in on_end");
                }
            }
        }
    }
}

/// What is known of an observed call until it ends: its interceptors, its span, its sizes.
/// Dropped before [`Record::finish`], the call counts as cancelled (or past its deadline).
pub(crate) struct Record {
    chain: Chain,
    pub(crate) info: CallInfo,
    /// How many of the chain's interceptors ran their `on_call`.
    ran: usize,
    pub(crate) span: Option<tracing::Span>,
    start: Instant,
    pub(crate) request_bytes: u64,
    pub(crate) response_bytes: u64,
    /// Bytes of a request stream, counted as the handler consumes it.
    pub(crate) consumed: Option<Arc<std::sync::atomic::AtomicU64>>,
    done: bool,
}

impl Record {
    pub(crate) fn new(chain: Chain, info: CallInfo, span: Option<tracing::Span>) -> Record {
        Record {
            ran: chain.len(),
            chain,
            info,
            span,
            start: Instant::now(),
            request_bytes: 0,
            response_bytes: 0,
            consumed: None,
            done: false,
        }
    }

    /// Runs the interceptors' `on_call`s up to the first asynchronous one (a rejection is
    /// recorded as the call's end): `Ok(Some(i))` when the interceptor at `i`
    /// is asynchronous (go on with [`Record::start_from`]).
    pub(crate) fn start_sync(&mut self) -> Result<Option<usize>, Status> {
        let step = {
            let _entered = self.span.as_ref().map(tracing::Span::enter);
            self.chain.run_sync(0, &mut self.info)
        };
        match step {
            Step::Done => Ok(None),
            Step::Async(i) => {
                self.ran = i; // the rest has not run yet
                Ok(Some(i))
            }
            Step::Rejected { ran, status } => {
                self.ran = ran;
                self.finish(&status);
                Err(status)
            }
        }
    }

    /// Runs the `on_call`s from the asynchronous one at `from` on, inside the call's span and
    /// within its deadline, if any (past it the call ends `DEADLINE_EXCEEDED`).
    pub(crate) async fn start_from(
        &mut self,
        from: usize,
        deadline: Option<Instant>,
    ) -> Result<(), Status> {
        use tracing::Instrument;
        let chain = self.chain.clone();
        let span = self.span.clone();
        let run = chain.run_from(from, &mut self.info, &mut self.ran);
        let run = async move {
            match span {
                Some(span) => run.instrument(span).await,
                None => run.await,
            }
        };
        let result = match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), run)
                .await
                .unwrap_or_else(|_| {
                    Err(Status::deadline_exceeded(
                        "the deadline passed while an interceptor was deciding",
                    ))
                }),
            None => run.await,
        };
        result.inspect_err(|status| self.finish(status))
    }

    /// The call ended with `status` (only the first end counts).
    pub(crate) fn finish(&mut self, status: &Status) {
        if self.done {
            return;
        }
        self.done = true;
        let duration = self.start.elapsed();
        let consumed = self
            .consumed
            .as_ref()
            .map_or(0, |c| c.load(std::sync::atomic::Ordering::Relaxed));
        let end = CallEnd {
            status,
            duration,
            request_bytes: self.request_bytes + consumed,
            response_bytes: self.response_bytes,
        };
        self.chain.end(self.ran, &self.info, &end);
        if let Some(span) = &self.span {
            crate::observe::record_end(span, status.code(), duration);
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        if !self.done {
            let status = if self.info.deadline.is_some_and(|d| Instant::now() >= d) {
                Status::deadline_exceeded("the call's deadline passed")
            } else {
                Status::cancelled("the call was cancelled")
            };
            self.finish(&status);
        }
    }
}
