//! The server's side of a connection: the [`Role`] that dispatches calls to handlers and polls
//! each once itself, so a call answered at once needs no hand-off to another thread; a handler
//! that is not done after that first poll goes on on a task of its own. The connection loop is
//! `crate::connection`'s.

use super::call::{self, Received, ServerCall, Waiting};
use super::handler::{
    BoxFut, HandlerRef, Input, IoRef, Outcome, Running, SCmd, ServerCredit, Spawned,
};
use super::Registry;
use crate::connection::{Blocked, Driver, Lapse, Role};
use crate::request::{Cancellation, ServerContext};
use crate::streaming::Item;
use crate::transport::Transport;
use crate::{Config, Status};
use bytes::Bytes;
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_util::sync::WaitForCancellationFutureOwned;
use topspin_proto::{CallId, Connection, ErrorCode, Event, Metadata, Side};

/// Commands from a connection's handlers queued before they wait for room.
const COMMAND_QUEUE: usize = 1024;
/// Commands taken per turn.
const COMMANDS_PER_TURN: usize = 256;

/// A call's state (the call core's, `server::call`), with what this face keeps of its answer.
type Call = ServerCall<Waits>;

/// What a started call keeps of its answer while it waits for the client's credit.
#[derive(Default)]
struct Waits {
    /// A message waiting for credit (boxed: rare, and keeps the call's state small).
    blocked: Option<Box<Blocked>>,
    /// The handler finished while a message was still being sent.
    end: Option<Box<(Status, Metadata)>>,
}

/// Serves one connection over `transport` until it ends.
pub(crate) async fn serve<T: Transport>(
    transport: T,
    registry: Arc<Registry>,
    config: Config,
    shutdown: super::Shutdown,
) {
    let peer = transport.peer_addr();
    #[cfg(feature = "tls")]
    let tls = transport.tls_peer();
    let context = Arc::new(crate::request::ConnContext {
        peer,
        #[cfg(feature = "tls")]
        tls,
        compression: config.compression(),
        max_message_size: config.max_message_size(),
        budget: config.memory_budget(),
        protocol: crate::request::Protocol::Topspin,
    });
    let role = ServerRole::new(registry, context, shutdown);
    Driver::new(transport, role, config).run().await;
}

impl ServerRole {
    /// The dispatch of one connection whose calls share `context`.
    fn new(
        registry: Arc<Registry>,
        context: Arc<crate::request::ConnContext>,
        shutdown: super::Shutdown,
    ) -> ServerRole {
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let mut role = ServerRole {
            registry,
            context,
            calls: FxHashMap::default(),
            handlers: FuturesUnordered::new(),
            tx,
            rx,
            shutdown_signal: Box::pin(shutdown.token.clone().cancelled_owned()),
            shutdown_waker: None,
            shutdown,
            grace_deadline: None,
            cancel_pool: Vec::new(),
            fut_pool: Vec::new(),
            by_id: Vec::new(),
            go_away_pending: false,
            deferred: VecDeque::new(),
            held: 0,
            room: usize::MAX,
        };
        // A shutdown that began before this connection was accepted applies at once.
        if let Some(d) = role.shutdown.deadline() {
            role.grace_deadline = Some(d);
            role.go_away_pending = true;
        }
        role
    }
}

/// The server's dispatch on one connection.
pub(crate) struct ServerRole {
    registry: Arc<Registry>,
    /// The peer, its certificate, compression and limits: every call's context shares it.
    context: Arc<crate::request::ConnContext>,
    calls: FxHashMap<u32, Call>,
    /// Handlers that did not answer in their first poll, each on a task of its own.
    handlers: FuturesUnordered<Spawned>,
    tx: mpsc::Sender<SCmd>,
    rx: mpsc::Receiver<SCmd>,
    shutdown: super::Shutdown,
    shutdown_signal: Pin<Box<WaitForCancellationFutureOwned>>,
    /// The waker `shutdown_signal` holds (from its last poll, which was `Pending`).
    shutdown_waker: Option<std::task::Waker>,
    grace_deadline: Option<Instant>,
    /// A shutdown began before the engine could be told.
    go_away_pending: bool,
    /// Cancellation handles of finished calls, reused.
    cancel_pool: Vec<Cancellation>,
    /// Boxes of finished handler futures, reused.
    fut_pool: Vec<BoxFut>,
    /// Handlers by the method ids the client interned on this connection.
    by_id: Vec<Option<HandlerRef>>,
    /// Calls that arrived while the send buffer was full: started (in order) once the client
    /// has read enough, so that a client that never reads cannot make the server answer — and
    /// queue — more. Bounded by what one read brings in (the server stops reading while full)
    /// and by `max_concurrent_calls`.
    deferred: VecDeque<(Running, super::handler::HandlerRef)>,
    /// The send buffer's room when the current event or command batch began.
    room: usize,
    /// Bytes of replies and stream messages kept in `calls` for the client's credit
    /// (`Role::held`).
    held: usize,
}

impl Role for ServerRole {
    const SIDE: Side = Side::Server;

    fn poll_work(&mut self, cx: &mut Context<'_>, conn: &mut Connection, room: usize) -> Poll<()> {
        let full = room == 0;
        if self.go_away_pending {
            self.go_away_pending = false;
            conn.go_away(ErrorCode::NO_ERROR, "server shutting down");
            return Poll::Ready(());
        }
        // While the client does not read what it was sent, handlers get no turn and their
        // output waits in the (bounded) queue.
        if !full {
            if let Some((running, handler)) = self.deferred.pop_front() {
                // A call that arrived while the client was not reading starts now.
                self.room = room;
                self.run_inline(running, &handler, None, conn);
                return Poll::Ready(());
            }
            if !self.handlers.is_empty() {
                if let Poll::Ready(Some((id, outcome, fut))) = self.handlers.poll_next_unpin(cx) {
                    self.recycle(fut);
                    if let Some(o) = outcome {
                        self.finish(id, o, conn);
                    }
                    return Poll::Ready(());
                }
            }
            if self.commands_possible() {
                if let Poll::Ready(Some(cmd)) = self.rx.poll_recv(cx) {
                    // What else is queued goes in the same write, up to the send buffer's room:
                    // counted from before the first command, so that at most one message goes
                    // past it (a handler on another thread may queue its next message while
                    // this batch is applied).
                    let base = conn.transmit_len();
                    self.apply(cmd, conn);
                    for _ in 0..COMMANDS_PER_TURN {
                        if conn.transmit_len().saturating_sub(base) >= room {
                            break;
                        }
                        match self.rx.try_recv() {
                            Ok(cmd) => self.apply(cmd, conn),
                            Err(_) => break,
                        }
                    }
                    return Poll::Ready(());
                }
            }
        }
        if self.grace_deadline.is_none() && self.shutdown_signalled(cx) {
            self.grace_deadline = Some(self.shutdown.deadline().unwrap_or_else(Instant::now));
            conn.go_away(ErrorCode::NO_ERROR, "server shutting down");
            return Poll::Ready(());
        }
        Poll::Pending
    }

    fn on_event(&mut self, event: Event, conn: &mut Connection, room: usize) {
        self.room = room;
        match event {
            started @ Event::CallStarted { .. } => self.on_call(started, conn),
            Event::Message {
                id,
                message,
                credit,
            } => self.on_message(id, message, credit, conn),
            Event::HalfClosed { id } => self.on_half_closed(id.0, conn),
            Event::Cancelled { id, status } => self.on_cancelled(id.0, status),
            Event::Writable { id } => self.on_writable(id.0, conn),
            _ => {}
        }
    }

    fn next_timer(&self) -> Option<Instant> {
        self.grace_deadline
    }

    fn on_timer(&mut self, now: Instant, conn: &mut Connection, lapse: Lapse) {
        if lapse == Lapse::Closed {
            return;
        }
        if self.grace_deadline.is_some_and(|d| now >= d) {
            // The grace period is over: end what is left.
            let ids: Vec<u32> = self.calls.keys().copied().collect();
            for id in ids {
                self.end(id, call::shut_down(), Metadata::new(), conn);
            }
        }
    }

    fn stop(&self) -> Option<&'static str> {
        None
    }

    fn idle(&self) -> bool {
        self.calls.is_empty()
    }

    fn held(&self) -> usize {
        self.held
    }

    fn on_end(&mut self, _conn: &mut Connection, why: &str) {
        tracing::debug!(peer = %self.context.peer, "server connection ends: {why}");
        // Running handlers stop with their calls (`call::Cancel`, dropped with them).
        self.deferred.clear();
        self.held = 0;
        self.calls.clear();
    }
}

impl ServerRole {
    /// Whether a command can be waiting or arrive: `false` while nothing is queued and no
    /// handler holds a clone of `tx` (a response stream's sender, a request stream's credit
    /// return). Until this task clones it again nothing can be sent, so the receiver needs no
    /// poll (nor the waker it registers): the idle turn of every unary call saves that poll.
    #[inline]
    fn commands_possible(&self) -> bool {
        // `tx` is ours for the role's lifetime: a count of 1 is ours alone. A sender that
        // sent and then dropped its clone is seen with its message (the count is read with
        // acquire ordering), so the queue is looked at once no other sender is left.
        self.rx.sender_strong_count() > 1 || !self.rx.is_empty()
    }

    /// Whether the server began shutting down; registers the task's waker otherwise.
    ///
    /// Fast path: the signal is polled (its waker put in the token's waiter list, a lock and a
    /// list walk) only when the waker it holds would not wake this task; otherwise the waiter
    /// stays registered, a cancellation wakes the task through it, and one atomic load
    /// (`is_cancelled`) tells. This runs every time the connection task goes idle.
    fn shutdown_signalled(&mut self, cx: &mut Context<'_>) -> bool {
        if self
            .shutdown_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            return self.shutdown.token.is_cancelled();
        }
        if self.shutdown_signal.as_mut().poll(cx).is_ready() {
            return true;
        }
        self.shutdown_waker = Some(cx.waker().clone());
        false
    }

    fn ctx(&mut self, method: bytestring::ByteString, deadline: Option<Instant>) -> ServerContext {
        ServerContext {
            deadline,
            encoding: None,
            compressed: false,
            method,
            cancel: self.cancel_pool.pop().unwrap_or_default(),
            conn: self.context.clone(),
        }
    }

    fn on_message(&mut self, id: CallId, message: Bytes, credit: u32, conn: &mut Connection) {
        let received = match self.calls.get_mut(&id.0) {
            Some(call) => call.on_message(message, credit, false),
            None => Ok(Received::Unwanted(credit)),
        };
        match received {
            // The one request message's credit is never needed again (the client half-closes
            // with it), so none goes back; a queued one's goes back as the handler consumes.
            Ok(Received::Kept | Received::Queued) => {}
            Ok(Received::Unwanted(credit)) => {
                let _ = conn.grant_credit(id, credit);
            }
            Err(st) => self.end(id.0, st, Metadata::new(), conn),
        }
    }

    fn on_half_closed(&mut self, id: u32, conn: &mut Connection) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        match call.on_half_closed() {
            Ok(None) => {}
            Ok(Some((w, m))) => {
                self.calls.remove(&id);
                self.spawn(id, w.handler, Some(m), w.metadata, w.ctx, conn);
            }
            Err(st) => self.end(id, st, Metadata::new(), conn),
        }
    }

    fn on_cancelled(&mut self, id: u32, status: Status) {
        if let Some(call) = self.calls.remove(&id) {
            if let Some(waits) = call.over(Some(&status), Some(&mut self.cancel_pool)) {
                self.let_go(waits, status);
            }
        }
    }

    /// What an ended call kept of its answer: a message waiting for credit is told `why`.
    fn let_go(&mut self, waits: Waits, why: Status) {
        if let Some((m, ack)) = waits.blocked.map(|b| *b) {
            self.held = self.held.saturating_sub(m.len());
            let _ = ack.send(Err(why));
        }
    }

    /// The handler of a method, looked up by the id the client interned it under when it has
    /// one (a vector index), by name otherwise; the status that refuses the call if there is
    /// none.
    fn handler(&mut self, method: &str, method_id: u16) -> Result<HandlerRef, Status> {
        let slot = usize::from(method_id);
        if let Some(Some(h)) = self.by_id.get(slot) {
            return Ok(h.clone());
        }
        let h = call::lookup(&self.registry, method)?;
        if method_id != 0 {
            if self.by_id.len() <= slot {
                self.by_id.resize(slot + 1, None);
            }
            self.by_id[slot] = Some(h.clone());
        }
        Ok(h)
    }

    fn on_call(&mut self, started: Event, conn: &mut Connection) {
        let Event::CallStarted {
            id: CallId(id),
            method,
            method_id,
            codec,
            deadline,
            metadata,
        } = started
        else {
            return;
        };
        let handler = match self.handler(&method, method_id) {
            Ok(h) => h,
            Err(st) => return self.end(id, st, Metadata::new(), conn),
        };
        if handler.codec() != codec {
            let st = Status::unimplemented(format!(
                "method {} takes codec {} (0 protobuf, 1 raw bytes, 2 JSON), the call used codec {codec}",
                &*method,
                handler.codec()
            ));
            self.end(id, st, Metadata::new(), conn);
            return;
        }
        let ctx = self.ctx(method, deadline);
        if handler.kind().client_streams() {
            // Requests arrive as a stream: the handler starts now.
            self.spawn(id, handler, None, metadata, ctx, conn);
        } else {
            // Fast path: a unary or server-streaming call's one request and its half-close
            // usually come in the same read as its start, as the next two events. Taken now,
            // the call starts without parking in `calls` (an insert, two lookups and a removal
            // of a large entry). Anything else (a second message, the request in a later
            // read) takes the usual path below, in the same order.
            let is_ours = |e: &Event, want_message: bool| match e {
                Event::Message { id: m, .. } => want_message && m.0 == id,
                Event::HalfClosed { id: m } => !want_message && m.0 == id,
                _ => false,
            };
            let message = match conn.poll_event_if(|e| is_ours(e, true)) {
                // Its credit is never needed again (as in `on_message`).
                Some(Event::Message { message, .. }) => Some(message),
                _ => None,
            };
            if message.is_some() && conn.poll_event_if(|e| is_ours(e, false)).is_some() {
                self.spawn(id, handler, message, metadata, ctx, conn);
                return;
            }
            let waiting = Waiting::new(handler, metadata, ctx, message);
            self.calls.insert(id, ServerCall::Waiting(waiting));
        }
    }

    fn spawn(
        &mut self,
        id: u32,
        handler: super::handler::HandlerRef,
        message: Option<Bytes>,
        metadata: Metadata,
        ctx: ServerContext,
        conn: &mut Connection,
    ) {
        let (input, inbound) = match message {
            Some(m) => (Input::One(m), None),
            None => {
                // Flow-controlled: the client sends at most a window ahead of what the handler
                // has consumed.
                let (tx, rx) = mpsc::unbounded_channel();
                let credit = Box::new(ServerCredit {
                    tx: self.tx.clone(),
                    id,
                });
                (Input::Stream { rx, credit }, Some(tx))
            }
        };
        let io = IoRef { tx: &self.tx, id };
        let recycled = self.fut_pool.pop();
        let running = match call::prepare(id, &handler, input, metadata, ctx, io, recycled) {
            Ok(r) => r,
            Err((st, ctx)) => {
                self.end(id, st, Metadata::new(), conn);
                ctx.cancel.recycle(&mut self.cancel_pool);
                return;
            }
        };
        if self.room == 0 {
            // The client is not reading what it is sent: answer nothing more for now.
            self.register(id, running.cancel.clone(), inbound);
            self.deferred.push_back((running, handler));
            return;
        }
        self.run_inline(running, &handler, Some(inbound), conn);
    }

    /// Puts a call that has a running handler in `calls`.
    fn register(
        &mut self,
        id: u32,
        cancel: Cancellation,
        inbound: Option<mpsc::UnboundedSender<Item>>,
    ) {
        let cancel = call::Cancel::running(cancel);
        self.calls
            .insert(id, ServerCall::started(cancel, inbound, Waits::default()));
    }

    /// Polls a new handler once on the connection task, then leaves it to a task of its own
    /// if it did not answer.
    ///
    /// `fresh` (with the call's request stream, if any) for a call not yet in `calls`: a
    /// handler that answers in this first poll usually ends its call at once, and the call
    /// then never goes there (an insert and a removal saved); it goes there when its handler
    /// goes on, or when its answer has to wait. `None`: a deferred call, in `calls` already.
    fn run_inline(
        &mut self,
        mut running: Running,
        handler: &super::handler::HandlerRef,
        fresh: Option<Option<mpsc::UnboundedSender<Item>>>,
        conn: &mut Connection,
    ) {
        // Most handlers answer at once: poll once now, so the answer leaves in the same write
        // as everything else this turn, without a trip through the scheduler. (A deferred call
        // cancelled while it waited to start is dropped unpolled: whoever cancelled it ended
        // its call.)
        match call::first_poll(&mut running, handler) {
            std::task::Poll::Ready((id, outcome, fut)) => {
                self.recycle(fut);
                let Some(o) = outcome else {
                    return;
                };
                match (fresh, o) {
                    // One answer, of a call with no request stream: the fast path.
                    (Some(None), Outcome::Reply(reply)) => {
                        self.reply_fresh(id, reply, running.cancel, conn)
                    }
                    (Some(inbound), o) => {
                        self.register(id, running.cancel, inbound);
                        self.finish(id, o, conn);
                    }
                    (None, o) => {
                        drop(running); // release its handle on the call's cancellation first
                        self.finish(id, o, conn);
                    }
                }
            }
            // The rest runs on a task of its own, so a handler that waits, blocks its thread
            // or burns CPU holds up no other call; the connection task collects its outcome.
            std::task::Poll::Pending => {
                if let Some(inbound) = fresh {
                    self.register(running.id, running.cancel.clone(), inbound);
                }
                self.handlers.push(Spawned::spawn(running));
            }
        }
    }
}

mod answer;

#[cfg(test)]
mod tests;
