//! Sending (protocol.md §5, §7.2): starting calls, messages (split when larger than the peer's
//! frames, resumed as credit arrives), half-closing, cancelling, response headers and ends.

use super::calls::PendingSend;
use super::{CallError, Connection, Event, Payload, Side};
use crate::frame::{
    self, call_len, clip, CallId, END_FIXED_LEN, HEADER_LEN, MAX_METHOD_ID, MAX_METHOD_NAME_LEN,
};
use crate::metadata::Metadata;
use crate::status::{Code, Status};
use std::time::{Duration, Instant};

impl Connection {
    /// Client: starts a call. `codec` is the payload codec byte (0 protobuf, 1 raw bytes, 2
    /// JSON); `timeout` is sent as the call's relative deadline, rounded up to whole
    /// microseconds (at least 1: `timeout_us` 0 means "no deadline"), and the call is expired
    /// locally at `now + timeout` (see [`Connection::handle_timeout`]). A zero timeout (the
    /// deadline already passed) is refused with [`CallError::DeadlineExceeded`]: the CALL is
    /// not sent.
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
        if timeout == Some(Duration::ZERO) {
            return Err(CallError::DeadlineExceeded);
        }
        if method.is_empty() || method.len() > MAX_METHOD_NAME_LEN {
            return Err(CallError::InvalidMethod(method.to_owned()));
        }
        let md_len = metadata.encoded_len();
        // The name goes along until the method is interned (or if it cannot be).
        let interned = self.interned(method);
        let name = interned.is_none().then_some(method);
        let limit = self.peer_metadata_limit(call_len(name, metadata) - md_len);
        if md_len > limit {
            return Err(CallError::MetadataTooLarge {
                size: md_len,
                limit: limit as u32,
            });
        }
        let id = self.highest.checked_add(1).ok_or(CallError::IdsExhausted)?;
        self.highest = id;
        let (method_id, named) = match interned {
            Some(mid) => (mid, false),
            None => {
                let next = self.methods_out.len() + 1;
                if next <= usize::from(MAX_METHOD_ID) {
                    self.methods_out.insert(method.into(), next as u16);
                    self.method_names.push(method.into());
                    self.last_method = next as u16;
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
        frame::write_call(
            &mut self.out.staging,
            CallId(id),
            method_id,
            named.then_some(method),
            codec,
            timeout_us,
            metadata,
        );
        let deadline = timeout.and_then(|t| now.checked_add(t));
        self.calls.insert(id, self.new_call(), deadline);
        self.grant_first_credit(id);
        Ok(CallId(id))
    }

    /// The id `method` is interned under, if it is: the method of the previous call is
    /// checked first, by comparing names.
    #[inline]
    fn interned(&mut self, method: &str) -> Option<u16> {
        let last = usize::from(self.last_method);
        if (self.method_names.get(last.wrapping_sub(1))).is_some_and(|n| **n == *method) {
            return Some(self.last_method);
        }
        let id = self.methods_out.get(method).copied()?;
        self.last_method = id;
        Some(id)
    }

    /// Sends one message on a call. Messages larger than the peer's frame size are split; the
    /// engine sends frames as credit allows and keeps the rest (by reference) until credit
    /// arrives. `end_stream` (client only) half-closes after the message.
    ///
    /// The message is a [`Bytes`](bytes::Bytes) or a [`Payload`] of several segments (sent as their
    /// concatenation, byte for byte: the wire does not see segments). Segments and pieces of
    /// them of at least 4 KiB go to [`Connection::poll_transmit`] by reference, never copied.
    ///
    /// Returns [`CallError::WouldBlock`] when the call has no credit or a previous message is
    /// still being sent; [`Event::Writable`] follows when it may try again.
    pub fn send_message(
        &mut self,
        id: CallId,
        message: impl Into<Payload>,
        end_stream: bool,
    ) -> Result<(), CallError> {
        self.send_payload(id, message.into(), end_stream)
    }

    fn send_payload(
        &mut self,
        id: CallId,
        message: Payload,
        end_stream: bool,
    ) -> Result<(), CallError> {
        self.check_open()?;
        if end_stream && self.side == Side::Server {
            return Err(CallError::NotAllowed(
                "the server ends its side with end_call",
            ));
        }
        let limit = self.peer.max_message_size;
        let len = message.len();
        if len > limit as usize {
            return Err(CallError::MessageTooLarge { size: len, limit });
        }
        let max_frame = self.peer.max_frame_size as usize;
        let call = self.calls.get_mut(id.0).ok_or(CallError::NotOpen(id))?;
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
        if len <= max_frame {
            frame::write_message_head(st, id, end_stream, None, len);
            call.send_credit -= (HEADER_LEN + len) as i64;
            match message.as_single() {
                Some(b) => self.out.push_body(b),
                None => {
                    for s in message.segments() {
                        self.out.push_body(s);
                    }
                }
            }
            return Ok(());
        }
        let first = max_frame - 4;
        frame::write_message_head(st, id, end_stream, Some(len as u32), first);
        call.send_credit -= (HEADER_LEN + max_frame) as i64;
        let out = &mut self.out;
        let (seg, offset) = message.walk(0, 0, first, |b| out.push_body(&b));
        call.pending = Some(Box::new(PendingSend {
            message,
            seg,
            offset,
            left: len - first,
        }));
        self.calls.pending_bytes += len - first;
        self.resume_send(id.0);
        Ok(())
    }

    /// Whether [`Connection::send_message`] would take a message on this call now (it has
    /// send credit and no message still going). When not, [`Event::Writable`] follows once it
    /// would: an owner can keep a message back without offering it first.
    #[inline]
    pub fn is_writable(&mut self, id: CallId) -> bool {
        let Some(call) = self.calls.get_mut(id.0) else {
            return false;
        };
        if call.pending.is_some() || call.send_credit <= 0 {
            call.writable_wanted = true;
            return false;
        }
        true
    }

    /// Sends what credit allows of a pending split message; reports writability.
    pub(super) fn resume_send(&mut self, id: u32) {
        let max_frame = self.peer.max_frame_size as usize;
        let Some(call) = self.calls.get_mut(id) else {
            return;
        };
        let mut sent = 0;
        while call.send_credit > 0 {
            let Some(p) = call.pending.as_mut() else {
                break;
            };
            let n = p.left.min(max_frame);
            sent += n;
            frame::write_continuation_head(&mut self.out.staging, CallId(id), n);
            let out = &mut self.out;
            (p.seg, p.offset) = p.message.walk(p.seg, p.offset, n, |b| out.push_body(&b));
            p.left -= n;
            if p.left == 0 {
                call.pending = None;
            }
            call.send_credit -= (HEADER_LEN + n) as i64;
        }
        if call.writable_wanted
            && call.pending.is_none()
            && (call.send_credit > 0 || call.close_wanted)
        {
            call.writable_wanted = false;
            call.close_wanted = false;
            self.events.push_back(Event::Writable { id: CallId(id) });
        }
        self.calls.pending_bytes = self.calls.pending_bytes.saturating_sub(sent);
    }

    /// Client: no more messages on this call (HALF_CLOSE). Not needed after a message sent
    /// with `end_stream`. Returns [`CallError::WouldBlock`] while a split message is still
    /// going out; [`Event::Writable`] follows as soon as it is out (HALF_CLOSE needs no
    /// credit).
    pub fn half_close(&mut self, id: CallId) -> Result<(), CallError> {
        self.need_side(
            Side::Client,
            "only the client half-closes; the server uses end_call",
        )?;
        self.check_open()?;
        let call = self.calls.get_mut(id.0).ok_or(CallError::NotOpen(id))?;
        if call.send_closed {
            return Err(CallError::NotAllowed("the call is already half-closed"));
        }
        if call.pending.is_some() {
            call.writable_wanted = true;
            call.close_wanted = true;
            return Err(CallError::WouldBlock);
        }
        call.send_closed = true;
        frame::write_half_close(&mut self.out.staging, id);
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
        if !self.calls.remove(id.0) {
            return Err(CallError::NotOpen(id));
        }
        self.put_cancel(id.0, code);
        Ok(())
    }

    /// Server: sends response headers (at most once, before any message).
    pub fn send_headers(&mut self, id: CallId, metadata: &Metadata) -> Result<(), CallError> {
        self.need_side(Side::Server, "only the server sends response headers")?;
        self.check_open()?;
        let limit = self.peer_metadata_limit(0) as u32;
        let call = self.calls.get_mut(id.0).ok_or(CallError::NotOpen(id))?;
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
        frame::write_headers(&mut self.out.staging, id, metadata);
        Ok(())
    }

    /// Server: ends a call with a status and trailers. Returns [`CallError::WouldBlock`] while
    /// a split message is still being sent on the call.
    ///
    /// A call can always be ended: if the status message and trailers are larger than the
    /// client accepts, the trailers are dropped and the message is cut at a character boundary
    /// so that the END fits (the code is kept; protocol.md §5.6).
    ///
    /// The status's own headers ([`Status::with_headers`]) go first, as HEADERS, if the call
    /// has sent none yet and they fit the client's metadata limit (otherwise the END goes
    /// alone: the status is what matters).
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
        let call = self.calls.get_mut(id.0).ok_or(CallError::NotOpen(id))?;
        if call.pending.is_some() {
            call.writable_wanted = true;
            call.close_wanted = true;
            return Err(CallError::WouldBlock);
        }
        let headers_done = call.headers_done;
        self.calls.remove(id.0);
        if !headers_done && !status.headers().is_empty() {
            self.put_status_headers(id, status.headers());
        }
        let message = clip(status.message(), usize::MAX);
        let size = 2 + message.len() + trailers.encoded_len();
        if size <= limit {
            self.put_end(id.0, status.code(), message, trailers);
        } else {
            // 2 (msg_len) + 2 (empty trailers) is the smallest END status, which always fits
            // (MAX_METADATA_SIZE >= 4): the trailers go and the message is cut at a character
            // boundary (protocol.md §5.6).
            let room = limit.saturating_sub(4);
            self.put_end(id.0, status.code(), clip(message, room), &Metadata::new());
        }
        Ok(())
    }

    /// A failing call's headers (see [`Connection::end_call`]), if they fit.
    #[cold]
    fn put_status_headers(&mut self, id: CallId, headers: &Metadata) {
        if headers.encoded_len() <= self.peer_metadata_limit(0) {
            frame::write_headers(&mut self.out.staging, id, headers);
        }
    }

    /// Ends a call from this side because of a call error.
    pub(super) fn end_locally(&mut self, id: u32, status: Status) {
        self.calls.remove(id);
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

    pub(super) fn put_end(&mut self, id: u32, code: Code, message: &str, trailers: &Metadata) {
        frame::write_end(&mut self.out.staging, CallId(id), code, message, trailers);
    }

    pub(super) fn put_cancel(&mut self, id: u32, code: Code) {
        frame::write_cancel(&mut self.out.staging, CallId(id), code);
    }

    pub(super) fn put_credit(&mut self, id: u32, increment: u32) {
        frame::write_credit(&mut self.out.staging, CallId(id), increment);
    }
}
