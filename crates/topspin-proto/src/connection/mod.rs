//! One side of a topspin connection as a deterministic state machine: received bytes and
//! commands in, [`Event`]s and bytes to transmit out, time passed in (protocol.md §2–§10).

//!
//! The engine by concern, one file each: `handshake.rs` (preface and SETTINGS), `recv.rs` (one
//! function per received frame type), `send.rs` (starting calls, messages and split-message
//! resumption, ending), `flow.rs` (per-call credit), `calls.rs` (the call store and its
//! deadline heap), `transmit.rs` (the outgoing byte queue), `event.rs` (what the owner is told).
//! This file keeps the state, the public API's entry points and the dispatch.

mod calls;
mod event;
mod flow;
mod handshake;
mod payload;
mod recv;
mod send;
mod transmit;

pub use event::{CallError, Event};
pub use payload::Payload;

use crate::budget::MemoryBudget;
use crate::error::{ErrorCode, ProtocolError};
use crate::frame::{self, CallId, FrameDecoder};
use crate::limits::{Bucket, Limits};
use crate::metadata::Metadata;
use crate::preface::{PREFACE, PREFACE_LEN};
use crate::settings::{Settings, MAX_WINDOW};
use crate::status::{Code, Status};
use bytes::{Bytes, BytesMut};
use bytestring::ByteString;
use calls::Calls;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;
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
    calls: Calls,
    /// Server: highest call id received. Client: highest call id allocated.
    highest: u32,
    /// Client: method name → interned id.
    methods_out: FxHashMap<Box<str>, u16>,
    /// Client: the interned names by id − 1 (at most `MAX_METHOD_ID`), and the id last used:
    /// a run of calls to one method compares the name instead of hashing it.
    method_names: Vec<Box<str>>,
    last_method: u16,
    /// Server: interned id → method name (index = id).
    methods_in: Vec<Option<ByteString>>,
    events: VecDeque<Event>,
    out: Transmit,
    go_away_sent: Option<u32>,
    go_away_received: Option<u32>,
    closed: Option<Option<ProtocolError>>,
    limits: Limits,
    /// Charged with the buffers of incomplete split messages.
    budget: Arc<MemoryBudget>,
    /// This connection's share of `budget` ([`SHARE_OF_BUDGET`]), charged with the buffers
    /// (and so charging `budget`): while it or the budget is spent, credit for its split
    /// messages is withheld (one goes on).
    share: Arc<MemoryBudget>,
    ping_bucket: Bucket,
    reset_bucket: Bucket,
    refused_bucket: Bucket,
    /// A PING answer is queued and not yet handed to the owner (PINGs meanwhile share it).
    pong_queued: bool,
    /// PINGs sent and not yet answered (an ACK beyond them is ignored).
    pings_outstanding: u32,
    /// Since when chunk credit has been withheld because the budget is spent.
    credit_withheld: Option<Instant>,
    /// The call whose split message goes on even while the budget is spent.
    progressing: Option<u32>,
    /// When a split message that is still incomplete times out: its last chunk plus
    /// [`Limits::message_timeout`] (cleared lazily, when it rings and finds none open).
    message_due: Option<Instant>,
    /// The earlier of the credit recheck (while credit is withheld) and `message_due`, kept
    /// up to date as either changes: `poll_timeout` runs a few times per call.
    due: Option<Instant>,
}

/// A connection's incomplete messages hold at most this fraction of the memory budget (one
/// eighth: 128 MiB of the default 1 GiB), plus the one message that always goes on.
pub const SHARE_OF_BUDGET: usize = 8;

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
        local.max_metadata_size = local
            .max_metadata_size
            .max(crate::settings::MIN_MAX_METADATA_SIZE);
        let budget = MemoryBudget::unlimited();
        let mut c = Connection {
            side,
            local,
            peer: Settings::default(),
            handshake: Handshake::AwaitPreface,
            decoder: FrameDecoder::new(local.max_frame_size),
            calls: Calls::default(),
            highest: 0,
            methods_out: FxHashMap::default(),
            method_names: Vec::new(),
            last_method: 0,
            methods_in: Vec::new(),
            events: VecDeque::new(),
            out: Transmit::default(),
            go_away_sent: None,
            go_away_received: None,
            closed: None,
            limits: Limits::default(),
            share: MemoryBudget::share_of(&budget, usize::MAX),
            budget,
            ping_bucket: Bucket::default(),
            reset_bucket: Bucket::default(),
            refused_bucket: Bucket::default(),
            pong_queued: false,
            pings_outstanding: 0,
            credit_withheld: None,
            progressing: None,
            message_due: None,
            due: None,
        };
        c.out.staging.extend_from_slice(&PREFACE);
        frame::encode_settings(&mut c.out.staging, &local);
        c
    }

    /// Sets this side's engine-local limits (protocol.md §9, "Local limits"); they apply from
    /// the next frame on.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
        self.refresh_due();
    }

    /// This side's engine-local limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Shares a memory budget for the buffers of incomplete split messages (default: a budget
    /// of this connection's own that never refuses). While it is spent, new calls a server
    /// receives end with `RESOURCE_EXHAUSTED` and credit for split-message chunks is withheld
    /// until it has room again. Set it before the first call: charges already made stay with
    /// the budget they were made to (and are given back to it).
    ///
    /// One connection holds at most `1 / SHARE_OF_BUDGET` of the budget in incomplete messages
    /// (plus the one message that always goes on): past its share, credit for its split
    /// messages is withheld as when the whole budget is spent, so a single peer cannot spend
    /// the budget and have every other connection's new calls refused.
    pub fn set_memory_budget(&mut self, budget: Arc<MemoryBudget>) {
        self.share = MemoryBudget::share_of(&budget, (budget.limit() / SHARE_OF_BUDGET).max(1));
        self.budget = budget;
    }

    /// The memory budget this connection charges.
    pub fn memory_budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
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
    #[inline]
    pub fn is_established(&self) -> bool {
        self.handshake == Handshake::Established
    }

    /// Whether the connection is closed (after a protocol error, an ERROR from the peer, or
    /// [`Connection::handle_eof`]).
    #[inline]
    pub fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    /// Whether a go-away was sent or received and no call is open any more: the owner may
    /// close the transport once [`Connection::poll_transmit`] is drained.
    #[inline]
    pub fn is_drained(&self) -> bool {
        (self.go_away_sent.is_some() || self.go_away_received.is_some()) && self.calls.is_empty()
    }

    /// Whether a go-away was sent or received.
    pub fn is_going_away(&self) -> bool {
        self.go_away_sent.is_some() || self.go_away_received.is_some()
    }

    /// The `last_call_id` of the GOAWAY received from the peer, if any: a client's calls above
    /// it were not processed by the server (protocol.md §8.3), so they are safe to retry.
    pub fn go_away_received(&self) -> Option<CallId> {
        self.go_away_received.map(CallId)
    }

    /// Number of open calls.
    #[inline]
    pub fn open_calls(&self) -> usize {
        self.calls.len()
    }

    /// Calls begun on this connection so far, a count that only grows (a server's highest call
    /// id received, a client's highest allocated): a call that began and ended between two
    /// looks at [`Connection::open_calls`] still changes it (an idle timer's use).
    pub fn calls_begun(&self) -> u64 {
        u64::from(self.highest)
    }

    /// Send credit this side has on a call (negative while overdrawn), if it is open.
    pub fn send_credit(&self, id: CallId) -> Option<i64> {
        self.calls.get(id.0).map(|c| c.send_credit)
    }

    /// Bytes queued for transmit.
    #[inline]
    pub fn transmit_len(&self) -> usize {
        self.out.len()
    }

    /// Bytes of split messages taken by [`Connection::send_message`] that wait for the peer's
    /// credit before they are queued for transmit: with [`Connection::transmit_len`], what
    /// this side holds for a peer that does not read.
    #[inline]
    pub fn pending_send_len(&self) -> usize {
        self.calls.pending_bytes
    }

    /// How many bytes the receive buffer must hold before the next frame can be decoded; lets
    /// a reader read a large frame into one exactly sized buffer.
    pub fn bytes_needed(&self, src: &[u8]) -> usize {
        if self.handshake == Handshake::AwaitPreface {
            return PREFACE_LEN.saturating_sub(src.len());
        }
        self.decoder.bytes_needed(src).unwrap_or(0)
    }

    /// Whether events are waiting for [`Connection::poll_event`].
    #[inline]
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next event, if any.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next event, if there is one and `accept` takes it (it stays first otherwise): lets
    /// an owner handle events that usually come together (a call's start, its one request and
    /// its half-close) in one step.
    #[inline]
    pub fn poll_event_if(&mut self, accept: impl FnOnce(&Event) -> bool) -> Option<Event> {
        if accept(self.events.front()?) {
            self.events.pop_front()
        } else {
            None
        }
    }

    /// The next chunk of bytes to write, in order; small frames come coalesced, large message
    /// bodies as their own [`Bytes`] (the caller's, never copied). Write them with one
    /// vectored write.
    #[inline]
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        let b = self.out.pop();
        if self.out.len() == 0 {
            self.pong_queued = false;
        }
        b
    }

    /// Everything waiting to be written, when it is all small frames coalesced in one buffer
    /// (nothing queued by reference): write it from here and say how much went with
    /// [`Connection::transmit_consumed`], instead of taking it with
    /// [`Connection::poll_transmit`]. `None` when nothing waits or a chunk is queued.
    ///
    /// ```
    /// use topspin_proto::{Connection, Side};
    /// let mut c = Connection::new(Side::Client, Default::default());
    /// let hello = c.transmit_contiguous().expect("the handshake's frames").len();
    /// c.transmit_consumed(hello);
    /// assert!(c.transmit_contiguous().is_none() && c.transmit_len() == 0);
    /// ```
    #[inline]
    pub fn transmit_contiguous(&self) -> Option<&[u8]> {
        self.out.contiguous()
    }

    /// `n` bytes of [`Connection::transmit_contiguous`] were written.
    #[inline]
    pub fn transmit_consumed(&mut self, n: usize) {
        self.out.consumed(n);
        if self.out.len() == 0 {
            self.pong_queued = false;
        }
    }

    /// When [`Connection::handle_timeout`] should next be called (a deadline), if ever.
    #[inline]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let deadline = self.calls.next_deadline();
        match self.due {
            Some(due) if self.closed.is_none() => Some(deadline.map_or(due, |d| d.min(due))),
            _ => deadline,
        }
    }

    /// Works `due` out again after `credit_withheld` or `message_due` changed.
    pub(super) fn refresh_due(&mut self) {
        let recheck = self
            .credit_withheld
            .map(|since| since + self.limits.credit_recheck());
        self.due = match (recheck, self.message_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Expires every call whose deadline is at or before `now` (protocol.md §8.1): the client
    /// sends CANCEL and reports [`Event::Ended`] `DEADLINE_EXCEEDED`; the server sends END
    /// `DEADLINE_EXCEEDED` and reports [`Event::Cancelled`].
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.credit_withheld.is_some() && self.closed.is_none() {
            self.grant_withheld_credit(now);
        }
        self.check_message_progress(now);
        while let Some(id) = self.calls.pop_expired(now) {
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
                    let message = status.message();
                    self.put_end(id, Code::DeadlineExceeded, message, &Metadata::new());
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
                ProtocolError::new(ErrorCode::NO_ERROR, "the connection is closed")
            }));
        }
        if !self.on_preface(src)? {
            return Ok(());
        }
        loop {
            // The commonest frames of a call go to their handlers without being built as a
            // `Frame` and dispatched: the same checks, in the same order.
            if self.handshake == Handshake::Established {
                if let Some(hot) = self.decoder.decode_hot(src, self.side == Side::Server) {
                    self.on_hot(hot, now)?;
                    if self.closed.is_some() {
                        return Ok(());
                    }
                    continue;
                }
            }
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

    /// [`Limits::message_timeout`]: closes the connection when split messages are open and
    /// none got a chunk for that long while this side gave credit.
    fn check_message_progress(&mut self, now: Instant) {
        let (Some(due), Some(limit)) = (self.message_due, self.limits.message_timeout()) else {
            return;
        };
        if now < due || self.closed.is_some() {
            return;
        }
        // The call that goes on while credit is withheld (one per connection) has credit.
        let one_could_send = self
            .progressing
            .is_some_and(|p| self.calls.get(p).is_some_and(|c| c.assembling.is_some()));
        if !self.calls.any_assembling() {
            self.message_due = None;
            self.refresh_due();
        } else if self.credit_withheld.is_some() && !one_could_send {
            // Our doing, not the sender's: its time starts again once credit flows.
            self.message_due = Some(now + limit);
            self.refresh_due();
        } else {
            self.close(ProtocolError::new(
                ErrorCode::TIMEOUT,
                format!("a split message got no chunk for {limit:?} (frame_timeout)"),
            ));
        }
    }

    /// A chunk of a split message that is not complete yet arrived: its timeout starts again.
    #[inline]
    fn message_progressed(&mut self, now: Instant) {
        if let Some(limit) = self.limits.message_timeout() {
            self.message_due = Some(now + limit);
            self.refresh_due();
        }
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
        for id in self.calls.take_all() {
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
    }

    fn illegal(&mut self, reason: String) -> Result<(), ProtocolError> {
        Err(self.fail(ProtocolError::new(ErrorCode::ILLEGAL_FRAME, reason), true))
    }

    /// The largest metadata block (for END: status size) this side may send the peer in a frame
    /// whose other fields take `fixed` bytes: the peer's `MAX_METADATA_SIZE`, and never so much
    /// that the frame passes the peer's `MAX_FRAME_SIZE` (protocol.md §9), so every frame this
    /// side sends is one the peer accepts.
    fn peer_metadata_limit(&self, fixed: usize) -> usize {
        let frame_room = (self.peer.max_frame_size as usize).saturating_sub(fixed);
        (self.peer.max_metadata_size as usize).min(frame_room)
    }

    /// A new call's state: the peer's window to send into, ours to receive with.
    fn new_call(&self) -> calls::CallState {
        calls::CallState::new(
            self.peer.initial_call_window,
            self.local.initial_call_window,
        )
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

    /// Sends a PING; the answer arrives as [`Event::Pong`].
    pub fn ping(&mut self, data: [u8; 8]) {
        if self.closed.is_none() {
            self.pings_outstanding = self.pings_outstanding.saturating_add(1);
            frame::encode_ping(&mut self.out.staging, false, &data);
        }
    }

    /// Closes the connection because the peer went past a local rate (protocol.md §9): GOAWAY
    /// then ERROR, both `ENHANCE_YOUR_CALM` with the reason.
    fn calm_down(&mut self, reason: String) -> Result<(), ProtocolError> {
        self.go_away(ErrorCode::ENHANCE_YOUR_CALM, &reason);
        let e = ProtocolError::new(ErrorCode::ENHANCE_YOUR_CALM, reason);
        Err(self.fail(e, true))
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
