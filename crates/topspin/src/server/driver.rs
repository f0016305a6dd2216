//! The server's connection task: owns the engine and the socket, and polls the connection's
//! handlers itself, so a call is answered without a hand-off to another thread.

use super::handler::{BoxFut, CallIo, Input, Outcome, Running, SCmd, ServerCredit};
use super::Registry;
use crate::io::{Io, Lapse, Liveness, ReadError};
use crate::request::{Cancellation, ServerContext};
use crate::streaming::Item;
use crate::transport::{PeerAddr, Stream};
use crate::{Config, Status};
use bytes::Bytes;
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use rustc_hash::FxHashMap;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use topspin_proto::{
    CallError, CallId, Code, Connection, ErrorCode, Event, Metadata, ProtocolError, Side,
};

/// A message waiting for flow-control credit, and whom to tell when it is sent.
type Blocked = (Bytes, oneshot::Sender<Result<(), Status>>);

enum Call {
    /// Unary and server-streaming calls wait for their one request message.
    Awaiting {
        handler: super::handler::HandlerRef,
        metadata: Metadata,
        ctx: ServerContext,
        message: Option<Bytes>,
    },
    Running {
        cancel: Cancellation,
        inbound: Option<mpsc::UnboundedSender<Item>>,
        /// A message waiting for credit (boxed: rare, and keeps the call's state small).
        blocked: Option<Box<Blocked>>,
        /// The handler finished while a message was still being sent.
        end: Option<Box<(Status, Metadata)>>,
    },
}

pub(crate) struct ServerConn {
    conn: Connection,
    io: Io,
    registry: Arc<Registry>,
    config: Config,
    peer: PeerAddr,
    calls: FxHashMap<u32, Call>,
    handlers: FuturesUnordered<Running>,
    tx: mpsc::UnboundedSender<SCmd>,
    rx: mpsc::UnboundedReceiver<SCmd>,
    shutdown: super::Shutdown,
    grace_deadline: Option<Instant>,
    started: Instant,
    liveness: Liveness,
    /// Cancellation handles of finished calls, reused.
    cancel_pool: Vec<Cancellation>,
    /// Boxes of finished handler futures, reused.
    fut_pool: Vec<BoxFut>,
}

/// What woke a connection task.
enum Wake {
    Handler(super::handler::Done),
    Read,
    Cmd(SCmd),
    Write,
    Shutdown,
    Timer,
}

fn to_tokio(t: Instant) -> tokio::time::Instant {
    tokio::time::Instant::from_std(t)
}

impl ServerConn {
    pub(crate) fn new(
        stream: Stream,
        registry: Arc<Registry>,
        config: Config,
        shutdown: super::Shutdown,
    ) -> ServerConn {
        let peer = stream.peer_addr();
        let (tx, rx) = mpsc::unbounded_channel();
        ServerConn {
            conn: Connection::new(Side::Server, config.settings()),
            io: Io::new(stream),
            registry,
            config,
            peer,
            calls: FxHashMap::default(),
            handlers: FuturesUnordered::new(),
            tx,
            rx,
            shutdown,
            grace_deadline: None,
            started: Instant::now(),
            liveness: Liveness::default(),
            cancel_pool: Vec::new(),
            fut_pool: Vec::new(),
        }
    }

    pub(crate) async fn run(mut self) {
        // A shutdown that began before this connection was accepted applies at once.
        if let Some(d) = self.shutdown.deadline() {
            self.begin_shutdown(d);
        }
        let mut shutdown = Box::pin(self.shutdown.token.clone().cancelled_owned());
        let sleep = tokio::time::sleep_until(to_tokio(Instant::now()));
        tokio::pin!(sleep);
        let mut armed: Option<Instant> = None;
        let why = loop {
            let all_written = match self.io.flush(&mut self.conn) {
                Ok(w) => w,
                Err(e) => break format!("write failed: {e}"),
            };
            if self.conn.is_closed() {
                break "connection closed".to_string();
            }
            if self.conn.is_drained() && all_written {
                break "drained after go-away".to_string();
            }
            // One timer for the connection, moved only when the next deadline changes: no
            // clock read or timer registration on turns that need none.
            let timer = self.next_timer();
            if timer != armed {
                if let Some(t) = timer {
                    sleep.as_mut().reset(to_tokio(t));
                }
                armed = timer;
            }
            // Wait for the first of: a handler finishing, bytes to read, commands from
            // handlers, room to write, a shutdown, the timer. Polled by hand: cheaper than
            // `select!`, which rebuilds (and re-registers) every branch's future each turn.
            let wake = std::future::poll_fn(|cx| {
                if !self.handlers.is_empty() {
                    if let Poll::Ready(Some(done)) = self.handlers.poll_next_unpin(cx) {
                        return Poll::Ready(Ok(Wake::Handler(done)));
                    }
                }
                if let Poll::Ready(r) = self.io.stream.poll_read_ready(cx) {
                    return Poll::Ready(r.map(|()| Wake::Read));
                }
                if let Poll::Ready(Some(cmd)) = self.rx.poll_recv(cx) {
                    return Poll::Ready(Ok(Wake::Cmd(cmd)));
                }
                if !all_written {
                    if let Poll::Ready(r) = self.io.stream.poll_write_ready(cx) {
                        return Poll::Ready(r.map(|()| Wake::Write));
                    }
                }
                if self.grace_deadline.is_none() && shutdown.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Ok(Wake::Shutdown));
                }
                if armed.is_some() && sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Ok(Wake::Timer));
                }
                Poll::Pending
            })
            .await;
            match wake {
                Err(e) => break format!("socket failed: {e}"),
                Ok(Wake::Handler((id, outcome, fut))) => {
                    self.recycle(fut);
                    if let Some(o) = outcome {
                        self.finish(id, o);
                    }
                }
                Ok(Wake::Read) => {
                    match self.io.read(&mut self.conn) {
                        Ok(true) => {}
                        Ok(false) => self.conn.handle_eof(),
                        Err(ReadError::Io(e)) => self.conn.close(ProtocolError::new(
                            ErrorCode::InternalError,
                            format!("read failed: {e}"),
                        )),
                        Err(ReadError::Protocol(e)) => {
                            tracing::debug!(peer = %self.peer, "protocol error: {e}");
                        }
                    }
                    self.liveness.alive();
                }
                Ok(Wake::Cmd(cmd)) => {
                    self.apply(cmd);
                    for _ in 0..256 {
                        match self.rx.try_recv() {
                            Ok(cmd) => self.apply(cmd),
                            Err(_) => break,
                        }
                    }
                }
                Ok(Wake::Write) => {}
                Ok(Wake::Shutdown) => {
                    let d = self.shutdown.deadline().unwrap_or_else(Instant::now);
                    self.begin_shutdown(d);
                }
                Ok(Wake::Timer) => {
                    armed = None;
                    self.on_timer();
                }
            }
            self.process_events();
        };
        tracing::debug!(peer = %self.peer, "server connection ends: {why}");
        if !self.conn.is_closed() {
            self.conn.handle_eof();
        }
        self.process_events();
        self.io.close(&mut self.conn, Duration::from_secs(1)).await;
    }

    fn begin_shutdown(&mut self, grace_deadline: Instant) {
        self.grace_deadline = Some(grace_deadline);
        self.conn
            .go_away(ErrorCode::NoError, "server shutting down");
    }

    fn next_timer(&self) -> Option<Instant> {
        let mut t = self.conn.poll_timeout();
        let mut consider = |x: Instant| t = Some(t.map_or(x, |t| t.min(x)));
        if let Some(d) = self.grace_deadline {
            consider(d);
        }
        if !self.conn.is_established() {
            consider(self.started + self.config.handshake_timeout);
        }
        if let Some(x) = self
            .liveness
            .next(&self.io, &self.config, self.calls.is_empty())
        {
            consider(x);
        }
        t
    }

    fn on_timer(&mut self) {
        let now = Instant::now();
        self.conn.handle_timeout(now);
        if !self.conn.is_established() && now >= self.started + self.config.handshake_timeout {
            self.conn.close(ProtocolError::new(
                ErrorCode::Timeout,
                format!(
                    "no topspin handshake within {:?} (handshake_timeout)",
                    self.config.handshake_timeout
                ),
            ));
            return;
        }
        let idle = self.calls.is_empty();
        if self
            .liveness
            .on_timer(now, &self.io, &self.config, &mut self.conn, idle)
            == Lapse::Closed
        {
            return;
        }
        if self.grace_deadline.is_some_and(|d| now >= d) {
            // The grace period is over: end what is left.
            let ids: Vec<u32> = self.calls.keys().copied().collect();
            for id in ids {
                self.end(
                    id,
                    Status::unavailable("the server shut down before the call finished"),
                    Metadata::new(),
                );
            }
        }
    }

    fn ctx(&mut self, method: bytestring::ByteString, deadline: Option<Instant>) -> ServerContext {
        ServerContext {
            deadline,
            peer: self.peer.clone(),
            method,
            cancel: self.cancel_pool.pop().unwrap_or_default(),
        }
    }

    fn process_events(&mut self) {
        while let Some(ev) = self.conn.poll_event() {
            match ev {
                Event::CallStarted {
                    id,
                    method,
                    codec,
                    deadline,
                    metadata,
                } => self.on_call(id.0, method, codec, deadline, metadata),
                Event::Message {
                    id,
                    message,
                    credit,
                } => match self.calls.get_mut(&id.0) {
                    Some(Call::Awaiting {
                        message: slot, ctx, ..
                    }) => {
                        let _ = self.conn.grant_credit(id, credit);
                        if slot.is_some() {
                            let st = Status::invalid_argument(format!(
                                "{} takes one request message, got more",
                                &*ctx.method
                            ));
                            self.end(id.0, st, Metadata::new());
                        } else {
                            *slot = Some(message);
                        }
                    }
                    Some(Call::Running {
                        inbound: Some(tx), ..
                    }) => {
                        let _ = tx.send(Item::Message(message, credit));
                    }
                    _ => {
                        let _ = self.conn.grant_credit(id, credit);
                    }
                },
                Event::HalfClosed { id } => match self.calls.remove(&id.0) {
                    Some(Call::Awaiting {
                        handler,
                        metadata,
                        ctx,
                        message,
                    }) => match message {
                        Some(m) => self.spawn(id.0, handler, Input::One(m), metadata, ctx),
                        None => {
                            let st = Status::invalid_argument(format!(
                                "{} takes one request message, got none",
                                &*ctx.method
                            ));
                            self.end(id.0, st, Metadata::new());
                        }
                    },
                    Some(Call::Running {
                        cancel,
                        inbound,
                        blocked,
                        end,
                    }) => {
                        if let Some(tx) = &inbound {
                            let _ = tx.send(Item::End(Ok(Metadata::new())));
                        }
                        self.calls.insert(
                            id.0,
                            Call::Running {
                                cancel,
                                inbound: None,
                                blocked,
                                end,
                            },
                        );
                    }
                    None => {}
                },
                Event::Cancelled { id, status } => {
                    if let Some(Call::Running {
                        cancel,
                        inbound,
                        blocked,
                        ..
                    }) = self.calls.remove(&id.0)
                    {
                        cancel.cancel();
                        let st = Status::new(status.code(), status.message().to_owned());
                        if let Some(tx) = inbound {
                            let _ = tx.send(Item::End(Err(st.clone())));
                        }
                        if let Some((_, ack)) = blocked.map(|b| *b) {
                            let _ = ack.send(Err(st));
                        }
                    }
                }
                Event::Writable { id } => self.on_writable(id.0),
                Event::Pong { .. } => self.liveness.alive(),
                Event::Established
                | Event::Headers { .. }
                | Event::Ended { .. }
                | Event::GoAway { .. }
                | Event::Closed { .. } => {}
            }
        }
    }

    fn on_call(
        &mut self,
        id: u32,
        method: bytestring::ByteString,
        codec: u8,
        deadline: Option<Instant>,
        metadata: Metadata,
    ) {
        let Some(handler) = self.registry.get(&method) else {
            let st = Status::unimplemented(format!(
                "method {} is not implemented by this server",
                &*method
            ));
            self.end(id, st, Metadata::new());
            return;
        };
        if handler.codec() != codec {
            let st = Status::unimplemented(format!(
                "method {} takes codec {} (0 protobuf, 1 raw bytes, 2 JSON), the call used codec {codec}",
                &*method,
                handler.codec()
            ));
            self.end(id, st, Metadata::new());
            return;
        }
        let ctx = self.ctx(method, deadline);
        if handler.kind().client_streams() {
            let (tx, rx) = mpsc::unbounded_channel();
            let credit = Box::new(ServerCredit {
                tx: self.tx.clone(),
                id,
            });
            let cancel = ctx.cancel.clone();
            self.calls.insert(
                id,
                Call::Running {
                    cancel: cancel.clone(),
                    inbound: Some(tx),
                    blocked: None,
                    end: None,
                },
            );
            let io = CallIo {
                tx: self.tx.clone(),
                id,
            };
            let recycled = self.fut_pool.pop();
            let fut = handler.call(Input::Stream { rx, credit }, metadata, ctx, io, recycled);
            self.handlers.push(Running {
                id,
                cancel,
                fut: Some(fut),
            });
        } else {
            self.calls.insert(
                id,
                Call::Awaiting {
                    handler,
                    metadata,
                    ctx,
                    message: None,
                },
            );
        }
    }

    fn spawn(
        &mut self,
        id: u32,
        handler: super::handler::HandlerRef,
        input: Input,
        metadata: Metadata,
        ctx: ServerContext,
    ) {
        let cancel = ctx.cancel.clone();
        self.calls.insert(
            id,
            Call::Running {
                cancel: cancel.clone(),
                inbound: None,
                blocked: None,
                end: None,
            },
        );
        let io = CallIo {
            tx: self.tx.clone(),
            id,
        };
        let recycled = self.fut_pool.pop();
        let mut running = Running {
            id,
            cancel,
            fut: Some(handler.call(input, metadata, ctx, io, recycled)),
        };
        // Most handlers answer at once: poll once now, so the answer leaves in the same write
        // as everything else this turn, without a trip through the scheduler.
        let waker = futures_util::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        match std::pin::Pin::new(&mut running).poll(&mut cx) {
            std::task::Poll::Ready((id, outcome, fut)) => {
                drop(running); // release its handle on the call's cancellation first
                self.recycle(fut);
                if let Some(o) = outcome {
                    self.finish(id, o);
                }
            }
            // Polled again by the set, which registers a real waker.
            std::task::Poll::Pending => self.handlers.push(running),
        }
    }

    fn recycle(&mut self, fut: Option<BoxFut>) {
        if let Some(f) = fut {
            if self.fut_pool.len() < 64 {
                self.fut_pool.push(f);
            }
        }
    }

    /// A handler returned.
    fn finish(&mut self, id: u32, outcome: Outcome) {
        match outcome {
            Outcome::Reply(Ok((message, headers, trailers))) => {
                if !self.calls.contains_key(&id) {
                    return;
                }
                if !headers.is_empty() {
                    if let Err(e) = self.conn.send_headers(CallId(id), &headers) {
                        self.end(id, self.local_error(e, "response headers"), Metadata::new());
                        return;
                    }
                }
                match self.conn.send_message(CallId(id), message, false) {
                    Ok(()) => self.end(id, Status::new(Code::Ok, ""), trailers),
                    Err(e) => {
                        self.end(id, self.local_error(e, "response message"), Metadata::new())
                    }
                }
            }
            Outcome::Reply(Err(status)) | Outcome::Finished(Err(status)) => {
                let trailers = status.wire_trailers();
                self.end(id, status, trailers);
            }
            Outcome::Finished(Ok(trailers)) => self.end(id, Status::new(Code::Ok, ""), trailers),
        }
    }

    fn local_error(&self, e: CallError, what: &str) -> Status {
        match e {
            CallError::MessageTooLarge { size, limit } => Status::resource_exhausted(format!(
                "{what} of {size} bytes exceeds the client's max_message_size of {limit} bytes (raise it in the client's Config)"
            )),
            CallError::MetadataTooLarge { size, limit } => Status::resource_exhausted(format!(
                "{what}: metadata of {size} bytes exceeds the client's max_metadata_size of {limit} bytes"
            )),
            other => Status::internal(format!("{what}: {other}")),
        }
    }

    /// Ends a call with a status (waiting for a message still being sent, if any). Also used
    /// to refuse a call that never got state here (unknown method, wrong codec).
    fn end(&mut self, id: u32, status: Status, trailers: Metadata) {
        let st = topspin_proto::Status::new(status.code(), status.message().to_owned());
        match self.conn.end_call(CallId(id), &st, &trailers) {
            Ok(()) => {}
            Err(CallError::WouldBlock) => {
                if let Some(Call::Running { end, .. }) = self.calls.get_mut(&id) {
                    *end = Some(Box::new((status, trailers)));
                    return;
                }
            }
            // A status too large for the client is shortened by the engine; anything else
            // means the call is already over.
            Err(_) => {}
        }
        if let Some(Call::Running {
            cancel, blocked, ..
        }) = self.calls.remove(&id)
        {
            if let Some((_, ack)) = blocked.map(|b| *b) {
                let _ = ack.send(Err(Status::cancelled("the call ended")));
            }
            // A handler still running (its call ended without it) must stop; a finished one
            // has let go of the handle, which is then reused.
            cancel.cancel();
            cancel.recycle(&mut self.cancel_pool);
        }
    }

    fn apply(&mut self, cmd: SCmd) {
        match cmd {
            SCmd::Headers { id, metadata } => {
                if let Err(e) = self.conn.send_headers(CallId(id), &metadata) {
                    if !matches!(e, CallError::NotOpen(_) | CallError::NotAllowed(_)) {
                        self.end(id, self.local_error(e, "response headers"), Metadata::new());
                    }
                }
            }
            SCmd::Send { id, message, ack } => self.send(id, message, ack),
            SCmd::Credit { id, bytes } => {
                let _ = self.conn.grant_credit(CallId(id), bytes);
            }
        }
    }

    fn send(&mut self, id: u32, message: Bytes, ack: oneshot::Sender<Result<(), Status>>) {
        match self.conn.send_message(CallId(id), message.clone(), false) {
            Ok(()) => {
                let _ = ack.send(Ok(()));
            }
            Err(CallError::WouldBlock) => {
                if let Some(Call::Running { blocked, .. }) = self.calls.get_mut(&id) {
                    *blocked = Some(Box::new((message, ack)));
                } else {
                    let _ = ack.send(Err(Status::cancelled("the call is over")));
                }
            }
            Err(CallError::NotOpen(_)) => {
                let _ = ack.send(Err(Status::cancelled("the call is over")));
            }
            Err(e) => {
                let st = self.local_error(e, "response message");
                let _ = ack.send(Err(st.clone()));
                self.end(id, st, Metadata::new());
            }
        }
    }

    fn on_writable(&mut self, id: u32) {
        let Some(Call::Running { blocked, end, .. }) = self.calls.get_mut(&id) else {
            return;
        };
        let blocked = blocked.take();
        let end = end.take();
        if let Some((message, ack)) = blocked.map(|b| *b) {
            self.send(id, message, ack);
        }
        if let Some((status, trailers)) = end.map(|b| *b) {
            self.end(id, status, trailers);
        }
    }
}
