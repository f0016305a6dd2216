//! One side of a topspin connection as a deterministic state machine: received bytes and
//! commands in, [`Event`]s and bytes to transmit out, time passed in (protocol.md §2–§10).

mod call;
mod event;
mod transmit;

pub use event::{CallError, Event};

use crate::error::{ErrorCode, ProtocolError};
use crate::frame::{
    self, call_len, clip, CallId, Frame, FrameDecoder, FrameType, END_FIXED_LEN, HEADER_LEN,
    MAX_METHOD_ID, MAX_METHOD_NAME_LEN,
};
use crate::metadata::Metadata;
use crate::preface::{self, PREFACE, PREFACE_LEN};
use crate::settings::{Settings, MAX_WINDOW};
use crate::status::{Code, Status};
use bytes::{Buf, Bytes, BytesMut};
use bytestring::ByteString;
use call::{Assembly, CallState, PendingSend};
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};
use transmit::Transmit;

/// Which end of the connection this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Opened the connection; starts calls.
    Client,
    /// Accepted the connection; serves calls.
    Server,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Handshake {
    AwaitPreface,
    AwaitSettings,
    Established,
}

/// One side of a connection.
///
/// Feed it bytes with [`Connection::handle_input`], drive it with commands, take what it
/// wants to send with [`Connection::poll_transmit`] and what happened with
/// [`Connection::poll_event`]. It never performs I/O and never reads the clock.
///
/// ```
/// use bytes::{Bytes, BytesMut};
/// use std::time::Instant;
/// use topspin_proto::connection::{Connection, Event, Side};
/// use topspin_proto::{Metadata, Settings, Status};
///
/// let now = Instant::now();
/// let mut client = Connection::new(Side::Client, Settings::default());
/// let mut server = Connection::new(Side::Server, Settings::default());
/// // Moves everything one side wants to send into the other.
/// fn pump(from: &mut Connection, to: &mut Connection, now: Instant) {
///     let mut wire = BytesMut::new();
///     while let Some(b) = from.poll_transmit() { wire.extend_from_slice(&b); }
///     to.handle_input(&mut wire, now).unwrap();
/// }
/// pump(&mut client, &mut server, now);
/// pump(&mut server, &mut client, now);
/// assert_eq!(client.poll_event(), Some(Event::Established));
///
/// let id = client.start_call("/demo.Echo/Say", 1, None, &Metadata::new(), now).unwrap();
/// client.send_message(id, Bytes::from_static(b"hi"), true).unwrap();
/// pump(&mut client, &mut server, now);
/// assert_eq!(server.poll_event(), Some(Event::Established));
/// assert!(matches!(server.poll_event(), Some(Event::CallStarted { .. })));
/// let Some(Event::Message { message, .. }) = server.poll_event() else { panic!() };
/// server.send_message(id, message, false).unwrap();
/// server.end_call(id, &Status::ok(), &Metadata::new()).unwrap();
/// pump(&mut server, &mut client, now);
/// assert!(matches!(client.poll_event(), Some(Event::Message { message, .. }) if &message[..] == b"hi"));
/// assert!(matches!(client.poll_event(), Some(Event::Ended { status, .. }) if status.is_ok()));
/// ```
#[derive(Debug)]
pub struct Connection {
    side: Side,
    local: Settings,
    peer: Settings,
    handshake: Handshake,
    decoder: FrameDecoder,
    calls: FxHashMap<u32, CallState>,
    /// Server: highest call id received. Client: highest call id allocated.
    highest: u32,
    /// Client: method name → interned id.
    methods_out: FxHashMap<Box<str>, u16>,
    /// Server: interned id → method name (index = id).
    methods_in: Vec<Option<ByteString>>,
    events: VecDeque<Event>,
    out: Transmit,
    deadlines: BinaryHeap<Reverse<(Instant, u32)>>,
    /// Open calls that have a deadline (the heap also holds stale entries of ended calls).
    deadline_calls: usize,
    go_away_sent: Option<u32>,
    go_away_received: Option<u32>,
    closed: Option<Option<ProtocolError>>,
}

impl Connection {
    /// A new connection side with these local receive limits; its preface and SETTINGS are
    /// queued for transmit at once. Settings are clamped into their valid ranges.
    pub fn new(side: Side, local: Settings) -> Connection {
        let mut local = local;
        local.max_frame_size = local
            .max_frame_size
            .clamp(crate::settings::MIN_MAX_FRAME_SIZE, MAX_WINDOW);
        local.max_concurrent_calls = local.max_concurrent_calls.min(MAX_WINDOW);
        local.initial_call_window = local.initial_call_window.min(MAX_WINDOW);
        let mut c = Connection {
            side,
            local,
            peer: Settings::default(),
            handshake: Handshake::AwaitPreface,
            decoder: FrameDecoder::new(local.max_frame_size),
            calls: FxHashMap::default(),
            highest: 0,
            methods_out: FxHashMap::default(),
            methods_in: Vec::new(),
            events: VecDeque::new(),
            out: Transmit::default(),
            deadlines: BinaryHeap::new(),
            deadline_calls: 0,
            go_away_sent: None,
            go_away_received: None,
            closed: None,
        };
        c.out.staging.extend_from_slice(&PREFACE);
        frame::encode_settings(&mut c.out.staging, &local);
        c
    }

    /// Which side this is.
    pub fn side(&self) -> Side {
        self.side
    }

    /// This side's receive limits.
    pub fn local_settings(&self) -> &Settings {
        &self.local
    }

    /// The peer's receive limits, once its SETTINGS arrived.
    pub fn peer_settings(&self) -> Option<&Settings> {
        (self.handshake == Handshake::Established).then_some(&self.peer)
    }

    /// Whether the peer's SETTINGS arrived.
    pub fn is_established(&self) -> bool {
        self.handshake == Handshake::Established
    }

    /// Whether the connection is closed (after a protocol error, an ERROR from the peer, or
    /// [`Connection::handle_eof`]).
    pub fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    /// Whether a go-away was sent or received and no call is open any more: the owner may
    /// close the transport once [`Connection::poll_transmit`] is drained.
    pub fn is_drained(&self) -> bool {
        (self.go_away_sent.is_some() || self.go_away_received.is_some()) && self.calls.is_empty()
    }

    /// Whether a go-away was sent or received.
    pub fn is_going_away(&self) -> bool {
        self.go_away_sent.is_some() || self.go_away_received.is_some()
    }

    /// Number of open calls.
    pub fn open_calls(&self) -> usize {
        self.calls.len()
    }

    /// Send credit this side has on a call (negative while overdrawn), if it is open.
    pub fn send_credit(&self, id: CallId) -> Option<i64> {
        self.calls.get(&id.0).map(|c| c.send_credit)
    }

    /// Bytes queued for transmit.
    pub fn transmit_len(&self) -> usize {
        self.out.len()
    }

    /// How many bytes the receive buffer must hold before the next frame can be decoded; lets
    /// a reader read a large frame into one exactly sized buffer.
    pub fn bytes_needed(&self, src: &[u8]) -> usize {
        if self.handshake == Handshake::AwaitPreface {
            return PREFACE_LEN.saturating_sub(src.len());
        }
        self.decoder.bytes_needed(src).unwrap_or(0)
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next chunk of bytes to write, in order; small frames come coalesced, large message
    /// bodies as their own [`Bytes`] (the caller's, never copied). Write them with one
    /// vectored write.
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        self.out.pop()
    }

    /// When [`Connection::handle_timeout`] should next be called (a deadline), if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.peek().map(|Reverse((t, _))| *t)
    }

    /// Expires every call whose deadline is at or before `now` (protocol.md §8.1): the client
    /// sends CANCEL and reports [`Event::Ended`] `DEADLINE_EXCEEDED`; the server sends END
    /// `DEADLINE_EXCEEDED` and reports [`Event::Cancelled`].
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&Reverse((t, id))) = self.deadlines.peek() {
            if t > now {
                break;
            }
            self.deadlines.pop();
            let live = self.calls.get(&id).is_some_and(|c| c.deadline == Some(t));
            if !live {
                continue;
            }
            self.remove_call(id);
            let status = Status::new(Code::DeadlineExceeded, "deadline exceeded");
            match self.side {
                Side::Client => {
                    self.put_cancel(id, Code::DeadlineExceeded);
                    self.events.push_back(Event::Ended {
                        id: CallId(id),
                        status,
                        trailers: Metadata::new(),
                    });
                }
                Side::Server => {
                    self.put_end(
                        id,
                        Code::DeadlineExceeded,
                        status.message(),
                        &Metadata::new(),
                    );
                    self.events.push_back(Event::Cancelled {
                        id: CallId(id),
                        status,
                    });
                }
            }
        }
    }

    /// Feeds received bytes: consumes every complete frame at the front of `src` and leaves
    /// a partial one there. On a connection error it queues an ERROR frame for the peer, ends
    /// every open call (events), emits [`Event::Closed`] and returns the error; the owner
    /// should then send what [`Connection::poll_transmit`] has and close the transport.
    pub fn handle_input(&mut self, src: &mut BytesMut, now: Instant) -> Result<(), ProtocolError> {
        if let Some(err) = &self.closed {
            return Err(err.clone().unwrap_or_else(|| {
                ProtocolError::new(ErrorCode::NoError, "the connection is closed")
            }));
        }
        if self.handshake == Handshake::AwaitPreface {
            let Some(p) = src.first_chunk::<PREFACE_LEN>() else {
                return Ok(());
            };
            if let Err(e) = preface::check(p) {
                return Err(self.fail(e, true));
            }
            src.advance(PREFACE_LEN);
            self.handshake = Handshake::AwaitSettings;
        }
        loop {
            let frame = match self.decoder.decode(src) {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(()),
                Err(e) => return Err(self.fail(e, true)),
            };
            self.on_frame(frame, now)?;
            if self.closed.is_some() {
                return Ok(());
            }
        }
    }

    /// The peer closed its end of the transport. Open calls fail with `UNAVAILABLE`.
    pub fn handle_eof(&mut self) {
        if self.closed.is_some() {
            return;
        }
        let reason = if self.is_drained() {
            "connection closed after go-away"
        } else {
            "connection closed by the peer"
        };
        self.fail_calls(Status::new(Code::Unavailable, reason));
        self.closed = Some(None);
        self.events.push_back(Event::Closed { error: None });
    }

    /// Closes the connection because of a local error (for example an idle or handshake
    /// timeout): queues ERROR for the peer, ends every call and emits [`Event::Closed`].
    pub fn close(&mut self, error: ProtocolError) {
        if self.closed.is_none() {
            self.fail(error, true);
        }
    }

    /// Opens a call's state, remembering its deadline.
    fn insert_call(&mut self, id: u32, state: CallState) {
        if let Some(t) = state.deadline {
            // Ended calls leave stale entries behind; compact before they outnumber the live
            // ones, so a peer that opens and cancels calls forever cannot grow the heap.
            if self.deadlines.len() >= 2 * self.deadline_calls + 64 {
                let calls = &self.calls;
                self.deadlines.retain(|Reverse((t, id))| {
                    calls.get(id).is_some_and(|c| c.deadline == Some(*t))
                });
            }
            self.deadlines.push(Reverse((t, id)));
            self.deadline_calls += 1;
        }
        self.calls.insert(id, state);
    }

    /// Forgets a call's state.
    fn remove_call(&mut self, id: u32) -> Option<CallState> {
        let state = self.calls.remove(&id)?;
        if state.deadline.is_some() {
            self.deadline_calls -= 1;
            if self.deadline_calls == 0 {
                self.deadlines.clear();
            }
        }
        Some(state)
    }

    /// Records a connection error; returns it.
    fn fail(&mut self, e: ProtocolError, tell_peer: bool) -> ProtocolError {
        if tell_peer {
            let max = self.peer.max_frame_size as usize;
            frame::encode_error(&mut self.out.staging, e.code, &e.reason, max);
        }
        let status = Status::new(Code::Unavailable, format!("connection failed: {e}"));
        self.fail_calls(status);
        self.closed = Some(Some(e.clone()));
        self.events.push_back(Event::Closed {
            error: Some(e.clone()),
        });
        e
    }

    fn fail_calls(&mut self, status: Status) {
        self.deadline_calls = 0;
        let mut ids: Vec<u32> = self.calls.drain().map(|(id, _)| id).collect();
        ids.sort_unstable();
        for id in ids {
            let id = CallId(id);
            self.events.push_back(match self.side {
                Side::Client => Event::Ended {
                    id,
                    status: status.clone(),
                    trailers: Metadata::new(),
                },
                Side::Server => Event::Cancelled {
                    id,
                    status: status.clone(),
                },
            });
        }
        self.deadlines.clear();
    }

    fn illegal(&mut self, reason: String) -> Result<(), ProtocolError> {
        Err(self.fail(ProtocolError::new(ErrorCode::IllegalFrame, reason), true))
    }

    fn on_frame(&mut self, frame: Frame, now: Instant) -> Result<(), ProtocolError> {
        if self.handshake == Handshake::AwaitSettings {
            let Frame::Settings(s) = frame else {
                let e = ProtocolError::new(
                    ErrorCode::SettingsError,
                    format!(
                        "the first frame after the preface must be SETTINGS, got {}",
                        frame.frame_type().name()
                    ),
                );
                return Err(self.fail(e, true));
            };
            self.peer = s;
            self.handshake = Handshake::Established;
            self.events.push_back(Event::Established);
            return Ok(());
        }
        let ty = frame.frame_type();
        let sent_by_client_only = matches!(
            ty,
            FrameType::CALL | FrameType::HALF_CLOSE | FrameType::CANCEL
        );
        let sent_by_server_only = matches!(ty, FrameType::HEADERS | FrameType::END);
        if (self.side == Side::Client && sent_by_client_only)
            || (self.side == Side::Server && sent_by_server_only)
        {
            let from = if self.side == Side::Client {
                "server"
            } else {
                "client"
            };
            return self.illegal(format!("{} frame sent by the {from}", ty.name()));
        }
        match frame {
            Frame::Settings(_) => {
                let e = ProtocolError::new(ErrorCode::SettingsError, "SETTINGS sent twice");
                Err(self.fail(e, true))
            }
            Frame::Ping { ack: false, data } => {
                frame::encode_ping(&mut self.out.staging, true, &data);
                Ok(())
            }
            Frame::Ping { ack: true, data } => {
                self.events.push_back(Event::Pong { data });
                Ok(())
            }
            Frame::GoAway {
                last_call_id,
                code,
                reason,
            } => {
                self.on_go_away(last_call_id.0, code, reason);
                Ok(())
            }
            Frame::Error { code, reason } => {
                let e = ProtocolError::new(
                    code,
                    format!("the peer closed the connection with {code}: {}", &*reason),
                );
                Err(self.fail(e, false))
            }
            Frame::Extension { .. } => Ok(()),
            Frame::Call(c) => self.on_call(c, now),
            other => self.on_call_frame(other),
        }
    }

    fn on_go_away(&mut self, last: u32, code: ErrorCode, reason: ByteString) {
        let last = self.go_away_received.map_or(last, |prev| prev.min(last));
        self.go_away_received = Some(last);
        if self.side == Side::Client {
            let mut refused: Vec<u32> =
                self.calls.keys().copied().filter(|&id| id > last).collect();
            refused.sort_unstable();
            for id in refused {
                self.remove_call(id);
                self.events.push_back(Event::Ended {
                    id: CallId(id),
                    status: Status::new(
                        Code::Unavailable,
                        format!(
                            "the server is going away ({}) and did not process this call; it is safe to retry",
                            &*reason
                        ),
                    ),
                    trailers: Metadata::new(),
                });
            }
        }
        self.events.push_back(Event::GoAway {
            last_call_id: CallId(last),
            code,
            reason,
        });
    }

    fn on_call(&mut self, c: crate::frame::CallFrame, now: Instant) -> Result<(), ProtocolError> {
        let id = c.call_id.0;
        if id <= self.highest {
            let e = ProtocolError::new(
                ErrorCode::DuplicateCall,
                format!(
                    "CALL with call id {id} is not above the highest call id so far ({})",
                    self.highest
                ),
            );
            return Err(self.fail(e, true));
        }
        self.highest = id;
        let method = match (c.method_name, c.method_id) {
            (Some(name), 0) => name,
            (Some(name), mid @ 1..=MAX_METHOD_ID) => {
                let slot = usize::from(mid);
                if self.methods_in.len() <= slot {
                    self.methods_in.resize(slot + 1, None);
                }
                if let Some(old) = &self.methods_in[slot] {
                    let e = ProtocolError::new(
                        ErrorCode::MethodIdError,
                        format!("method id {mid} is already bound to {:?}", &**old),
                    );
                    return Err(self.fail(e, true));
                }
                self.methods_in[slot] = Some(name.clone());
                name
            }
            (None, mid @ 1..=MAX_METHOD_ID) => {
                match self
                    .methods_in
                    .get(usize::from(mid))
                    .and_then(|m| m.clone())
                {
                    Some(name) => name,
                    None => {
                        let e = ProtocolError::new(
                            ErrorCode::MethodIdError,
                            format!("method id {mid} was never bound on this connection"),
                        );
                        return Err(self.fail(e, true));
                    }
                }
            }
            (_, mid) => {
                let e = ProtocolError::new(
                    ErrorCode::MethodIdError,
                    format!("method id {mid} without a name is out of range 1..={MAX_METHOD_ID}"),
                );
                return Err(self.fail(e, true));
            }
        };
        if self.go_away_sent.is_some_and(|last| id > last) {
            return Ok(()); // not processed; the client knows from our GOAWAY
        }
        let md_len = c.metadata.encoded_len();
        if md_len > self.local.max_metadata_size as usize {
            let msg = format!(
                "request metadata of {md_len} bytes exceeds this server's limit of {} bytes (max_metadata_size)",
                self.local.max_metadata_size
            );
            self.put_end(id, Code::ResourceExhausted, &msg, &Metadata::new());
            return Ok(());
        }
        if self.calls.len() >= self.local.max_concurrent_calls as usize {
            let msg = format!(
                "too many concurrent calls: this server allows {} per connection (max_concurrent_calls)",
                self.local.max_concurrent_calls
            );
            self.put_end(id, Code::ResourceExhausted, &msg, &Metadata::new());
            return Ok(());
        }
        // A timeout too far away to represent is no deadline at all.
        let deadline = (c.timeout_us > 0)
            .then(|| now.checked_add(Duration::from_micros(c.timeout_us)))
            .flatten();
        self.insert_call(
            id,
            CallState::new(
                self.peer.initial_call_window,
                self.local.initial_call_window,
                deadline,
            ),
        );
        self.events.push_back(Event::CallStarted {
            id: c.call_id,
            method,
            codec: c.codec,
            deadline,
            metadata: c.metadata,
        });
        Ok(())
    }

    fn on_call_frame(&mut self, frame: Frame) -> Result<(), ProtocolError> {
        let id = frame.call_id().0;
        if !self.calls.contains_key(&id) {
            if id <= self.highest {
                return Ok(()); // crossed an END or CANCEL on the wire (protocol.md §6)
            }
            let e = ProtocolError::new(
                ErrorCode::UnknownCall,
                format!(
                    "{} frame for call id {id}, which was never opened (highest so far: {})",
                    frame.frame_type().name(),
                    self.highest
                ),
            );
            return Err(self.fail(e, true));
        }
        match frame {
            Frame::Message(m) => {
                if m.end_stream && self.side == Side::Client {
                    return self.illegal("MESSAGE with END_STREAM sent by the server".into());
                }
                let cost = (HEADER_LEN + m.chunk.len() + m.total_len.map_or(0, |_| 4)) as i64;
                let call = self
                    .calls
                    .get_mut(&id)
                    .ok_or_else(|| unreachable_call(id))?;
                if call.recv_closed {
                    return self
                        .illegal(format!("MESSAGE on call {id} after the client half-closed"));
                }
                if call.assembling.is_some() {
                    let e = ProtocolError::new(
                        ErrorCode::MessageLengthMismatch,
                        format!("MESSAGE on call {id} while a split message is incomplete"),
                    );
                    return Err(self.fail(e, true));
                }
                self.debit(id, cost)?;
                let call = self
                    .calls
                    .get_mut(&id)
                    .ok_or_else(|| unreachable_call(id))?;
                if self.side == Side::Client {
                    call.headers_done = true; // HEADERS may no longer follow
                }
                let total = m.total_len.map_or(m.chunk.len(), |t| t as usize);
                if total > self.local.max_message_size as usize {
                    let msg = format!(
                        "{} message of {total} bytes exceeds this side's limit of {} bytes (max_message_size; raise it to accept larger messages)",
                        if self.side == Side::Server { "request" } else { "response" },
                        self.local.max_message_size
                    );
                    self.end_locally(id, Status::new(Code::ResourceExhausted, msg));
                    return Ok(());
                }
                if m.end_stream {
                    call.recv_closed = true;
                }
                match m.total_len {
                    None => {
                        self.events.push_back(Event::Message {
                            id: CallId(id),
                            message: m.chunk,
                            credit: cost as u32,
                        });
                        if m.end_stream {
                            self.events.push_back(Event::HalfClosed { id: CallId(id) });
                        }
                    }
                    Some(_) if m.chunk.len() >= total => {
                        let e = ProtocolError::new(
                            ErrorCode::MessageLengthMismatch,
                            format!(
                                "split MESSAGE on call {id} already holds {} of its {total} bytes; it should not be split",
                                m.chunk.len()
                            ),
                        );
                        return Err(self.fail(e, true));
                    }
                    Some(_) => {
                        let mut buf = BytesMut::with_capacity(total);
                        buf.extend_from_slice(&m.chunk);
                        call.assembling = Some(Box::new(Assembly {
                            buf,
                            total,
                            end_stream: m.end_stream,
                            owed: cost as u64,
                        }));
                        self.advance_credit_if_stalled(id);
                    }
                }
                Ok(())
            }
            Frame::Continuation { chunk, .. } => {
                let cost = (HEADER_LEN + chunk.len()) as i64;
                let call = self
                    .calls
                    .get_mut(&id)
                    .ok_or_else(|| unreachable_call(id))?;
                let Some(asm) = &call.assembling else {
                    let e = ProtocolError::new(
                        ErrorCode::MessageLengthMismatch,
                        format!("CONTINUATION on call {id} with no split message open"),
                    );
                    return Err(self.fail(e, true));
                };
                if asm.buf.len() + chunk.len() > asm.total {
                    let e = ProtocolError::new(
                        ErrorCode::MessageLengthMismatch,
                        format!(
                            "CONTINUATION on call {id} goes past the declared total of {} bytes ({} + {})",
                            asm.total,
                            asm.buf.len(),
                            chunk.len()
                        ),
                    );
                    return Err(self.fail(e, true));
                }
                self.debit(id, cost)?;
                let call = self
                    .calls
                    .get_mut(&id)
                    .ok_or_else(|| unreachable_call(id))?;
                let asm = call
                    .assembling
                    .as_mut()
                    .ok_or_else(|| unreachable_call(id))?;
                asm.buf.extend_from_slice(&chunk);
                asm.owed += cost as u64;
                if asm.buf.len() == asm.total {
                    let asm = call.assembling.take().ok_or_else(|| unreachable_call(id))?;
                    self.events.push_back(Event::Message {
                        id: CallId(id),
                        message: asm.buf.freeze(),
                        credit: asm.owed.min(u64::from(MAX_WINDOW)) as u32,
                    });
                    if asm.end_stream {
                        self.events.push_back(Event::HalfClosed { id: CallId(id) });
                    }
                } else {
                    self.advance_credit_if_stalled(id);
                }
                Ok(())
            }
            Frame::Headers { metadata, .. } => {
                let call = self
                    .calls
                    .get_mut(&id)
                    .ok_or_else(|| unreachable_call(id))?;
                if call.headers_done {
                    return self.illegal(format!(
                        "HEADERS on call {id} after response headers or a response message"
                    ));
                }
                call.headers_done = true;
                let size = metadata.encoded_len();
                if size > self.local.max_metadata_size as usize {
                    let msg = format!(
                        "response headers of {size} bytes exceed this client's limit of {} bytes (max_metadata_size)",
                        self.local.max_metadata_size
                    );
                    self.end_locally(id, Status::new(Code::ResourceExhausted, msg));
                    return Ok(());
                }
                self.events.push_back(Event::Headers {
                    id: CallId(id),
                    metadata,
                });
                Ok(())
            }
            Frame::HalfClose { .. } => {
                let call = self
                    .calls
                    .get_mut(&id)
                    .ok_or_else(|| unreachable_call(id))?;
                if call.recv_closed {
                    return self.illegal(format!(
                        "HALF_CLOSE on call {id}, which is already half-closed"
                    ));
                }
                if call.assembling.is_some() {
                    let e = ProtocolError::new(
                        ErrorCode::MessageLengthMismatch,
                        format!("HALF_CLOSE on call {id} in the middle of a split message"),
                    );
                    return Err(self.fail(e, true));
                }
                call.recv_closed = true;
                self.events.push_back(Event::HalfClosed { id: CallId(id) });
                Ok(())
            }
            Frame::End(e) => {
                self.remove_call(id);
                let size = 2 + e.message.len() + e.trailers.encoded_len();
                let (status, trailers) = if size > self.local.max_metadata_size as usize {
                    (
                        Status::new(
                            Code::ResourceExhausted,
                            format!(
                                "the server's status message and trailers of {size} bytes exceed this client's limit of {} bytes (max_metadata_size)",
                                self.local.max_metadata_size
                            ),
                        ),
                        Metadata::new(),
                    )
                } else {
                    (Status::new(e.code, e.message), e.trailers)
                };
                self.events.push_back(Event::Ended {
                    id: CallId(id),
                    status,
                    trailers,
                });
                Ok(())
            }
            Frame::Cancel { code, .. } => {
                self.remove_call(id);
                let msg = match code {
                    Code::DeadlineExceeded => "the client's deadline passed",
                    Code::ResourceExhausted => "the client refused a message over its limit",
                    _ => "cancelled by the client",
                };
                self.events.push_back(Event::Cancelled {
                    id: CallId(id),
                    status: Status::new(code, msg),
                });
                Ok(())
            }
            Frame::Credit { increment, .. } => {
                let call = self
                    .calls
                    .get_mut(&id)
                    .ok_or_else(|| unreachable_call(id))?;
                let credit = call.send_credit + i64::from(increment);
                if credit > i64::from(MAX_WINDOW) {
                    let e = ProtocolError::new(
                        ErrorCode::FlowControl,
                        format!("CREDIT of {increment} on call {id} raises its credit to {credit}, above 2147483647"),
                    );
                    return Err(self.fail(e, true));
                }
                call.send_credit = credit;
                self.resume_send(id);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Charges a received message frame against the peer's credit.
    fn debit(&mut self, id: u32, cost: i64) -> Result<(), ProtocolError> {
        let call = self
            .calls
            .get_mut(&id)
            .ok_or_else(|| unreachable_call(id))?;
        if call.recv_window <= 0 {
            let e = ProtocolError::new(
                ErrorCode::FlowControl,
                format!(
                    "message frame on call {id} sent without credit (the sender's credit is {})",
                    call.recv_window
                ),
            );
            return Err(self.fail(e, true));
        }
        call.recv_window -= cost;
        Ok(())
    }

    /// A split message cannot complete if its chunks exhaust the window before the application
    /// sees it, so its chunks' credit is given back early while it is assembled.
    fn advance_credit_if_stalled(&mut self, id: u32) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        if call.recv_window > 0 {
            return;
        }
        let Some(asm) = call.assembling.as_mut() else {
            return;
        };
        let give = asm
            .owed
            .min(u64::from(MAX_WINDOW) - call.recv_window.max(0) as u64);
        if give == 0 {
            return;
        }
        asm.owed -= give;
        call.recv_window += give as i64;
        self.put_credit(id, give as u32);
    }

    /// Ends a call from this side because of a call error.
    fn end_locally(&mut self, id: u32, status: Status) {
        self.remove_call(id);
        match self.side {
            Side::Server => {
                self.put_end(id, status.code(), status.message(), &Metadata::new());
                self.events.push_back(Event::Cancelled {
                    id: CallId(id),
                    status,
                });
            }
            Side::Client => {
                self.put_cancel(id, status.code());
                self.events.push_back(Event::Ended {
                    id: CallId(id),
                    status,
                    trailers: Metadata::new(),
                });
            }
        }
    }

    fn put_end(&mut self, id: u32, code: Code, message: &str, trailers: &Metadata) {
        frame::encode_end(&mut self.out.staging, CallId(id), code, message, trailers);
    }

    fn put_cancel(&mut self, id: u32, code: Code) {
        frame::encode_cancel(&mut self.out.staging, CallId(id), code);
    }

    fn put_credit(&mut self, id: u32, increment: u32) {
        frame::encode_credit(&mut self.out.staging, CallId(id), increment);
    }

    /// The largest metadata block (for END: status size) this side may send the peer in a frame
    /// whose other fields take `fixed` bytes: the peer's `MAX_METADATA_SIZE`, and never so much
    /// that the frame passes the peer's `MAX_FRAME_SIZE` (protocol.md §9), so every frame this
    /// side sends is one the peer accepts.
    fn peer_metadata_limit(&self, fixed: usize) -> usize {
        let frame_room = (self.peer.max_frame_size as usize).saturating_sub(fixed);
        (self.peer.max_metadata_size as usize).min(frame_room)
    }

    fn check_open(&self) -> Result<(), CallError> {
        if self.closed.is_some() {
            return Err(CallError::Closed);
        }
        if self.handshake != Handshake::Established {
            return Err(CallError::NotReady);
        }
        Ok(())
    }

    fn need_side(&self, side: Side, what: &'static str) -> Result<(), CallError> {
        if self.side != side {
            return Err(CallError::NotAllowed(what));
        }
        Ok(())
    }

    /// Client: starts a call. `codec` is the payload codec byte (0 protobuf, 1 raw bytes, 2
    /// JSON); `timeout` is sent as the call's relative deadline, and the call is expired
    /// locally at `now + timeout` (see [`Connection::handle_timeout`]).
    pub fn start_call(
        &mut self,
        method: &str,
        codec: u8,
        timeout: Option<Duration>,
        metadata: &Metadata,
        now: Instant,
    ) -> Result<CallId, CallError> {
        self.need_side(Side::Client, "only the client starts calls")?;
        self.check_open()?;
        if self.is_going_away() {
            return Err(CallError::GoingAway);
        }
        if self.calls.len() >= self.peer.max_concurrent_calls as usize {
            return Err(CallError::TooManyCalls {
                limit: self.peer.max_concurrent_calls,
            });
        }
        if method.is_empty() || method.len() > MAX_METHOD_NAME_LEN {
            return Err(CallError::InvalidMethod(method.to_owned()));
        }
        let md_len = metadata.encoded_len();
        // The name goes along until the method is interned (or if it cannot be).
        let name = (!self.methods_out.contains_key(method)).then_some(method);
        let limit = self.peer_metadata_limit(call_len(name, metadata) - md_len);
        if md_len > limit {
            return Err(CallError::MetadataTooLarge {
                size: md_len,
                limit: limit as u32,
            });
        }
        let id = self.highest.checked_add(1).ok_or(CallError::IdsExhausted)?;
        self.highest = id;
        let (method_id, named) = match self.methods_out.get(method) {
            Some(&mid) => (mid, false),
            None => {
                let next = self.methods_out.len() + 1;
                if next <= usize::from(MAX_METHOD_ID) {
                    self.methods_out.insert(method.into(), next as u16);
                    (next as u16, true)
                } else {
                    (0, true)
                }
            }
        };
        // Round up so a sub-microsecond timeout is not sent as "no deadline".
        let timeout_us = timeout.map_or(0, |t| {
            u64::try_from(t.as_nanos().div_ceil(1000))
                .unwrap_or(u64::MAX)
                .max(1)
        });
        frame::encode_call(
            &mut self.out.staging,
            CallId(id),
            method_id,
            named.then_some(method),
            codec,
            timeout_us,
            metadata,
        );
        let deadline = timeout.and_then(|t| now.checked_add(t));
        self.insert_call(
            id,
            CallState::new(
                self.peer.initial_call_window,
                self.local.initial_call_window,
                deadline,
            ),
        );
        Ok(CallId(id))
    }

    /// Sends one message on a call. Messages larger than the peer's frame size are split; the
    /// engine sends frames as credit allows and keeps the rest (by reference) until credit
    /// arrives. `end_stream` (client only) half-closes after the message.
    ///
    /// Returns [`CallError::WouldBlock`] when the call has no credit or a previous message is
    /// still being sent; [`Event::Writable`] follows when it may try again.
    pub fn send_message(
        &mut self,
        id: CallId,
        message: Bytes,
        end_stream: bool,
    ) -> Result<(), CallError> {
        self.check_open()?;
        if end_stream && self.side == Side::Server {
            return Err(CallError::NotAllowed(
                "the server ends its side with end_call",
            ));
        }
        let limit = self.peer.max_message_size;
        if message.len() > limit as usize {
            return Err(CallError::MessageTooLarge {
                size: message.len(),
                limit,
            });
        }
        let max_frame = self.peer.max_frame_size as usize;
        let call = self.calls.get_mut(&id.0).ok_or(CallError::NotOpen(id))?;
        if call.send_closed {
            return Err(CallError::NotAllowed("the call is already half-closed"));
        }
        if call.pending.is_some() || call.send_credit <= 0 {
            call.writable_wanted = true;
            return Err(CallError::WouldBlock);
        }
        if self.side == Side::Server {
            call.headers_done = true; // response headers may no longer be sent
        }
        if end_stream {
            call.send_closed = true;
        }
        let st = &mut self.out.staging;
        if message.len() <= max_frame {
            frame::encode_message_head(st, id, end_stream, None, message.len());
            call.send_credit -= (HEADER_LEN + message.len()) as i64;
            self.out.push_body(&message);
            return Ok(());
        }
        let first = max_frame - 4;
        frame::encode_message_head(st, id, end_stream, Some(message.len() as u32), first);
        call.send_credit -= (HEADER_LEN + max_frame) as i64;
        self.out.push_body(&message.slice(..first));
        call.pending = Some(Box::new(PendingSend {
            message,
            offset: first,
        }));
        self.resume_send(id.0);
        Ok(())
    }

    /// Sends what credit allows of a pending split message; reports writability.
    fn resume_send(&mut self, id: u32) {
        let max_frame = self.peer.max_frame_size as usize;
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        while call.send_credit > 0 {
            let Some(p) = call.pending.as_mut() else {
                break;
            };
            let n = (p.message.len() - p.offset).min(max_frame);
            frame::encode_continuation_head(&mut self.out.staging, CallId(id), n);
            let chunk = p.message.slice(p.offset..p.offset + n);
            p.offset += n;
            if p.offset == p.message.len() {
                call.pending = None;
            }
            call.send_credit -= (HEADER_LEN + n) as i64;
            self.out.push_body(&chunk);
        }
        if call.writable_wanted && call.pending.is_none() && call.send_credit > 0 {
            call.writable_wanted = false;
            self.events.push_back(Event::Writable { id: CallId(id) });
        }
    }

    /// Client: no more messages on this call (HALF_CLOSE). Not needed after a message sent
    /// with `end_stream`.
    pub fn half_close(&mut self, id: CallId) -> Result<(), CallError> {
        self.need_side(
            Side::Client,
            "only the client half-closes; the server uses end_call",
        )?;
        self.check_open()?;
        let call = self.calls.get_mut(&id.0).ok_or(CallError::NotOpen(id))?;
        if call.send_closed {
            return Err(CallError::NotAllowed("the call is already half-closed"));
        }
        if call.pending.is_some() {
            call.writable_wanted = true;
            return Err(CallError::WouldBlock);
        }
        call.send_closed = true;
        frame::encode_half_close(&mut self.out.staging, id);
        Ok(())
    }

    /// Client: abandons a call (CANCEL with `code`, usually `CANCELLED`). No event follows:
    /// the call is simply over.
    pub fn cancel(&mut self, id: CallId, code: Code) -> Result<(), CallError> {
        self.need_side(
            Side::Client,
            "only the client cancels; the server uses end_call",
        )?;
        if self.closed.is_some() {
            return Err(CallError::Closed);
        }
        self.remove_call(id.0).ok_or(CallError::NotOpen(id))?;
        self.put_cancel(id.0, code);
        Ok(())
    }

    /// Server: sends response headers (at most once, before any message).
    pub fn send_headers(&mut self, id: CallId, metadata: &Metadata) -> Result<(), CallError> {
        self.need_side(Side::Server, "only the server sends response headers")?;
        self.check_open()?;
        let limit = self.peer_metadata_limit(0) as u32;
        let call = self.calls.get_mut(&id.0).ok_or(CallError::NotOpen(id))?;
        if call.headers_done {
            return Err(CallError::NotAllowed(
                "response headers go once, before any message",
            ));
        }
        let size = metadata.encoded_len();
        if size > limit as usize {
            return Err(CallError::MetadataTooLarge { size, limit });
        }
        call.headers_done = true;
        frame::encode_headers(&mut self.out.staging, id, metadata);
        Ok(())
    }

    /// Server: ends a call with a status and trailers. Returns [`CallError::WouldBlock`] while
    /// a split message is still being sent on the call.
    ///
    /// A call can always be ended: if the status message and trailers are larger than the
    /// client accepts, the trailers are dropped and the message is replaced by one that says
    /// so (the code is kept); a client whose limit is below even that reports
    /// `RESOURCE_EXHAUSTED` (protocol.md §5.6).
    pub fn end_call(
        &mut self,
        id: CallId,
        status: &Status,
        trailers: &Metadata,
    ) -> Result<(), CallError> {
        self.need_side(
            Side::Server,
            "only the server ends calls; the client cancels",
        )?;
        self.check_open()?;
        // The status size (msg_len, message, trailers) is the END payload minus its code.
        let limit = self.peer_metadata_limit(END_FIXED_LEN - 2);
        let call = self.calls.get_mut(&id.0).ok_or(CallError::NotOpen(id))?;
        if call.pending.is_some() {
            call.writable_wanted = true;
            return Err(CallError::WouldBlock);
        }
        self.remove_call(id.0);
        let message = clip(status.message(), usize::MAX);
        let size = 2 + message.len() + trailers.encoded_len();
        if size <= limit {
            self.put_end(id.0, status.code(), message, trailers);
        } else {
            let note = format!(
                "the status message and trailers ({size} bytes) exceed the {limit} bytes this client accepts (max_metadata_size, max_frame_size) and were dropped"
            );
            // 2 (msg_len) + 2 (empty trailers) is the smallest END status.
            let room = limit.saturating_sub(4);
            let mut n = note.len().min(room);
            while !note.is_char_boundary(n) {
                n -= 1;
            }
            self.put_end(id.0, status.code(), &note[..n], &Metadata::new());
        }
        Ok(())
    }

    /// Gives back flow-control credit for consumed messages (the `credit` of
    /// [`Event::Message`]). Credit is batched: a CREDIT frame goes out once half the window has
    /// been given back (as in HTTP/2), so small messages rarely cost a frame. This cannot stall
    /// a sender: when its credit is used up, what the application has consumed is at least the
    /// whole window. Ignored if the call is over.
    pub fn grant_credit(&mut self, id: CallId, bytes: u32) -> Result<(), CallError> {
        if self.closed.is_some() {
            return Err(CallError::Closed);
        }
        let threshold = u64::from(self.local.initial_call_window / 2).max(1);
        let Some(call) = self.calls.get_mut(&id.0) else {
            return Ok(());
        };
        call.grant_pending += u64::from(bytes);
        if call.grant_pending >= threshold {
            // One CREDIT carries at most 2^31 - 1, and the peer's credit may not exceed it.
            let room = (i64::from(MAX_WINDOW) - call.recv_window).max(0) as u64;
            let give = call.grant_pending.min(room).min(u64::from(MAX_WINDOW));
            if give > 0 {
                call.grant_pending -= give;
                call.recv_window += give as i64;
                self.put_credit(id.0, give as u32);
            }
        }
        Ok(())
    }

    /// Sends a PING; the answer arrives as [`Event::Pong`].
    pub fn ping(&mut self, data: [u8; 8]) {
        if self.closed.is_none() {
            frame::encode_ping(&mut self.out.staging, false, &data);
        }
    }

    /// Starts a graceful shutdown (GOAWAY): no new calls; open calls go on. A server names the
    /// highest call id it received as the last it will process.
    pub fn go_away(&mut self, code: ErrorCode, reason: &str) {
        if self.closed.is_some() {
            return;
        }
        let last = self
            .go_away_sent
            .map_or(self.highest, |l| l.min(self.highest));
        self.go_away_sent = Some(last);
        let max = self.peer.max_frame_size as usize;
        frame::encode_go_away(&mut self.out.staging, CallId(last), code, reason, max);
    }
}

fn unreachable_call(id: u32) -> ProtocolError {
    ProtocolError::new(ErrorCode::InternalError, format!("call {id} state lost"))
}

#[cfg(test)]
mod tests;
