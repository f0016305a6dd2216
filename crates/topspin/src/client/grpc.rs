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

use super::conn::{call_over, expired_before_sent, expired_while_waiting, not_sent};
use super::conn::{refused_unsent, Broken, Outcome};
use super::conn::{CallStart, Cmd, ConnHandle, ConnShared, Sink, COMMAND_QUEUE};
use crate::compression::{self, Encoding};
use crate::connection::Ack;
use crate::grpc::wire::{self, Deframer, Frame};
use crate::{Address, Config, Metadata, Status};
use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use h2::{RecvStream, SendStream};
use http::header::{HeaderValue, CONTENT_TYPE, TE, USER_AGENT};
use http::uri::{Authority, PathAndQuery, Scheme};
use rustc_hash::FxHashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
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
    /// A call's stream window (`Config::initial_call_window`, clamped as h2 is told).
    window: usize,
    /// What decompressed responses are charged to (`Config::memory_budget`).
    budget: Arc<topspin_proto::MemoryBudget>,
    shared: Arc<ConnShared>,
    /// Largest response header (and trailer) list accepted.
    max_metadata: u32,
    /// Why this side closed the connection (keep-alive), for the errors of its calls.
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
    let (send, mut connection) = builder
        .handshake::<T, Frame>(io)
        .await
        .map_err(|e| what(&format!("HTTP/2 handshake failed: {e}")))?;
    let shared = Arc::new(ConnShared::default());
    let mut pings = connection.ping_pong();
    let (stop, stopped) = oneshot::channel();
    let closed = Arc::new(std::sync::OnceLock::new());
    tokio::spawn(drive(
        connection,
        stopped,
        shared.clone(),
        closed.clone(),
        address.clone(),
    ));
    // One PING answered: the peer speaks HTTP/2 (a port that does not fails here, not at the
    // first call). The caller bounds the wait with the handshake timeout.
    if let Some(p) = pings.as_mut() {
        if let Err(e) = p.ping(h2::Ping::opaque()).await {
            let _ = stop.send(String::new());
            return Err(what(&format!(
                "no HTTP/2 answer ({e}): is it a gRPC server, and does its port use TLS (grpcs://)?"
            )));
        }
    }
    if let (Some(p), Some(every)) = (pings, config.keepalive_interval()) {
        tokio::spawn(keep_alive(p, every, config.keepalive_timeout(), stop));
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
            shared: shared.clone(),
            max_metadata,
            closed,
        }),
        calls: FxHashMap::default(),
        max_calls: config.max_pending_calls(),
        done_tx,
    };
    tokio::spawn(router.run(rx, done_rx, config.idle_timeout()));
    Ok(ConnHandle::new(tx, shared, None))
}

/// Drives the HTTP/2 connection until it ends or `stop` says why it must.
async fn drive<T>(
    mut connection: h2::client::Connection<T, Frame>,
    mut stop: oneshot::Receiver<String>,
    shared: Arc<ConnShared>,
    closed: Arc<std::sync::OnceLock<String>>,
    address: Address,
) where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let why = tokio::select! {
        r = &mut connection => r.err().map(|e| e.to_string()),
        // (a dropped sender disables this branch: no keep-alive)
        Ok(why) = &mut stop => {
            let _ = closed.set(why.clone());
            Some(why)
        }
    };
    // Dropping the connection fails its open streams (UNAVAILABLE in their calls).
    shared.unusable.store(true, Ordering::Release);
    drop(connection);
    if let Some(why) = why {
        tracing::debug!("gRPC connection to {address} ended: {why}");
    }
}

/// HTTP/2 keep-alive (`grpc::keep_alive`); tells `stop` why the connection must close once a
/// PING is not answered, unless the connection went first.
async fn keep_alive(
    pings: h2::PingPong,
    every: Duration,
    timeout: Duration,
    mut stop: oneshot::Sender<String>,
) {
    tokio::select! {
        why = crate::grpc::keep_alive(pings, every, timeout) => {
            let _ = stop.send(why);
        }
        () = stop.closed() => {}
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
    /// Runs until every handle is gone, or the connection has had no call for `idle`
    /// (`Config::idle_timeout`): then it is marked unusable (new calls go to a new connection)
    /// and closed.
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Cmd>,
        mut done_rx: mpsc::UnboundedReceiver<u64>,
        idle: Option<Duration>,
    ) {
        let idle_for = idle.unwrap_or(crate::connection::FAR);
        let idle_timer = tokio::time::sleep(idle_for);
        tokio::pin!(idle_timer);
        let mut busy = false;
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
                () = &mut idle_timer, if idle.is_some() && self.calls.is_empty() => {
                    self.base.shared.unusable.store(true, Ordering::Release);
                    // What raced in is refused as not sent (safe to retry).
                    rx.close();
                    while let Ok(cmd) = rx.try_recv() {
                        self.apply(cmd);
                    }
                    tracing::debug!("gRPC connection to {} idle for {idle_for:?}: closing", self.base.address);
                    break;
                }
            }
            if !self.calls.is_empty() {
                busy = true;
            } else if std::mem::take(&mut busy) {
                idle_timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + idle_for);
            }
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
