//! The client's side of a connection: the [`Role`] that keeps its calls' bookkeeping, and
//! [`connect`]. The connection loop itself is `crate::connection`'s; callers talk to it through
//! one bounded command queue, except that a call on a quiet connection is started by its caller
//! under the driver's lock, taken with `try_lock` only (`ConnHandle::start_direct`): no caller
//! ever waits on it.

pub(crate) use crate::connection::send_now;
use crate::connection::{
    call_error_status, send_message, Ack, Blocked, Driver, Lapse, ReadRoute, Role, Sent,
    SharedDriver,
};
use crate::transport::Transport;
use crate::{Address, Config, Response, Status};
use bytes::Bytes;
use bytestring::ByteString;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use topspin_proto::{CallError, CallId, Code, Connection, ErrorCode, Event, Metadata, Side};

mod handle;
pub(crate) use handle::{CallStart, Cmd, ConnHandle, ConnShared, Sink, Start};
use handle::{Direct, StartDirect};
mod outcome;
pub(crate) use outcome::{call_over, expired_before_sent, expired_while_waiting, not_sent};
pub(crate) use outcome::{refused_unsent, Broken, Outcome};

pub(crate) type UnaryReply = super::completion::Completer<Result<Response<Bytes>, Status>>;

/// Commands queued per connection before callers wait for room (backpressure).
pub(crate) const COMMAND_QUEUE: usize = 1024;
/// Commands taken per turn, so reading and writing get their turn under load.
const COMMANDS_PER_TURN: usize = 256;

/// How [`ClientRole::try_start`] went.
enum Started {
    /// Over the server's concurrency limit: the call waits among the parked ones.
    Parked,
    /// It failed (its caller was told).
    Ended,
    /// Open under this id.
    Open(u32),
}

#[derive(Debug)]
struct Call {
    token: u64,
    method: ByteString,
    /// Where its answer goes, by the delivery rules both client modes share.
    outcome: Outcome,
    /// A message waiting for credit (boxed: rare, and keeps the call's state small).
    blocked: Option<Box<Blocked>>,
    half_close_after_blocked: bool,
    /// In `tokens`: its caller reaches it by token (a stream, or a call started from the
    /// queue, whose caller does not know its id).
    keyed: bool,
}

/// The driver, if its lock is free. Never waits: a lock held means the task is running (it
/// takes a queued call just as fast, and reads what arrives) or another caller is acting.
fn try_driver<T: Transport>(
    shared: &SharedDriver<ClientRole, T>,
) -> Option<std::sync::MutexGuard<'_, Option<Driver<ClientRole, T>>>> {
    match shared.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

impl<T: Transport> StartDirect for SharedDriver<ClientRole, T> {
    fn try_start(&self, s: &mut Option<Start>) -> Option<(u32, bool)> {
        let mut guard = try_driver(self)?;
        let d = guard.as_mut()?;
        let id = d
            .act_outside(|role, conn, room| role.start_direct(s, conn, room))
            .flatten()?;
        Some((id, d.wrote_last_act()))
    }

    fn read_inline(&self, cx: &mut Context<'_>, first: bool, waiting: &dyn Fn() -> bool) -> bool {
        try_driver(self).is_some_and(|mut guard| {
            guard
                .as_mut()
                .is_some_and(|d| d.read_inline(cx, first, waiting))
        })
    }
}

/// Runs a client connection over a connected transport; returns once the handshake is done.
pub(crate) async fn start<T: Transport>(
    transport: T,
    address: &Address,
    config: &Config,
) -> Result<ConnHandle, Status> {
    let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
    let (ready_tx, ready_rx) = oneshot::channel();
    let shared = Arc::new(ConnShared::default());
    let role = ClientRole {
        address: address.clone(),
        max_pending_calls: config.max_pending_calls(),
        rx,
        handles_open: true,
        calls: FxHashMap::default(),
        tokens: FxHashMap::default(),
        waiting: VecDeque::new(),
        deferred: Vec::new(),
        held_for_room: false,
        created: Instant::now(),
        shared: shared.clone(),
        ready: Some(ready_tx),
        close_error: None,
    };
    let route = Arc::new(ReadRoute::default());
    let driver = Driver::new(transport, role, config.clone()).with_route(route.clone());
    let driver = Arc::new(std::sync::Mutex::new(Some(driver)));
    tokio::spawn(Driver::run_shared(driver.clone()));
    let direct = Some(Direct(driver, route));
    match ready_rx.await {
        Ok(Ok(())) => Ok(ConnHandle::new(tx, shared, direct)),
        Ok(Err(status)) => Err(status),
        Err(_) => Err(Status::unavailable(format!(
            "could not connect to {address}: the connection task ended"
        ))),
    }
}

/// The client's call bookkeeping on one connection.
pub(crate) struct ClientRole {
    address: Address,
    max_pending_calls: usize,
    rx: mpsc::Receiver<Cmd>,
    handles_open: bool,
    calls: FxHashMap<u32, Call>,
    tokens: FxHashMap<u64, u32>,
    /// Calls waiting to start: over the server's concurrency limit, or while the send buffer
    /// is full (at most `max_pending_calls`; their deadlines run).
    waiting: VecDeque<Start>,
    shared: Arc<ConnShared>,
    /// Told when the handshake completes or fails.
    ready: Option<oneshot::Sender<Result<(), Status>>>,
    /// Why the engine closed the connection, if it said.
    close_error: Option<topspin_proto::ProtocolError>,
    /// Stream messages and half-closes held while the send buffer was full (at most one
    /// message per stream: each request pump waits for its message to be taken).
    deferred: Vec<Cmd>,
    /// Something waits for the send buffer to have room.
    held_for_room: bool,
    /// When the connection was set up: the `now` given to the engine for a call without a
    /// deadline (it reads it only to compute one).
    created: Instant,
}

impl Role for ClientRole {
    const SIDE: Side = Side::Client;

    fn poll_work(&mut self, cx: &mut Context<'_>, conn: &mut Connection, room: usize) -> Poll<()> {
        let r = self.work(cx, conn, room);
        // The queue was taken: the calls a balancer counted are in `open` now.
        if self.shared.queued.load(Ordering::Relaxed) != 0 {
            self.shared.queued.store(0, Ordering::Relaxed);
        }
        self.publish();
        r
    }

    fn on_event(&mut self, event: Event, conn: &mut Connection, room: usize) {
        self.event(event, conn, room);
        self.publish();
    }

    fn next_timer(&self) -> Option<Instant> {
        if self.waiting.is_empty() {
            return None;
        }
        self.waiting.iter().filter_map(|s| s.call.deadline).min()
    }

    fn on_timer(&mut self, now: Instant, _conn: &mut Connection, lapse: Lapse) {
        if lapse == Lapse::Idle {
            self.shared.mark_unusable();
        }
        if self
            .waiting
            .iter()
            .any(|s| s.call.deadline.is_some_and(|d| d <= now))
        {
            let (expired, kept) = std::mem::take(&mut self.waiting)
                .into_iter()
                .partition(|s: &Start| s.call.deadline.is_some_and(|d| d <= now));
            self.waiting = kept;
            for s in Vec::from(expired) {
                s.sink.fail(expired_while_waiting(
                    &s.call.method,
                    "to be sent (the server's max_concurrent_calls was reached, or it was not reading)",
                ));
            }
        }
    }

    fn stop(&self) -> Option<&'static str> {
        (!self.handles_open && self.calls.is_empty() && self.waiting.is_empty())
            .then_some("channel dropped")
    }

    fn idle(&self) -> bool {
        self.calls.is_empty()
    }

    fn on_end(&mut self, _conn: &mut Connection, why: &str) {
        self.shared.mark_unusable();
        if let Some(ready) = self.ready.take() {
            let _ = ready.send(Err(self.handshake_failure(why)));
        }
        let status = Status::unavailable(format!("connection to {} closed: {why}", self.address));
        for (_, mut call) in self.calls.drain() {
            call.outcome.fail(status.clone());
        }
        // Calls still waiting or queued were never written: safe to send elsewhere.
        let unsent = status.clone().with_unprocessed();
        for s in self.waiting.drain(..) {
            s.sink.fail(unsent.clone());
        }
        for cmd in self.deferred.drain(..) {
            cmd.fail(&status);
        }
        self.rx.close();
        while let Ok(cmd) = self.rx.try_recv() {
            cmd.fail(&unsent);
        }
    }
}

impl ClientRole {
    /// A call started from outside the connection's task ([`Driver::act_outside`]): only
    /// when nothing is ahead of it — no command queued, no call parked or held for room, the
    /// send buffer not full, the handshake done — so calls still start in the order they
    /// came. Gives the call back otherwise (it is then queued).
    fn start_direct(
        &mut self,
        s: &mut Option<Start>,
        conn: &mut Connection,
        room: usize,
    ) -> Option<Option<u32>> {
        if room == 0
            || !self.handles_open
            || self.ready.is_some()
            || self.held_for_room
            || !self.waiting.is_empty()
            || !self.deferred.is_empty()
            || !self.rx.is_empty()
        {
            return None;
        }
        // Not `apply`: its caller is here, so the call was not abandoned. A unary call's
        // caller learns its id: it is not put in `tokens`.
        let s = s.take()?;
        let unary = s.call.message.is_some() && matches!(s.sink, Sink::Unary(_));
        let id = self.start_now(s, conn, !unary).filter(|_| unary);
        // As when the task takes its queue (which is empty): the calls a balancer counted
        // are in `open` now.
        if self.shared.queued.load(Ordering::Relaxed) != 0 {
            self.shared.queued.store(0, Ordering::Relaxed);
        }
        self.publish();
        Some(id)
    }

    /// Publishes the connection's load for balancers (a relaxed store, only on change).
    fn publish(&self) {
        let open = (self.calls.len() + self.waiting.len()) as u32;
        if self.shared.open.load(Ordering::Relaxed) != open {
            self.shared.open.store(open, Ordering::Relaxed);
        }
    }

    fn work(&mut self, cx: &mut Context<'_>, conn: &mut Connection, room: usize) -> Poll<()> {
        let full = room == 0;
        let mut progressed = false;
        if !full && self.held_for_room {
            // The server has taken what was sent: what waited for room goes now.
            self.held_for_room = false;
            for cmd in std::mem::take(&mut self.deferred) {
                self.apply(cmd, conn);
            }
            self.start_waiting(conn);
            progressed = true;
        }
        if !self.handles_open {
            return if progressed {
                Poll::Ready(())
            } else {
                Poll::Pending
            };
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending if progressed => Poll::Ready(()),
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                self.handles_open = false;
                Poll::Ready(())
            }
            Poll::Ready(Some(cmd)) => {
                self.take(cmd, conn, full);
                // Take what else is queued so it all leaves in one write, holding back what
                // would pass the send buffer's room.
                let base = conn.transmit_len();
                for _ in 0..COMMANDS_PER_TURN {
                    match self.rx.try_recv() {
                        Ok(cmd) => {
                            let full = conn.transmit_len().saturating_sub(base) >= room;
                            self.take(cmd, conn, full);
                        }
                        Err(_) => break,
                    }
                }
                Poll::Ready(())
            }
        }
    }

    fn event(&mut self, event: Event, conn: &mut Connection, _room: usize) {
        match event {
            Event::Established => {
                if let Some(r) = self.ready.take() {
                    let _ = r.send(Ok(()));
                }
            }
            Event::Headers { id, metadata } => self.on_headers(id, metadata),
            Event::Message {
                id,
                message,
                credit,
            } => self.on_message(id, message, credit, conn),
            Event::Ended {
                id,
                status,
                trailers,
            } => self.on_ended(id, status, trailers, conn),
            Event::Writable { id } => self.on_writable(id, conn),
            Event::GoAway { .. } => {
                self.shared.mark_unusable();
                // Parked calls can never start here now.
                let st = not_sent(format_args!("{} is going away", self.address));
                for s in self.waiting.drain(..) {
                    s.sink.fail(st.clone());
                }
            }
            Event::Closed { error } => {
                self.shared.mark_unusable();
                self.close_error = error;
            }
            _ => {}
        }
    }

    fn handshake_failure(&self, why: &str) -> Status {
        let reason = match &self.close_error {
            Some(e) if e.code == ErrorCode::TIMEOUT => {
                format!("{} (is it a topspin server?)", e.reason)
            }
            Some(e) if answered_as_http2(&e.reason) => format!(
                "the server does not speak the topspin protocol ({e}); it answered as an HTTP/2 \
                 server: call a gRPC server with a grpc://host:port (or grpcs://) address"
            ),
            Some(e) => format!("the server does not speak the topspin protocol ({e})"),
            None if why == "connection closed" => {
                "the server closed the connection during the handshake (a tls:// or ws:// \
                 port closes a plaintext client so: is the address's scheme right?)"
                    .to_owned()
            }
            None => why.to_owned(),
        };
        Status::unavailable(format!("could not connect to {}: {reason}", self.address))
    }

    /// A command from a caller. While the connection's send buffer is full (the server is not
    /// taking what it is sent) new calls wait among the parked ones — bounded by
    /// `max_pending_calls`, their deadlines running — and stream messages wait too (each
    /// stream has at most one in flight); the rest (cancels, credit) apply at once.
    fn take(&mut self, cmd: Cmd, conn: &mut Connection, full: bool) {
        if !full {
            return self.apply(cmd, conn);
        }
        match cmd {
            Cmd::Start(s) => {
                self.held_for_room = true;
                self.park(s);
            }
            Cmd::Batch(v) => {
                self.held_for_room = true;
                v.into_iter().for_each(|s| self.park(s));
            }
            Cmd::Send { .. } | Cmd::HalfClose { .. } => {
                self.held_for_room = true;
                self.deferred.push(cmd);
            }
            Cmd::Cancel { .. } | Cmd::Credit { .. } => self.apply(cmd, conn),
        }
    }

    fn apply(&mut self, cmd: Cmd, conn: &mut Connection) {
        match cmd {
            Cmd::Start(s) => self.start(s, conn),
            Cmd::Batch(v) => v.into_iter().for_each(|s| self.start(s, conn)),
            Cmd::Send {
                token,
                message,
                ack,
            } => match self.tokens.get(&token) {
                Some(&id) => self.send(id, message, ack, conn),
                None => match self.parked(token) {
                    Some(s) => s.early.get_or_insert_default().send = Some((message, ack)),
                    None => {
                        let _ = ack.send(Err(call_over()));
                    }
                },
            },
            Cmd::HalfClose { token } => match self.tokens.get(&token) {
                Some(&id) => self.half_close(id, conn),
                None => {
                    if let Some(s) = self.parked(token) {
                        s.early.get_or_insert_default().half_close = true;
                    }
                }
            },
            Cmd::Cancel { token, id } => {
                let open = match id {
                    Some(id) if self.calls.get(&id).is_some_and(|c| c.token == token) => Some(id),
                    _ => self.tokens.get(&token).copied(),
                };
                if let Some(id) = open {
                    if let Some(call) = self.calls.remove(&id) {
                        if call.keyed {
                            self.tokens.remove(&token);
                        }
                    }
                    let _ = conn.cancel(CallId(id), Code::Cancelled);
                    self.start_waiting(conn);
                } else {
                    self.waiting.retain(|s| s.call.token != token);
                }
            }
            Cmd::Credit { token, bytes } => {
                if let Some(&id) = self.tokens.get(&token) {
                    let _ = conn.grant_credit(CallId(id), bytes);
                }
            }
        }
    }

    /// A call waiting for the server's concurrency limit.
    fn parked(&mut self, token: u64) -> Option<&mut Start> {
        self.waiting.iter_mut().find(|s| s.call.token == token)
    }

    fn start(&mut self, s: Start, conn: &mut Connection) {
        if s.sink.abandoned() {
            return;
        }
        self.start_now(s, conn, true);
    }

    /// Starts a call unless calls wait ahead of it (it parks behind them then); its id if it
    /// is open. `keyed`: see [`Call::keyed`].
    fn start_now(&mut self, s: Start, conn: &mut Connection, keyed: bool) -> Option<u32> {
        if !self.waiting.is_empty() {
            self.park(s);
            return None;
        }
        match self.try_start(s, conn, keyed) {
            Started::Open(id) => Some(id),
            Started::Parked | Started::Ended => None,
        }
    }

    /// Keeps a call until the server's concurrency limit lets it start.
    fn park(&mut self, s: Start) {
        if self.waiting.len() >= self.max_pending_calls {
            s.sink.fail(Status::resource_exhausted(format!(
                "{}: {} calls already wait to be sent on this connection (Config::max_pending_calls): the server's max_concurrent_calls is reached or it is not reading",
                &*s.call.method, self.max_pending_calls
            )));
            return;
        }
        self.waiting.push_back(s);
    }

    /// Starts a call, or parks it if the server's concurrency limit is reached. `keyed`: its
    /// caller reaches it by token (see [`Call::keyed`]).
    fn try_start(&mut self, s: Start, conn: &mut Connection, keyed: bool) -> Started {
        // The engine reads `now` only for a call with a timeout: the clock is read for those.
        let now = match s.call.deadline {
            Some(_) => Instant::now(),
            None => self.created,
        };
        let timeout = match s.call.deadline {
            Some(d) if d <= now => {
                s.sink.fail(expired_before_sent(&s.call.method));
                return Started::Ended;
            }
            Some(d) => Some(d - now),
            None => None,
        };
        let id = match conn.start_call(&s.call.method, s.call.codec, timeout, &s.call.metadata, now)
        {
            Ok(id) => id,
            // MAX_CONCURRENT_CALLS 0: the server takes no calls at all; waiting would be for
            // ever (protocol.md §9).
            Err(CallError::TooManyCalls { limit: 0 }) => {
                s.sink.fail(not_sent(format_args!(
                    "{} on {}: the server accepts no calls on this connection (its max_concurrent_calls is 0)",
                    &*s.call.method, self.address
                )));
                return Started::Ended;
            }
            Err(CallError::TooManyCalls { .. }) => {
                self.park(s);
                return Started::Parked;
            }
            Err(e) => {
                // start_call wrote nothing.
                s.sink.fail(refused_unsent(self.refused(e, &s.call.method)));
                return Started::Ended;
            }
        };
        let mut call = Call {
            token: s.call.token,
            method: s.call.method,
            outcome: Outcome::new(s.sink),
            blocked: None,
            half_close_after_blocked: false,
            keyed,
        };
        if let Some(message) = s.call.message {
            if !conn.is_writable(id) {
                // No credit yet (a server whose window is 0 grants it when the call arrives):
                // the request waits for Event::Writable like a stream message, then
                // half-closes (protocol.md §7: a sender without credit waits).
                let (ack, _) = tokio::sync::oneshot::channel();
                call.blocked = Some(Box::new((message, ack)));
                call.half_close_after_blocked = true;
            } else if let Err(e) = conn.send_message(id, message, true) {
                let _ = conn.cancel(id, Code::Cancelled);
                call.outcome.fail(self.refused(e, &call.method));
                return Started::Ended;
            }
        }
        if keyed {
            self.tokens.insert(call.token, id.0);
        }
        self.calls.insert(id.0, call);
        if let Some(early) = s.early {
            if let Some((message, ack)) = early.send {
                self.send(id.0, message, ack, conn);
            }
            if early.half_close {
                self.half_close(id.0, conn);
            }
        }
        Started::Open(id.0)
    }

    fn refused(&self, e: CallError, method: &str) -> Status {
        call_error_status(e, &format!("{method} on {}", self.address))
    }

    fn start_waiting(&mut self, conn: &mut Connection) {
        while let Some(s) = self.waiting.pop_front() {
            if s.sink.abandoned() {
                continue;
            }
            if let Started::Parked = self.try_start(s, conn, true) {
                // Parked again at the back: put it back in front, in order.
                if let Some(s) = self.waiting.pop_back() {
                    self.waiting.push_front(s);
                }
                break;
            }
        }
    }

    fn send(&mut self, id: u32, message: crate::codec::Payload, ack: Ack, conn: &mut Connection) {
        match send_message(conn, CallId(id), message, ack) {
            Sent::Done => {}
            Sent::Blocked(b) => match self.calls.get_mut(&id) {
                Some(call) => call.blocked = Some(b),
                None => {
                    let _ = b.1.send(Err(call_over()));
                }
            },
            Sent::Refused(e, ack) => {
                let method = self
                    .calls
                    .get(&id)
                    .map(|c| c.method.clone())
                    .unwrap_or_default();
                let status = self.refused(e, &method);
                let _ = ack.send(Err(status.clone()));
                // A request the server would refuse (too large …) ends the call: the server
                // is told, and the caller gets the reason.
                let _ = conn.cancel(CallId(id), Code::Cancelled);
                if let Some(mut call) = self.finish(id, conn) {
                    call.outcome.fail(status);
                }
            }
        }
    }

    fn half_close(&mut self, id: u32, conn: &mut Connection) {
        if let Some(call) = self.calls.get_mut(&id) {
            if call.blocked.is_some() {
                call.half_close_after_blocked = true;
            } else if let Err(CallError::WouldBlock) = conn.half_close(CallId(id)) {
                // A split message is still going out: half-close once it is (Writable).
                call.half_close_after_blocked = true;
            }
        }
    }

    fn finish(&mut self, id: u32, conn: &mut Connection) -> Option<Call> {
        let call = self.calls.remove(&id)?;
        if call.keyed {
            self.tokens.remove(&call.token);
        }
        self.start_waiting(conn);
        Some(call)
    }

    fn on_headers(&mut self, id: CallId, metadata: Metadata) {
        if let Some(call) = self.calls.get_mut(&id.0) {
            call.outcome.on_headers(metadata);
        }
    }

    fn on_message(&mut self, id: CallId, message: Bytes, credit: u32, conn: &mut Connection) {
        let Some(call) = self.calls.get_mut(&id.0) else {
            return;
        };
        if let Err(Broken) = call
            .outcome
            .on_message(message, credit, false, &call.method)
        {
            // Its caller was told: the server is too.
            let _ = conn.cancel(id, Code::Cancelled);
            self.finish(id.0, conn);
        }
    }

    fn on_ended(&mut self, id: CallId, status: Status, trailers: Metadata, conn: &mut Connection) {
        let Some(mut call) = self.finish(id.0, conn) else {
            return;
        };
        let failures = &self.shared.failures;
        if status.code() == Code::Unavailable {
            failures.fetch_add(1, Ordering::Relaxed);
        } else if failures.load(Ordering::Relaxed) != 0 {
            failures.store(0, Ordering::Relaxed);
        }
        if let Some((_, ack)) = call.blocked.take().map(|b| *b) {
            let _ = ack.send(Err(status.clone()));
        }
        // A call above the last_call_id of the server's GOAWAY was not processed
        // (protocol.md §8.3).
        if !status.is_ok() && conn.go_away_received().is_some_and(|last| id.0 > last.0) {
            return call.outcome.unprocessed(status);
        }
        call.outcome.on_end(status, trailers, &call.method);
    }

    fn on_writable(&mut self, id: CallId, conn: &mut Connection) {
        let Some(call) = self.calls.get_mut(&id.0) else {
            return;
        };
        let half_close = std::mem::take(&mut call.half_close_after_blocked);
        if let Some((message, ack)) = call.blocked.take().map(|b| *b) {
            self.send(id.0, message, ack, conn);
        }
        if half_close {
            self.half_close(id.0, conn);
        }
    }
}

/// Whether a topspin handshake failure's reason shows the peer's first bytes to be an HTTP/2
/// SETTINGS frame (`… (got [0, 0, 18, 4, 0, 0, 0, 0, …])`): a gRPC server, reached with a
/// `tcp://` address instead of `grpc://`.
fn answered_as_http2(reason: &str) -> bool {
    let Some(start) = reason.find("(got [").map(|i| i + "(got [".len()) else {
        return false;
    };
    let Some(len) = reason[start..].find(']') else {
        return false;
    };
    let bytes: Vec<u8> = reason[start..start + len]
        .split(", ")
        .filter_map(|b| u8::from_str_radix(b.trim(), 16).ok())
        .collect();
    // A frame header: 24-bit length, type 4 (SETTINGS), flags 0, stream 0.
    matches!(bytes.as_slice(), [_, _, _, 4, 0, 0, 0, 0, ..])
}
