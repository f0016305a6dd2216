//! What a connection does with each received frame (protocol.md §5, §6, §8): one function per
//! frame type, after the dispatch.

use super::calls::{state_lost, Assembly, CallState};
use super::flow::no_credit;
use super::{Connection, Event, Handshake, Side};
use crate::error::{ErrorCode, ProtocolError};
use crate::frame::{
    self, CallFrame, CallId, EndFrame, Frame, FrameType, Hot, MessageFrame, HEADER_LEN,
    MAX_METHOD_ID,
};
use crate::metadata::Metadata;
use crate::settings::MAX_WINDOW;
use crate::status::{Code, Status};
use bytes::Bytes;
use bytestring::ByteString;
use std::time::{Duration, Instant};

impl Connection {
    /// Dispatches a decoded frame (after the handshake) to its handler.
    #[inline(always)]
    pub(super) fn on_frame(&mut self, frame: Frame, now: Instant) -> Result<(), ProtocolError> {
        if self.handshake == Handshake::AwaitSettings {
            return self.on_first_frame(frame);
        }
        self.check_sender(frame.frame_type())?;
        match frame {
            Frame::Settings(_) => {
                let e = ProtocolError::new(ErrorCode::SETTINGS_ERROR, "SETTINGS sent twice");
                Err(self.fail(e, true))
            }
            Frame::Ping { ack: false, data } => self.on_ping(data, now),
            Frame::Ping { ack: true, data } => {
                // An answer to no PING of ours is ignored (it cannot make events pile up).
                if self.pings_outstanding > 0 {
                    self.pings_outstanding -= 1;
                    self.events.push_back(Event::Pong { data });
                }
                Ok(())
            }
            Frame::GoAway {
                last_call_id,
                code,
                reason,
            } => self.on_go_away(last_call_id.0, code, reason),
            Frame::Error { code, reason } => {
                let e = ProtocolError::new(
                    code,
                    format!("the peer closed the connection with {code}: {}", &*reason),
                );
                Err(self.fail(e, false))
            }
            Frame::Extension { .. } => Ok(()),
            Frame::Call(c) => self.on_call(c, now),
            other => self.on_call_frame(other, now),
        }
    }

    /// A frame only the other side may send is `ILLEGAL_FRAME` (protocol.md §5).
    fn check_sender(&mut self, ty: FrameType) -> Result<(), ProtocolError> {
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
        Ok(())
    }

    /// PING (protocol.md §5.9): answered, at most one answer queued at a time, within the
    /// local ping rate (§9).
    fn on_ping(&mut self, data: [u8; 8], now: Instant) -> Result<(), ProtocolError> {
        if !self.ping_bucket.take(self.limits.ping_rate(), now) {
            let rate = self.limits.ping_rate();
            return self.calm_down(format!(
                "too_many_pings: the peer sent PINGs faster than this side allows (a burst of {}, then one per {:?})",
                rate.burst(),
                rate.interval()
            ));
        }
        if !self.pong_queued {
            self.pong_queued = true;
            frame::encode_ping(&mut self.out.staging, true, &data);
        }
        Ok(())
    }

    fn on_go_away(
        &mut self,
        last: u32,
        code: ErrorCode,
        reason: ByteString,
    ) -> Result<(), ProtocolError> {
        if let Some(prev) = self.go_away_received {
            if last > prev {
                return self.illegal(format!(
                    "GOAWAY raises last_call_id from {prev} to {last}; a later GOAWAY may only lower it"
                ));
            }
            if last == prev {
                return Ok(()); // nothing new
            }
        }
        self.go_away_received = Some(last);
        if self.side == Side::Client {
            for id in self.calls.ids_above(last) {
                self.calls.remove(id);
                self.events.push_back(Event::Ended {
                    id: CallId(id),
                    status: Status::new(
                        Code::Unavailable,
                        format!(
                            "the server is going away ({}) and did not process this call; it is safe to retry",
                            &*reason
                        ),
                    )
                    .with_unprocessed(),
                    trailers: Metadata::new(),
                });
            }
        }
        self.events.push_back(Event::GoAway {
            last_call_id: CallId(last),
            code,
            reason,
        });
        Ok(())
    }

    fn on_call(&mut self, c: CallFrame, now: Instant) -> Result<(), ProtocolError> {
        let id = c.call_id.0;
        if id <= self.highest {
            let e = ProtocolError::new(
                ErrorCode::DUPLICATE_CALL,
                format!(
                    "CALL with call id {id} is not above the highest call id so far ({})",
                    self.highest
                ),
            );
            return Err(self.fail(e, true));
        }
        self.highest = id;
        if let Some(last) = self.go_away_received {
            return self.illegal(format!(
                "CALL {id} after the client's own GOAWAY (last call id {last})"
            ));
        }
        let method = self.bind_method(c.method_name, c.method_id)?;
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
            if !self
                .refused_bucket
                .take(self.limits.refused_call_rate(), now)
            {
                return self.calm_down(format!(
                    "too_many_refused_calls: the client keeps starting calls over this server's max_concurrent_calls of {}",
                    self.local.max_concurrent_calls
                ));
            }
            let msg = format!(
                "too many concurrent calls: this server allows {} per connection (max_concurrent_calls)",
                self.local.max_concurrent_calls
            );
            self.put_end(id, Code::ResourceExhausted, &msg, &Metadata::new());
            return Ok(());
        }
        if self.budget.is_spent() {
            let msg = format!(
                "process memory budget for incoming messages exhausted ({} bytes)",
                self.budget.limit()
            );
            self.put_end(id, Code::ResourceExhausted, &msg, &Metadata::new());
            return Ok(());
        }
        // A timeout too far away to represent is no deadline at all.
        let deadline = (c.timeout_us > 0)
            .then(|| now.checked_add(Duration::from_micros(c.timeout_us)))
            .flatten();
        self.calls.insert(id, self.new_call(), deadline);
        self.grant_first_credit(id);
        self.events.push_back(Event::CallStarted {
            id: c.call_id,
            method,
            method_id: if c.method_id <= MAX_METHOD_ID {
                c.method_id
            } else {
                0
            },
            codec: c.codec,
            deadline,
            metadata: c.metadata,
        });
        Ok(())
    }

    /// The method a CALL names: its name (binding an id to it, protocol.md §5.3.1), or the
    /// name an earlier CALL bound to its id.
    fn bind_method(
        &mut self,
        name: Option<ByteString>,
        method_id: u16,
    ) -> Result<ByteString, ProtocolError> {
        match (name, method_id) {
            (Some(name), 0) => Ok(name),
            (Some(name), mid @ 1..=MAX_METHOD_ID) => {
                let slot = usize::from(mid);
                if self.methods_in.len() <= slot {
                    self.methods_in.resize(slot + 1, None);
                }
                if let Some(old) = &self.methods_in[slot] {
                    let e = ProtocolError::new(
                        ErrorCode::METHOD_ID_ERROR,
                        format!("method id {mid} is already bound to {:?}", &**old),
                    );
                    return Err(self.fail(e, true));
                }
                self.methods_in[slot] = Some(name.clone());
                Ok(name)
            }
            (None, mid @ 1..=MAX_METHOD_ID) => {
                match self
                    .methods_in
                    .get(usize::from(mid))
                    .and_then(|m| m.clone())
                {
                    Some(name) => Ok(name),
                    None => {
                        let e = ProtocolError::new(
                            ErrorCode::METHOD_ID_ERROR,
                            format!("method id {mid} was never bound on this connection"),
                        );
                        Err(self.fail(e, true))
                    }
                }
            }
            (Some(_), mid) => {
                let e = ProtocolError::new(
                    ErrorCode::METHOD_ID_ERROR,
                    format!(
                        "NAMED CALL binds method id {mid}, which is out of range (0 for no binding, or 1..={MAX_METHOD_ID})"
                    ),
                );
                Err(self.fail(e, true))
            }
            (None, mid) => {
                let e = ProtocolError::new(
                    ErrorCode::METHOD_ID_ERROR,
                    format!("method id {mid} without a name is out of range 1..={MAX_METHOD_ID}"),
                );
                Err(self.fail(e, true))
            }
        }
    }

    /// A frame of an open call: ignored if it crossed the call's end on the wire, an error if
    /// the call never existed (protocol.md §6), else handled by its type.
    fn on_call_frame(&mut self, frame: Frame, now: Instant) -> Result<(), ProtocolError> {
        let id = frame.call_id().0;
        if !self.calls.contains(id) {
            return self.not_open(frame.frame_type(), id);
        }
        match frame {
            Frame::Message(m) => self.on_message(id, m, now),
            Frame::Continuation { chunk, .. } => self.on_continuation(id, chunk, now),
            Frame::Headers { metadata, .. } => self.on_headers(id, metadata),
            Frame::HalfClose { .. } => self.on_half_close(id),
            Frame::End(e) => {
                self.on_end(id, e);
                Ok(())
            }
            Frame::Cancel { code, .. } => self.on_cancel(id, code, now),
            Frame::Credit { increment, .. } => self.on_credit(id, increment),
            _ => Ok(()),
        }
    }

    /// A frame decoded by `handle_input`'s fast path once the handshake is done (a CALL only
    /// on a server, an END only on a client: the side that may receive it): as
    /// [`Connection::on_frame`] and [`Connection::on_call_frame`] would take it.
    #[inline(always)]
    pub(super) fn on_hot(&mut self, hot: Hot, now: Instant) -> Result<(), ProtocolError> {
        match hot {
            Hot::Message(m) => {
                let id = m.call_id.0;
                if !self.calls.contains(id) {
                    return self.not_open(FrameType::MESSAGE, id);
                }
                self.on_message(id, m, now)
            }
            Hot::Call(c) => self.on_call(c, now),
            Hot::End(e) => {
                let id = e.call_id.0;
                if !self.calls.contains(id) {
                    return self.not_open(FrameType::END, id);
                }
                self.on_end(id, e);
                Ok(())
            }
        }
    }

    /// A frame of a call that is not open: ignored if it crossed the call's end on the wire,
    /// an error if the call never existed (protocol.md §6).
    #[cold]
    fn not_open(&mut self, ty: FrameType, id: u32) -> Result<(), ProtocolError> {
        if id <= self.highest {
            return Ok(()); // crossed an END or CANCEL on the wire (protocol.md §6)
        }
        let e = ProtocolError::new(
            ErrorCode::UNKNOWN_CALL,
            format!(
                "{} frame for call id {id}, which was never opened (highest so far: {})",
                ty.name(),
                self.highest
            ),
        );
        Err(self.fail(e, true))
    }

    /// MESSAGE (protocol.md §5.4): a whole message, or the first chunk of a split one.
    fn on_message(&mut self, id: u32, m: MessageFrame, now: Instant) -> Result<(), ProtocolError> {
        if m.end_stream && self.side == Side::Client {
            return self.illegal("MESSAGE with END_STREAM sent by the server".into());
        }
        let cost = (HEADER_LEN + m.chunk.len() + m.total_len.map_or(0, |_| 4)) as i64;
        let total = m.total_len.map_or(m.chunk.len(), |t| t as usize);
        // One look-up: the checks only read the call, and any failure closes the connection.
        let call = self.calls.open(id)?;
        if let Err(e) = check_message(call, id, &m, total) {
            return Err(self.fail(e, true));
        }
        call.recv_window -= cost;
        if self.side == Side::Client {
            call.headers_done = true; // HEADERS may no longer follow
        }
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
            Some(_) => {
                // Nothing is reserved from `total_len` (a claim): the buffer grows as chunks
                // arrive, charged to the memory budget (protocol.md §5.3, §9).
                let share = self.share.clone();
                let mut asm = Assembly::new(total, m.end_stream, cost as u64, share);
                asm.push(&m.chunk);
                call.assembling = Some(Box::new(asm));
                self.message_progressed(now);
                self.advance_credit_if_stalled(id, now);
            }
        }
        Ok(())
    }

    /// CONTINUATION (protocol.md §5.5): the next chunk of a split message.
    fn on_continuation(
        &mut self,
        id: u32,
        chunk: Bytes,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        let cost = (HEADER_LEN + chunk.len()) as i64;
        let call = self.calls.open(id)?;
        let Some(asm) = &call.assembling else {
            let e = ProtocolError::new(
                ErrorCode::MESSAGE_LENGTH_MISMATCH,
                format!("CONTINUATION on call {id} with no split message open"),
            );
            return Err(self.fail(e, true));
        };
        if asm.len() + chunk.len() > asm.total {
            let e = ProtocolError::new(
                ErrorCode::MESSAGE_LENGTH_MISMATCH,
                format!(
                    "CONTINUATION on call {id} goes past the declared total of {} bytes ({} + {})",
                    asm.total,
                    asm.len(),
                    chunk.len()
                ),
            );
            return Err(self.fail(e, true));
        }
        self.debit(id, cost)?;
        let call = self.calls.open(id)?;
        let asm = call.assembling.as_mut().ok_or_else(|| state_lost(id))?;
        asm.push(&chunk);
        asm.owed += cost as u64;
        if asm.is_complete() {
            let mut asm = call.assembling.take().ok_or_else(|| state_lost(id))?;
            self.events.push_back(Event::Message {
                id: CallId(id),
                message: asm.take(),
                credit: asm.owed.min(u64::from(MAX_WINDOW)) as u32,
            });
            if asm.end_stream {
                self.events.push_back(Event::HalfClosed { id: CallId(id) });
            }
        } else {
            self.message_progressed(now);
            self.advance_credit_if_stalled(id, now);
        }
        Ok(())
    }

    /// HEADERS (protocol.md §5.6): the server's response headers.
    fn on_headers(&mut self, id: u32, metadata: Metadata) -> Result<(), ProtocolError> {
        let call = self.calls.open(id)?;
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

    /// HALF_CLOSE (protocol.md §5.7): the client sends no more.
    fn on_half_close(&mut self, id: u32) -> Result<(), ProtocolError> {
        let call = self.calls.open(id)?;
        if call.recv_closed {
            return self.illegal(format!(
                "HALF_CLOSE on call {id}, which is already half-closed"
            ));
        }
        if call.assembling.is_some() {
            let e = ProtocolError::new(
                ErrorCode::MESSAGE_LENGTH_MISMATCH,
                format!("HALF_CLOSE on call {id} in the middle of a split message"),
            );
            return Err(self.fail(e, true));
        }
        call.recv_closed = true;
        self.events.push_back(Event::HalfClosed { id: CallId(id) });
        Ok(())
    }

    /// END (protocol.md §5.8): the server's status; the call is over.
    fn on_end(&mut self, id: u32, e: EndFrame) {
        self.calls.remove(id);
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
    }

    /// CANCEL (protocol.md §5.9): the client abandons the call.
    fn on_cancel(&mut self, id: u32, code: Code, now: Instant) -> Result<(), ProtocolError> {
        // The check comes before the call is forgotten, so that closing the connection still
        // tells this call's handler (with the others).
        let answered = self.calls.get(id).is_some_and(|c| c.headers_done);
        if !answered && !self.reset_bucket.take(self.limits.rapid_reset_rate(), now) {
            let rate = self.limits.rapid_reset_rate();
            return self.calm_down(format!(
                "too_many_resets: the client cancelled calls before they were answered faster than this server allows (a burst of {}, then one per {:?})",
                rate.burst(),
                rate.interval()
            ));
        }
        self.calls.remove(id);
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

    /// CREDIT (protocol.md §5.10, §7): more send credit on a call.
    fn on_credit(&mut self, id: u32, increment: u32) -> Result<(), ProtocolError> {
        let call = self.calls.open(id)?;
        let credit = call.send_credit + i64::from(increment);
        if credit > i64::from(MAX_WINDOW) {
            let e = ProtocolError::new(
                ErrorCode::FLOW_CONTROL,
                format!("CREDIT of {increment} on call {id} raises its credit to {credit}, above 2147483647"),
            );
            return Err(self.fail(e, true));
        }
        call.send_credit = credit;
        self.resume_send(id);
        Ok(())
    }
}

/// What makes a MESSAGE on an open call a connection error (protocol.md §5.4, §7), in the order
/// they are checked: the client half-closed, a split message is incomplete, the sender had no
/// credit, or a split message that should not be split.
#[inline]
fn check_message(
    call: &CallState,
    id: u32,
    m: &MessageFrame,
    total: usize,
) -> Result<(), ProtocolError> {
    if call.recv_closed {
        return Err(ProtocolError::new(
            ErrorCode::ILLEGAL_FRAME,
            format!("MESSAGE on call {id} after the client half-closed"),
        ));
    }
    if call.assembling.is_some() {
        return Err(ProtocolError::new(
            ErrorCode::MESSAGE_LENGTH_MISMATCH,
            format!("MESSAGE on call {id} while a split message is incomplete"),
        ));
    }
    no_credit(call, id)?;
    if m.total_len.is_some() && m.chunk.len() >= total {
        return Err(ProtocolError::new(
            ErrorCode::MESSAGE_LENGTH_MISMATCH,
            format!(
                "split MESSAGE on call {id} already holds {} of its {total} bytes; it should not be split",
                m.chunk.len()
            ),
        ));
    }
    Ok(())
}
