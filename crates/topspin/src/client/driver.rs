//! The client's connection task: it alone owns the protocol engine and the socket; callers talk
//! to it through a command queue (no lock shared by all calls of a connection).

use crate::io::{Io, Lapse, Liveness, ReadError};
use crate::streaming::Item;
use crate::transport::Stream;
use crate::{Address, Config, Response, Status};
use bytes::Bytes;
use bytestring::ByteString;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use topspin_proto::{CallError, CallId, Code, Connection, ErrorCode, Event, Metadata, Side};

pub(crate) type UnaryReply = super::completion::Completer<Result<Response<Bytes>, Status>>;

/// Where a call's results go.
#[derive(Debug)]
pub(crate) enum Sink {
    /// One response message (unary and client-streaming calls).
    Unary(UnaryReply),
    /// A response stream: headers first, then items.
    Stream {
        headers: Option<oneshot::Sender<Result<Metadata, Status>>>,
        items: mpsc::UnboundedSender<Item>,
    },
}

impl Sink {
    fn fail(self, status: Status) {
        match self {
            Sink::Unary(tx) => {
                let _ = tx.send(Err(status));
            }
            Sink::Stream { headers, items } => match headers {
                Some(h) => {
                    let _ = h.send(Err(status));
                }
                None => {
                    let _ = items.send(Item::End(Err(status)));
                }
            },
        }
    }

    fn abandoned(&self) -> bool {
        match self {
            Sink::Unary(tx) => tx.is_closed(),
            Sink::Stream { headers, items } => {
                items.is_closed() && headers.as_ref().is_none_or(|h| h.is_closed())
            }
        }
    }
}

/// A request to start a call.
#[derive(Debug)]
pub(crate) struct Start {
    pub(crate) token: u64,
    pub(crate) method: ByteString,
    pub(crate) codec: u8,
    pub(crate) timeout: Option<Duration>,
    pub(crate) metadata: Metadata,
    /// The request message of unary and server-streaming calls, sent with END_STREAM.
    pub(crate) message: Option<Bytes>,
    pub(crate) sink: Sink,
}

#[derive(Debug)]
pub(crate) enum Cmd {
    Start(Start),
    /// Several calls written together.
    Batch(Vec<Start>),
    Send {
        token: u64,
        message: Bytes,
        ack: oneshot::Sender<Result<(), Status>>,
    },
    HalfClose {
        token: u64,
    },
    Cancel {
        token: u64,
    },
    Credit {
        token: u64,
        bytes: u32,
    },
}

/// Shared between a connection task and the channel.
#[derive(Debug, Default)]
pub(crate) struct ConnShared {
    /// The server sent GOAWAY or the connection closed: new calls go to a new connection.
    pub(crate) unusable: AtomicBool,
}

/// A message waiting for flow-control credit, and whom to tell when it is sent.
type Blocked = (Bytes, oneshot::Sender<Result<(), Status>>);

#[derive(Debug)]
struct Call {
    token: u64,
    method: ByteString,
    sink: Option<Sink>,
    headers: Metadata,
    message: Option<Bytes>,
    /// A message waiting for credit (boxed: rare, and keeps the call's state small).
    blocked: Option<Box<Blocked>>,
    half_close_after_blocked: bool,
}

struct Driver {
    conn: Connection,
    io: Io,
    config: Config,
    address: Address,
    calls: FxHashMap<u32, Call>,
    tokens: FxHashMap<u64, u32>,
    /// Calls over the server's concurrency limit, started when others end.
    waiting: VecDeque<Start>,
    shared: Arc<ConnShared>,
    liveness: Liveness,
}

/// Connects, completes the handshake and spawns the connection task.
pub(crate) async fn connect(
    address: &Address,
    config: &Config,
) -> Result<(mpsc::UnboundedSender<Cmd>, Arc<ConnShared>), Status> {
    let what = |e: &dyn std::fmt::Display| format!("could not connect to {address}: {e}");
    let stream = tokio::time::timeout(config.handshake_timeout, Stream::connect(address))
        .await
        .map_err(|_| Status::unavailable(what(&"connect timed out")))?
        .map_err(|e| Status::unavailable(what(&e)))?;
    let mut conn = Connection::new(Side::Client, config.settings());
    let mut io = Io::new(stream);
    let hs = async {
        loop {
            let all_written = io.flush(&mut conn).map_err(|e| what(&e))?;
            if conn.is_established() {
                return Ok(());
            }
            let readable = std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = io.stream.poll_read_ready(cx) {
                    return Poll::Ready(r.map(|()| true));
                }
                if !all_written {
                    if let Poll::Ready(r) = io.stream.poll_write_ready(cx) {
                        return Poll::Ready(r.map(|()| false));
                    }
                }
                Poll::Pending
            })
            .await
            .map_err(|e| what(&e))?;
            if readable {
                match io.read(&mut conn) {
                    Ok(true) => {}
                    Ok(false) => {
                        return Err(what(
                            &"the server closed the connection during the handshake",
                        ))
                    }
                    Err(ReadError::Io(e)) => return Err(what(&e)),
                    Err(ReadError::Protocol(e)) => {
                        return Err(what(&format!(
                            "the server does not speak the topspin protocol ({e})"
                        )))
                    }
                }
            }
        }
    };
    match tokio::time::timeout(config.handshake_timeout, hs).await {
        Ok(Ok(())) => {}
        Ok(Err(msg)) => return Err(Status::unavailable(msg)),
        Err(_) => {
            return Err(Status::unavailable(what(&format!(
                "no handshake within {:?} (is it a topspin server?)",
                config.handshake_timeout
            ))))
        }
    }
    while let Some(e) = conn.poll_event() {
        debug_assert_eq!(e, Event::Established);
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(ConnShared::default());
    let driver = Driver {
        conn,
        io,
        config: config.clone(),
        address: address.clone(),
        calls: FxHashMap::default(),
        tokens: FxHashMap::default(),
        waiting: VecDeque::new(),
        shared: shared.clone(),
        liveness: Liveness::default(),
    };
    tokio::spawn(driver.run(rx));
    Ok((tx, shared))
}

/// What woke a connection task.
enum Wake<C> {
    Read,
    Cmd(Option<C>),
    Write,
    Timer,
}

fn to_tokio(t: Instant) -> tokio::time::Instant {
    tokio::time::Instant::from_std(t)
}

impl Driver {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        let mut handles_open = true;
        let sleep = tokio::time::sleep_until(to_tokio(Instant::now()));
        tokio::pin!(sleep);
        let mut armed: Option<Instant> = None;
        let why = loop {
            let all_written = match self.io.flush(&mut self.conn) {
                Ok(w) => w,
                Err(e) => break format!("write failed: {e}"),
            };
            if self.conn.is_closed() {
                break "connection closed".into();
            }
            if !handles_open && self.calls.is_empty() && self.waiting.is_empty() {
                break "channel dropped".into();
            }
            if self.conn.is_drained() && all_written {
                break "drained after go-away".into();
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
            // Wait for the first of: bytes to read, commands, room to write, the timer. Polled
            // by hand: cheaper than `select!`, which rebuilds (and re-registers) every branch's
            // future on each turn.
            let wake = std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = self.io.stream.poll_read_ready(cx) {
                    return Poll::Ready(r.map(|()| Wake::Read));
                }
                if handles_open {
                    if let Poll::Ready(cmd) = rx.poll_recv(cx) {
                        return Poll::Ready(Ok(Wake::Cmd(cmd)));
                    }
                }
                if !all_written {
                    if let Poll::Ready(r) = self.io.stream.poll_write_ready(cx) {
                        return Poll::Ready(r.map(|()| Wake::Write));
                    }
                }
                if armed.is_some() && sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Ok(Wake::Timer));
                }
                Poll::Pending
            })
            .await;
            match wake {
                Err(e) => break format!("socket failed: {e}"),
                Ok(Wake::Read) => {
                    match self.io.read(&mut self.conn) {
                        Ok(true) => {}
                        Ok(false) => self.conn.handle_eof(),
                        Err(ReadError::Io(e)) => {
                            self.conn.close(topspin_proto::ProtocolError::new(
                                ErrorCode::InternalError,
                                format!("read failed: {e}"),
                            ));
                        }
                        Err(ReadError::Protocol(_)) => {} // the engine queued ERROR and ended calls
                    }
                    self.liveness.alive();
                }
                Ok(Wake::Cmd(Some(cmd))) => {
                    self.apply(cmd);
                    // Drain what else is queued so it all leaves in one write.
                    for _ in 0..256 {
                        match rx.try_recv() {
                            Ok(cmd) => self.apply(cmd),
                            Err(_) => break,
                        }
                    }
                }
                Ok(Wake::Cmd(None)) => handles_open = false,
                Ok(Wake::Write) => {}
                Ok(Wake::Timer) => {
                    armed = None;
                    self.on_timer();
                }
            }
            self.process_events();
        };
        tracing::debug!(address = %self.address, "client connection ends: {why}");
        self.shared.unusable.store(true, Ordering::Release);
        if !self.conn.is_closed() {
            self.conn.handle_eof();
        }
        self.process_events();
        let status = Status::unavailable(format!("connection to {} closed: {why}", self.address));
        for (_, mut call) in self.calls.drain() {
            if let Some(sink) = call.sink.take() {
                sink.fail(status.clone());
            }
        }
        for s in self.waiting.drain(..) {
            s.sink.fail(status.clone());
        }
        rx.close();
        while let Ok(cmd) = rx.try_recv() {
            match cmd {
                Cmd::Start(s) => s.sink.fail(status.clone()),
                Cmd::Batch(v) => v.into_iter().for_each(|s| s.sink.fail(status.clone())),
                Cmd::Send { ack, .. } => {
                    let _ = ack.send(Err(status.clone()));
                }
                _ => {}
            }
        }
        self.io.close(&mut self.conn, Duration::from_secs(1)).await;
    }

    fn next_timer(&self) -> Option<Instant> {
        let mine = self
            .liveness
            .next(&self.io, &self.config, self.calls.is_empty());
        match (self.conn.poll_timeout(), mine) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn on_timer(&mut self) {
        let now = Instant::now();
        self.conn.handle_timeout(now);
        let idle = self.calls.is_empty();
        if self
            .liveness
            .on_timer(now, &self.io, &self.config, &mut self.conn, idle)
            == Lapse::Idle
        {
            self.shared.unusable.store(true, Ordering::Release);
        }
    }

    fn apply(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Start(s) => self.start(s),
            Cmd::Batch(v) => v.into_iter().for_each(|s| self.start(s)),
            Cmd::Send {
                token,
                message,
                ack,
            } => {
                let Some(&id) = self.tokens.get(&token) else {
                    let _ = ack.send(Err(Status::cancelled("the call is over")));
                    return;
                };
                self.send(id, message, ack);
            }
            Cmd::HalfClose { token } => {
                if let Some(&id) = self.tokens.get(&token) {
                    if let Some(call) = self.calls.get_mut(&id) {
                        if call.blocked.is_some() {
                            call.half_close_after_blocked = true;
                        } else {
                            let _ = self.conn.half_close(CallId(id));
                        }
                    }
                }
            }
            Cmd::Cancel { token } => {
                if let Some(id) = self.tokens.remove(&token) {
                    self.calls.remove(&id);
                    let _ = self.conn.cancel(CallId(id), Code::Cancelled);
                    self.start_waiting();
                } else {
                    self.waiting.retain(|s| s.token != token);
                }
            }
            Cmd::Credit { token, bytes } => {
                if let Some(&id) = self.tokens.get(&token) {
                    let _ = self.conn.grant_credit(CallId(id), bytes);
                }
            }
        }
    }

    fn start(&mut self, s: Start) {
        if s.sink.abandoned() {
            return;
        }
        if !self.waiting.is_empty() {
            self.waiting.push_back(s);
            return;
        }
        self.try_start(s);
    }

    /// Starts a call, or parks it if the server's concurrency limit is reached.
    fn try_start(&mut self, s: Start) -> bool {
        let r = self
            .conn
            .start_call(&s.method, s.codec, s.timeout, &s.metadata, Instant::now());
        let id = match r {
            Ok(id) => id,
            Err(CallError::TooManyCalls { .. }) => {
                self.waiting.push_back(s);
                return false;
            }
            Err(e) => {
                s.sink.fail(call_error_status(e, &s.method, &self.address));
                return true;
            }
        };
        let mut call = Call {
            token: s.token,
            method: s.method,
            sink: Some(s.sink),
            headers: Metadata::new(),
            message: None,
            blocked: None,
            half_close_after_blocked: false,
        };
        if let Some(message) = s.message {
            if let Err(e) = self.conn.send_message(id, message, true) {
                let _ = self.conn.cancel(id, Code::Cancelled);
                if let Some(sink) = call.sink.take() {
                    sink.fail(call_error_status(e, &call.method, &self.address));
                }
                return true;
            }
        }
        self.tokens.insert(call.token, id.0);
        self.calls.insert(id.0, call);
        true
    }

    fn start_waiting(&mut self) {
        while let Some(s) = self.waiting.pop_front() {
            if s.sink.abandoned() {
                continue;
            }
            if !self.try_start(s) {
                break;
            }
        }
    }

    fn send(&mut self, id: u32, message: Bytes, ack: oneshot::Sender<Result<(), Status>>) {
        match self.conn.send_message(CallId(id), message.clone(), false) {
            Ok(()) => {
                let _ = ack.send(Ok(()));
            }
            Err(CallError::WouldBlock) => {
                if let Some(call) = self.calls.get_mut(&id) {
                    call.blocked = Some(Box::new((message, ack)));
                }
            }
            Err(e) => {
                let method = self
                    .calls
                    .get(&id)
                    .map(|c| c.method.clone())
                    .unwrap_or_default();
                let _ = ack.send(Err(call_error_status(e, &method, &self.address)));
            }
        }
    }

    fn finish(&mut self, id: u32) -> Option<Call> {
        let call = self.calls.remove(&id)?;
        self.tokens.remove(&call.token);
        self.start_waiting();
        Some(call)
    }

    fn process_events(&mut self) {
        while let Some(ev) = self.conn.poll_event() {
            match ev {
                Event::Headers { id, metadata } => {
                    let Some(call) = self.calls.get_mut(&id.0) else {
                        continue;
                    };
                    match &mut call.sink {
                        Some(Sink::Stream { headers, .. }) => {
                            if let Some(h) = headers.take() {
                                let _ = h.send(Ok(metadata));
                            }
                        }
                        _ => call.headers = metadata,
                    }
                }
                Event::Message {
                    id,
                    message,
                    credit,
                } => {
                    let Some(call) = self.calls.get_mut(&id.0) else {
                        continue;
                    };
                    match &mut call.sink {
                        Some(Sink::Stream { headers, items }) => {
                            if let Some(h) = headers.take() {
                                let _ = h.send(Ok(Metadata::new()));
                            }
                            let _ = items.send(Item::Message(message, credit));
                        }
                        Some(Sink::Unary(_)) => {
                            let _ = self.conn.grant_credit(id, credit);
                            if call.message.is_some() {
                                let method = call.method.clone();
                                let _ = self.conn.cancel(id, Code::Cancelled);
                                if let Some(call) = self.finish(id.0) {
                                    if let Some(sink) = call.sink {
                                        sink.fail(Status::internal(format!(
                                            "the server sent more than one response message for {}, which expects one",
                                            &*method
                                        )));
                                    }
                                }
                            } else {
                                call.message = Some(message);
                            }
                        }
                        None => {}
                    }
                }
                Event::Ended {
                    id,
                    status,
                    trailers,
                } => {
                    let Some(mut call) = self.finish(id.0) else {
                        continue;
                    };
                    if let Some((_, ack)) = call.blocked.take().map(|b| *b) {
                        let _ = ack.send(Err(Status::from_wire(status.clone(), Metadata::new())));
                    }
                    let Some(sink) = call.sink.take() else {
                        continue;
                    };
                    if !status.is_ok() {
                        sink.fail(Status::from_wire(status, trailers));
                        continue;
                    }
                    match sink {
                        Sink::Unary(tx) => {
                            let r = match call.message.take() {
                                Some(m) => Ok(Response::from_parts(m, call.headers, trailers)),
                                None => Err(Status::internal(format!(
                                    "the server ended {} with OK but sent no response message",
                                    &*call.method
                                ))),
                            };
                            let _ = tx.send(r);
                        }
                        Sink::Stream { headers, items } => {
                            if let Some(h) = headers {
                                let _ = h.send(Ok(Metadata::new()));
                            }
                            let _ = items.send(Item::End(Ok(trailers)));
                        }
                    }
                }
                Event::Writable { id } => {
                    let Some(call) = self.calls.get_mut(&id.0) else {
                        continue;
                    };
                    let half_close = std::mem::take(&mut call.half_close_after_blocked);
                    if let Some((message, ack)) = call.blocked.take().map(|b| *b) {
                        self.send(id.0, message, ack);
                    }
                    if half_close {
                        let still_blocked =
                            self.calls.get(&id.0).is_some_and(|c| c.blocked.is_some());
                        if still_blocked {
                            if let Some(c) = self.calls.get_mut(&id.0) {
                                c.half_close_after_blocked = true;
                            }
                        } else {
                            let _ = self.conn.half_close(id);
                        }
                    }
                }
                Event::GoAway { .. } => {
                    self.shared.unusable.store(true, Ordering::Release);
                    // Parked calls can never start here now.
                    let st = Status::unavailable(format!(
                        "{} is going away; the call was not sent and is safe to retry",
                        self.address
                    ));
                    for s in self.waiting.drain(..) {
                        s.sink.fail(st.clone());
                    }
                }
                Event::Closed { .. } => {
                    self.shared.unusable.store(true, Ordering::Release);
                }
                Event::Pong { .. } => self.liveness.alive(),
                Event::Established
                | Event::CallStarted { .. }
                | Event::HalfClosed { .. }
                | Event::Cancelled { .. } => {}
            }
        }
    }
}

/// The status for a call the engine refused locally.
pub(crate) fn call_error_status(e: CallError, method: &str, address: &Address) -> Status {
    match e {
        CallError::MessageTooLarge { size, limit } => Status::resource_exhausted(format!(
            "{method}: message of {size} bytes exceeds the peer's max_message_size of {limit} bytes (raise Config::max_message_size on the receiving side)"
        )),
        CallError::MetadataTooLarge { size, limit } => Status::resource_exhausted(format!(
            "{method}: metadata of {size} bytes exceeds the peer's max_metadata_size of {limit} bytes"
        )),
        CallError::InvalidMethod(m) => Status::invalid_argument(format!(
            "invalid method name {m:?}: must be 1..=1024 bytes, like /package.Service/Method"
        )),
        CallError::GoingAway | CallError::Closed | CallError::NotReady | CallError::IdsExhausted => {
            Status::unavailable(format!("{address}: {e}; the call was not sent and is safe to retry"))
        }
        other => Status::internal(format!("{method}: {other}")),
    }
}
