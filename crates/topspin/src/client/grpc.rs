//! gRPC client mode: a connection task that takes the same [`Cmd`]s as the topspin
//! connection (`conn.rs`) and feeds the same [`Sink`]s, but speaks gRPC over HTTP/2 (the `h2`
//! crate's client) to an existing gRPC server — tonic, grpc-go, grpcio, … — for the channels of
//! `grpc://host:port` (h2c, prior knowledge) and `grpcs://host:port` (TLS, ALPN `h2`)
//! addresses. The generated clients and every `Channel` call kind work unchanged.
//!
//! One router task keeps the calls of the connection by token and forwards their commands;
//! each call runs as a task of its own around its h2 stream: request headers (`:path` = the
//! method, `grpc-timeout` from the deadline, metadata), 5-byte-prefixed messages, response
//! headers, messages and trailers into the call's sink. Flow control stays bounded as on the
//! native protocol: a response stream's DATA is released to the server as the application
//! consumes its messages (`Cmd::Credit`), and a request stream's next message is taken only
//! once h2 has window for what was queued before it.
//!
//! A third task drives the HTTP/2 connection and keeps its timers — handshake (the server's
//! SETTINGS), frame, write, idle and keep-alive PINGs — by the one liveness policy a native
//! connection keeps (`grpc::live`, `connection::liveness`), reading what the server sends as it
//! passes to h2 (`grpc::watch`).

use super::conn::{call_over, expired_before_sent, expired_while_waiting, not_sent};
use super::conn::{refused_unsent, Broken, Outcome};
use super::conn::{CallStart, Cmd, ConnHandle, ConnShared, Sink, COMMAND_QUEUE};
use crate::compression::{self, Encoding};
use crate::connection::Ack;
use crate::grpc::live::{Lapse, LapseTimer, Pings, Timers};
use crate::grpc::wire::{self, Deframer, Frame};
use crate::{Address, Config, Metadata, Status};
use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use h2::{RecvStream, SendStream};
use http::header::{HeaderValue, CONTENT_TYPE, TE, USER_AGENT};
use http::uri::{Authority, PathAndQuery, Scheme};
use rustc_hash::FxHashMap;
use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

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
    /// A call's stream window (`Config::initial_call_window`, clamped as h2 is told).
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
    // `initial_call_window` of DATA not yet consumed, per connection eight of those, response
    // headers and trailers `max_metadata_size` (at least 8 KiB, what gRPC servers assume).
    let max_metadata = config.max_metadata_size().max(8 * 1024);
    let window = config
        .initial_call_window()
        .clamp(65_535, topspin_proto::MAX_WINDOW);
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
    let (idle_tx, idle_rx) = watch::channel(true);
    let away = CancellationToken::new();
    let driven = Drive {
        tracker,
        started,
        config: config.clone(),
        shared: shared.clone(),
        closed: closed.clone(),
        address: address.clone(),
        idle: idle_rx,
        away: away.clone(),
    };
    tokio::spawn(driven.run(connection, ready));
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
    let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
    // One message per ending call; the calls of a connection are bounded (the server's
    // concurrent-stream limit plus `Config::max_pending_calls`), so is this queue.
    let (done_tx, done_rx) = mpsc::unbounded_channel();
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
            closed,
        }),
        calls: FxHashMap::default(),
        max_calls: config.max_pending_calls(),
        done_tx,
    };
    tokio::spawn(router.run(rx, done_rx, idle_tx, away));
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
    /// No call is open (the router's).
    idle: watch::Receiver<bool>,
    /// Told when the connection was idle too long: the router ends once its calls have.
    away: CancellationToken,
}

impl Drive {
    /// Drives the HTTP/2 connection until it ends or a timer of the one liveness policy
    /// (`grpc::live`: handshake, frame, write, idle, keep-alive) says it must; `ready` is told
    /// when the first PING, sent at once, is answered.
    async fn run<T>(
        self,
        mut connection: h2::client::Connection<crate::grpc::watch::Watched<T>, Frame>,
        ready: oneshot::Sender<Result<(), h2::Error>>,
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
            mut idle,
            away,
        } = self;
        let changed = crate::grpc::watch::read(&tracker).changed.clone();
        let mut pings = Pings::new(connection.ping_pong());
        pings.send();
        let mut ready = Some(ready);
        let mut timers = Timers::new(tracker, started, &config);
        let lapse = tokio::time::sleep_until(started.into());
        tokio::pin!(lapse);
        let mut timer = LapseTimer::default();
        let (mut going, mut routed) = (false, true);
        let why = loop {
            let is_idle = *idle.borrow_and_update() && !going;
            let next = timers.next(is_idle);
            timer.arm(lapse.as_mut(), next);
            tokio::select! {
                r = &mut connection => break r.err().map(|e| e.to_string()),
                () = poll_fn(|cx| timer.poll(lapse.as_mut(), cx)), if next.is_some() => {
                    timer.armed = None;
                    match timers.lapsed(is_idle, &mut pings) {
                        Some(Lapse::Close(why)) => {
                            let _ = closed.set(why.clone());
                            break Some(why);
                        }
                        Some(Lapse::Idle) => {
                            // New calls go to a new connection; this one closes once the
                            // router is gone (with it h2's last handle).
                            going = true;
                            shared.unusable.store(true, Ordering::Release);
                            away.cancel();
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
                r = idle.changed(), if routed => routed = r.is_ok(),
                // A frame became incomplete or writes stalled: re-arm for its timer.
                () = poll_fn(|_| if changed.take() { Poll::Ready(()) } else { Poll::Pending }) => {}
                // The handshake was given up on (its timeout).
                () = poll_fn(|cx| ready.as_mut().map_or(Poll::Pending, |r| r.poll_closed(cx))) => {
                    break None;
                }
            }
        };
        // Dropping the connection fails its open streams (UNAVAILABLE in their calls).
        shared.unusable.store(true, Ordering::Release);
        drop(connection);
        if let Some(why) = why {
            tracing::debug!("gRPC connection to {address} ended: {why}");
        }
    }
}

/// Routes the channel's commands to the calls of one connection.
struct Router {
    send: SendRequest<Frame>,
    base: Arc<Base>,
    /// The calls by token: at most `max_calls` plus the server's concurrent-stream limit.
    calls: FxHashMap<u64, mpsc::UnboundedSender<CallCmd>>,
    max_calls: usize,
    /// Each call's task sends its token here when it ends (at most one per call in `calls`).
    done_tx: mpsc::UnboundedSender<u64>,
}

impl Router {
    /// Runs until every handle is gone, or the connection loop said it was idle too long
    /// (`away`; it marked the connection unusable, so new calls go to a new connection) and
    /// the calls left have ended. Tells `idle` whether no call is open.
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Cmd>,
        mut done_rx: mpsc::UnboundedReceiver<u64>,
        idle: watch::Sender<bool>,
        away: CancellationToken,
    ) {
        let mut leaving = false;
        loop {
            tokio::select! {
                biased;
                Some(token) = done_rx.recv() => {
                    self.calls.remove(&token);
                }
                cmd = rx.recv() => match cmd {
                    Some(cmd) => self.apply(cmd),
                    // Every handle is gone: nobody waits for an answer any more.
                    None => break,
                },
                () = away.cancelled(), if !leaving => leaving = true,
            }
            let none = self.calls.is_empty();
            if leaving && none {
                // What raced in is refused as not sent (safe to retry).
                rx.close();
                while let Ok(cmd) = rx.try_recv() {
                    self.apply(cmd);
                }
                break;
            }
            idle.send_if_modified(|was| std::mem::replace(was, none) != none);
        }
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
        let done = self.done_tx.clone();
        let (send, base) = (self.send.clone(), self.base.clone());
        tokio::spawn(async move {
            let token = call.token;
            GrpcCall::new(base, call.method.clone(), sink)
                .run(send, call, rx)
                .await;
            let _ = done.send(token);
        });
    }
}

mod call;
use call::*;
