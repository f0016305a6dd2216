//! gRPC client mode: a connection task that takes the same [`Cmd`]s as the topspin
//! connection (`conn.rs`) and feeds the same [`Sink`]s, but speaks gRPC over HTTP/2 (the `h2`
//! crate's client) to an existing gRPC server — tonic, grpc-go, grpcio, … — for the channels of
//! `grpc://host:port` (h2c, prior knowledge) and `grpcs://host:port` (TLS, ALPN `h2`)
//! addresses. The generated clients and every `Channel` call kind work unchanged.
//!
//! One task per connection, as on the gRPC face: it drives the HTTP/2 connection, keeps its
//! timers — handshake (the server's SETTINGS), frame, write, idle and keep-alive PINGs — by the
//! one liveness policy a native connection keeps (`grpc::live`, `connection::liveness`, reading
//! what the server sends as it passes to h2, `grpc::watch`), routes the channel's commands to
//! the calls by token ([`Router`]), and runs every call beside it: each call is a future around
//! its h2 stream — request headers (`:path` = the method, `grpc-timeout` from the deadline,
//! metadata), 5-byte-prefixed messages, response headers, messages and trailers into the call's
//! sink. A call's bytes thus pass no task but the connection's between h2 and the caller (the
//! wake-ups h2 gives its own task become more turns of one poll, `grpc::live::Coalesced`).
//! Flow control stays bounded as on the native protocol: a response stream's DATA is released
//! to the server as the application consumes its messages (`Cmd::Credit`), and a request
//! stream's next message is taken only once h2 has window for what was queued before it.

use super::conn::{call_over, expired_before_sent, expired_while_waiting, not_sent};
use super::conn::{refused_unsent, Broken, Outcome};
use super::conn::{CallStart, Cmd, ConnHandle, ConnShared, Sink, COMMAND_QUEUE};
use crate::compression::{self, Encoding};
use crate::connection::Ack;
use crate::grpc::live::{Coalesced, Lapse, LapseTimer, Pings, Timers};
use crate::grpc::wire::{self, Deframer, Frame};
use crate::{Address, Config, Metadata, Status};
use bytes::Bytes;
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use h2::client::{ResponseFuture, SendRequest};
use h2::{RecvStream, SendStream};
use http::header::{HeaderValue, CONTENT_TYPE, TE, USER_AGENT};
use http::uri::{Authority, PathAndQuery, Scheme};
use rustc_hash::FxHashMap;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};

/// How often a call whose response credit is withheld (memory budget spent) looks for room
/// again.
const RETRY_WINDOW: Duration = Duration::from_millis(20);

/// The encodings this client decodes, as announced in `grpc-accept-encoding`.
const ACCEPT_ENCODING: HeaderValue = HeaderValue::from_static(wire::ACCEPT);

/// What a call's task is told by the router.
#[derive(Debug)]
enum CallCmd {
    Send(crate::codec::Payload, Ack),
    HalfClose,
    Credit(u32),
    Cancel,
}

/// What every call of a connection shares.
#[derive(Debug)]
struct Base {
    address: Address,
    scheme: Scheme,
    authority: Authority,
    /// Largest response message accepted (also after decompression).
    limit: usize,
    /// A call's stream window (`grpc::stream_window`, as h2 is told).
    window: usize,
    /// What decompressed responses are charged to (`Config::memory_budget`).
    budget: Arc<topspin_proto::MemoryBudget>,
    /// The buffer split responses are gathered in, kept between them (`wire::Spare`).
    spare: Arc<wire::Spare>,
    shared: Arc<ConnShared>,
    /// Largest response header (and trailer) list accepted.
    max_metadata: u32,
    /// Why this side closed the connection (a timer: keep-alive, frame, write), for the errors
    /// of its calls.
    closed: Arc<std::sync::OnceLock<String>>,
}

/// Runs a gRPC client connection over a connected byte stream (TCP, or TLS that negotiated
/// `h2`): the HTTP/2 handshake, then the connection's tasks.
pub(crate) async fn start<T>(
    io: T,
    address: &Address,
    config: &Config,
    scheme: Scheme,
) -> Result<ConnHandle, Status>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let what = |e: &dyn std::fmt::Display| {
        Status::unavailable(format!("could not connect to {address}: {e}"))
    };
    let authority = address
        .host_port()
        .and_then(|hp| Authority::try_from(hp).ok())
        .ok_or_else(|| what(&"the address has no host:port"))?;
    // Windows and header sizes bound what the server can make this side hold: per stream
    // `initial_call_window` (plus room for the prefixes, `grpc::stream_window`) of DATA not
    // yet consumed, per connection eight of those, response
    // headers and trailers `max_metadata_size` (at least 8 KiB, what gRPC servers assume).
    let max_metadata = config.max_metadata_size().max(8 * 1024);
    let window = crate::grpc::stream_window(config);
    let mut builder = h2::client::Builder::new();
    builder
        .initial_window_size(window)
        .initial_connection_window_size(window.saturating_mul(8).min(topspin_proto::MAX_WINDOW))
        .max_header_list_size(max_metadata)
        .max_frame_size(config.max_frame_size().clamp(16_384, 16_777_215))
        .enable_push(false);
    // What the server sends is read along for the connection's timers (`grpc::watch`).
    let started = Instant::now();
    let (io, tracker) = crate::grpc::watch::Watched::of_server(io);
    let (send, connection) = builder
        .handshake::<_, Frame>(io)
        .await
        .map_err(|e| what(&format!("HTTP/2 handshake failed: {e}")))?;
    let shared = Arc::new(ConnShared::default());
    let closed = Arc::new(std::sync::OnceLock::new());
    let (ready, answered) = oneshot::channel();
    let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
    let router = Router {
        send,
        base: Arc::new(Base {
            address: address.clone(),
            scheme,
            authority,
            limit: config.max_message_size() as usize,
            window: window as usize,
            budget: config.memory_budget(),
            spare: Arc::new(wire::Spare::new(Some(config.memory_budget()))),
            shared: shared.clone(),
            max_metadata,
            closed: closed.clone(),
        }),
        calls: FxHashMap::default(),
        running: FuturesUnordered::new(),
        max_calls: config.max_pending_calls(),
    };
    let driven = Drive {
        tracker,
        started,
        config: config.clone(),
        shared: shared.clone(),
        closed: closed.clone(),
        address: address.clone(),
    };
    tokio::spawn(Coalesced::new(driven.run(connection, ready, router, rx)));
    // One PING answered (the server's SETTINGS came first): the peer speaks HTTP/2 (a port
    // that does not fails here, not at the first call). The caller bounds the wait with the
    // handshake timeout.
    match answered.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            return Err(what(&format!(
                "no HTTP/2 answer ({e}): is it a gRPC server, and does its port use TLS (grpcs://)?"
            )))
        }
        Err(_) => {
            let why = closed.get().map_or("the connection closed", String::as_str);
            return Err(what(&format!("no HTTP/2 answer ({why})")));
        }
    }
    Ok(ConnHandle::new(tx, shared, None))
}

/// What the loop that drives the HTTP/2 connection keeps.
struct Drive {
    tracker: Arc<std::sync::Mutex<crate::grpc::watch::Tracker>>,
    started: Instant,
    config: Config,
    shared: Arc<ConnShared>,
    /// Why this side closed the connection, for the errors of its calls.
    closed: Arc<std::sync::OnceLock<String>>,
    address: Address,
}

/// How long the calls of a connection that ended have to see so (their streams fail at once
/// once h2's connection is dropped; this only bounds a call that would not end).
const WIND_DOWN: Duration = Duration::from_secs(5);

impl Drive {
    /// Drives the HTTP/2 connection and its calls until every handle is gone, the connection
    /// ends, a timer of the one liveness policy (`grpc::live`: handshake, frame, write, idle,
    /// keep-alive) says it must, or it was idle too long (marked unusable, so new calls go to a
    /// new connection) and the calls left have ended; `ready` is told when the first PING, sent
    /// at once, is answered.
    async fn run<T>(
        self,
        mut connection: h2::client::Connection<crate::grpc::watch::Watched<T>, Frame>,
        ready: oneshot::Sender<Result<(), h2::Error>>,
        mut router: Router,
        mut rx: mpsc::Receiver<Cmd>,
    ) where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let Drive {
            tracker,
            started,
            config,
            shared,
            closed,
            address,
        } = self;
        let changed = crate::grpc::watch::read(&tracker).changed.clone();
        let mut pings = Pings::new(connection.ping_pong());
        pings.send();
        let mut ready = Some(ready);
        let mut timers = Timers::new(tracker, started, &config);
        let lapse = tokio::time::sleep_until(started.into());
        tokio::pin!(lapse);
        let mut timer = LapseTimer::default();
        let mut leaving = false;
        let why = loop {
            if leaving && router.calls.is_empty() {
                // What raced in is refused as not sent (safe to retry).
                rx.close();
                while let Ok(cmd) = rx.try_recv() {
                    router.apply(cmd);
                }
                break None;
            }
            let is_idle = router.calls.is_empty() && !leaving;
            let next = timers.next(is_idle);
            timer.arm(lapse.as_mut(), next);
            tokio::select! {
                r = &mut connection => break r.err().map(|e| e.to_string()),
                Some(token) = router.running.next(), if !router.running.is_empty() => {
                    router.calls.remove(&token);
                }
                cmd = rx.recv() => match cmd {
                    Some(cmd) => router.apply(cmd),
                    // Every handle is gone: nobody waits for an answer any more.
                    None => break None,
                },
                () = poll_fn(|cx| timer.poll(lapse.as_mut(), cx)), if next.is_some() => {
                    timer.armed = None;
                    match timers.lapsed(is_idle, &mut pings) {
                        Some(Lapse::Close(why)) => {
                            let _ = closed.set(why.clone());
                            break Some(why);
                        }
                        Some(Lapse::Idle) => {
                            // New calls go to a new connection; this one closes once the
                            // calls left have ended.
                            leaving = true;
                            shared.unusable.store(true, Ordering::Release);
                            tracing::debug!("gRPC connection to {address} idle for {:?}: closing", config.idle_timeout());
                        }
                        None => {}
                    }
                }
                pong = poll_fn(|cx| pings.poll_pong(cx)) => {
                    if pong.is_ok() {
                        timers.alive();
                    }
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(pong);
                    }
                }
                // A frame became incomplete or writes stalled: re-arm for its timer.
                () = poll_fn(|_| if changed.take() { Poll::Ready(()) } else { Poll::Pending }) => {}
                // The handshake was given up on (its timeout).
                () = poll_fn(|cx| ready.as_mut().map_or(Poll::Pending, |r| r.poll_closed(cx))) => {
                    break None;
                }
            }
        };
        shared.unusable.store(true, Ordering::Release);
        router.wind_down(connection, why.is_none()).await;
        if let Some(why) = why {
            tracing::debug!("gRPC connection to {address} ended: {why}");
        }
    }
}

/// A call running on its connection's task; its token once it ended.
type Running = Pin<Box<dyn Future<Output = u64> + Send>>;

/// Routes the channel's commands to the calls of one connection, and holds the calls.
struct Router {
    send: SendRequest<Frame>,
    base: Arc<Base>,
    /// The calls by token: at most `max_calls` plus the server's concurrent-stream limit.
    calls: FxHashMap<u64, mpsc::UnboundedSender<CallCmd>>,
    /// The calls' futures (one per entry of `calls`, until it ends).
    running: FuturesUnordered<Running>,
    max_calls: usize,
}

impl Router {
    /// The connection's loop ended: a graceful end (`graceful`: no error, nobody waits or the
    /// connection was idle) lets h2 finish what the calls left have queued and say GOAWAY;
    /// then the connection is dropped, which fails its open streams (UNAVAILABLE in their
    /// calls, which are run until they have told their callers so).
    async fn wind_down<T>(
        self,
        mut connection: h2::client::Connection<crate::grpc::watch::Watched<T>, Frame>,
        graceful: bool,
    ) where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let Router {
            send, mut running, ..
        } = self;
        drop(send);
        if graceful && running.is_empty() {
            // No handle and no stream left: h2 closes the connection (GOAWAY) and resolves.
            let _ = tokio::time::timeout(WIND_DOWN, &mut connection).await;
        }
        drop(connection);
        let _ = tokio::time::timeout(WIND_DOWN, async { while running.next().await.is_some() {} })
            .await;
    }

    fn forward(&mut self, token: u64, cmd: CallCmd) {
        let Some(tx) = self.calls.get(&token) else {
            if let CallCmd::Send(_, ack) = cmd {
                let _ = ack.send(Err(call_over()));
            }
            return;
        };
        if let Err(mpsc::error::SendError(cmd)) = tx.send(cmd) {
            self.calls.remove(&token);
            if let CallCmd::Send(_, ack) = cmd {
                let _ = ack.send(Err(call_over()));
            }
        }
    }

    fn apply(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Start(s) => self.start(s.into_parts()),
            Cmd::Batch(v) => v.into_iter().for_each(|s| self.start(s.into_parts())),
            Cmd::Send {
                token,
                message,
                ack,
            } => self.forward(token, CallCmd::Send(message, ack)),
            Cmd::HalfClose { token } => self.forward(token, CallCmd::HalfClose),
            Cmd::Credit { token, bytes } => self.forward(token, CallCmd::Credit(bytes)),
            Cmd::Cancel { token, .. } => {
                self.forward(token, CallCmd::Cancel);
                self.calls.remove(&token);
            }
        }
    }

    fn start(&mut self, (call, sink): (CallStart, Sink)) {
        if sink.abandoned() {
            return;
        }
        if self.base.shared.unusable.load(Ordering::Acquire) {
            sink.fail(not_sent(format_args!(
                "the connection to {} closed",
                self.base.address
            )));
            return;
        }
        let room = self
            .max_calls
            .saturating_add(self.send.current_max_send_streams());
        if self.calls.len() >= room {
            sink.fail(Status::resource_exhausted(format!(
                "{}: {} calls are open or wait on this connection to {} (the server's concurrent-stream limit plus Config::max_pending_calls)",
                &*call.method,
                self.calls.len(),
                self.base.address
            )));
            return;
        }
        // Commands of one call: at most one request message in flight (its pump waits for the
        // ack), one half-close, a cancel, and credit for messages delivered (each message holds
        // at least 5 bytes of the stream's window, so at most window/5 of them).
        let (tx, rx) = mpsc::unbounded_channel();
        self.calls.insert(call.token, tx);
        let (send, base) = (self.send.clone(), self.base.clone());
        self.running.push(Box::pin(async move {
            let token = call.token;
            GrpcCall::new(base, call.method.clone(), sink)
                .run(send, call, rx)
                .await;
            token
        }));
    }
}

mod call;
use call::*;
