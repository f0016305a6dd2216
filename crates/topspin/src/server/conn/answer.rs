//! How a connection's calls are answered: the call core's steps (`server::call`) carried out on
//! the engine — replies, stream messages and ENDs — and what waits for the client's credit.

use super::super::call::{self, Respond, ServerCall};
use super::super::handler::{BoxFut, Outcome};
use super::{SCmd, ServerRole, Waits, COMMAND_QUEUE};
use crate::connection::{call_error_status, send_message, Ack, Sent};
use crate::request::Cancellation;
use crate::Status;
use topspin_proto::{CallError, CallId, Connection, Metadata};

/// The native face's response side of one call ([`Respond`]): the engine, and where the
/// call's state is kept while its answer waits for the client.
struct Native<'a> {
    role: &'a mut ServerRole,
    conn: &'a mut Connection,
    id: u32,
    /// A call not in `calls` (its handler answered in its first poll, see `run_inline`): its
    /// cancellation handle, to put it there only if its reply or END has to wait.
    fresh: Option<Cancellation>,
}

impl Native<'_> {
    /// Keeps a reply and the END after it until the client grants credit.
    fn keep(&mut self, message: crate::codec::Payload, trailers: Metadata) {
        let (ack, _) = tokio::sync::oneshot::channel();
        let len = message.len();
        let waits = Waits {
            blocked: Some(Box::new((message, ack))),
            end: Some(Box::new((Status::ok(), trailers))),
        };
        match self.fresh.take() {
            Some(cancel) => {
                self.role.held += len;
                let kept = ServerCall::started(call::Cancel::returned(cancel), None, waits);
                self.role.calls.insert(self.id, kept);
            }
            None => {
                let calls = &mut self.role.calls;
                if let Some(w) = calls.get_mut(&self.id).and_then(ServerCall::send_mut) {
                    self.role.held += len;
                    *w = waits;
                }
            }
        }
    }
}

impl Respond for Native<'_> {
    #[inline(always)]
    fn headers(&mut self, headers: Metadata) -> Result<(), Status> {
        match self.conn.send_headers(CallId(self.id), &headers) {
            // Not open: the call is over already; not allowed: its headers went already.
            Ok(()) | Err(CallError::NotOpen(_) | CallError::NotAllowed(_)) => Ok(()),
            Err(e) => Err(call_error_status(e, "response headers")),
        }
    }

    #[inline(always)]
    fn reply_headers(&mut self, headers: Metadata) -> Result<(), Status> {
        if headers.is_empty() {
            return Ok(()); // no HEADERS: empty response headers (§5.4)
        }
        self.headers(headers)
    }

    #[inline(always)]
    fn reply(
        &mut self,
        message: crate::codec::Payload,
        trailers: Metadata,
    ) -> Result<Option<Metadata>, Status> {
        if !self.conn.is_writable(CallId(self.id)) {
            // No credit yet (a client whose window is 0 grants it with its CALL): the reply
            // and the END wait for Event::Writable (protocol.md §7).
            self.keep(message, trailers);
            return Ok(None);
        }
        match self.conn.send_message(CallId(self.id), message, false) {
            Ok(()) => Ok(Some(trailers)),
            Err(e) => Err(call_error_status(e, "response message")),
        }
    }

    fn send(&mut self, message: crate::codec::Payload, _compress: bool, ack: Ack) {
        self.role.send(self.id, message, ack, self.conn);
    }

    fn credit(&mut self, bytes: u32) {
        let _ = self.conn.grant_credit(CallId(self.id), bytes);
    }

    #[inline(always)]
    fn end(&mut self, status: Status, trailers: Metadata) {
        // A status that ends the call without trailers of its own carries them itself: its
        // metadata and details (a failing one; or an OK one a response stream ended with).
        let trailers = if trailers.is_empty()
            && !(status.metadata().is_empty() && status.details().is_empty())
        {
            status.wire_trailers()
        } else {
            trailers
        };
        match self.fresh.take() {
            Some(cancel) => self
                .role
                .end_fresh(self.id, status, trailers, cancel, self.conn),
            None => self.role.end(self.id, status, trailers, self.conn),
        }
    }
}

impl ServerRole {
    /// The answer of a handler that returned in its first poll, its call not in `calls` (see
    /// `run_inline`): put there only if its reply or its END has to wait for the client.
    pub(super) fn reply_fresh(
        &mut self,
        id: u32,
        reply: Result<(crate::codec::Payload, Metadata, Metadata), Status>,
        cancel: Cancellation,
        conn: &mut Connection,
    ) {
        let mut out = Native {
            role: self,
            conn,
            id,
            fresh: Some(cancel),
        };
        call::answer(Outcome::Reply(reply), &mut out);
    }

    /// `end` for a call whose handler returned and which is not in `calls`: it goes there only
    /// if its END has to wait for a message still being sent.
    pub(super) fn end_fresh(
        &mut self,
        id: u32,
        status: Status,
        trailers: Metadata,
        cancel: Cancellation,
        conn: &mut Connection,
    ) {
        if let Err(CallError::WouldBlock) = conn.end_call(CallId(id), &status, &trailers) {
            let waits = Waits {
                blocked: None,
                end: Some(Box::new((status, trailers))),
            };
            let kept = ServerCall::started(call::Cancel::returned(cancel), None, waits);
            self.calls.insert(id, kept);
            return;
        }
        // The handler returned: the call was not cancelled, and its handle is reused.
        cancel.recycle(&mut self.cancel_pool);
    }

    pub(super) fn recycle(&mut self, fut: Option<BoxFut>) {
        if let Some(f) = fut {
            if self.fut_pool.len() < 64 {
                self.fut_pool.push(f);
            }
        }
    }

    /// A handler returned.
    pub(super) fn finish(&mut self, id: u32, outcome: Outcome, conn: &mut Connection) {
        match self.calls.get_mut(&id) {
            Some(call) => call.handler_returned(),
            // A reply to a call that is over already goes nowhere.
            None if matches!(outcome, Outcome::Reply(Ok(_))) => return,
            None => {}
        }
        if let Outcome::Finished(_) = outcome {
            // A response stream's headers are queued, not awaited: they go before its END.
            for _ in 0..COMMAND_QUEUE {
                match self.rx.try_recv() {
                    Ok(cmd) => self.apply(cmd, conn),
                    Err(_) => break,
                }
            }
        }
        let mut out = Native {
            role: self,
            conn,
            id,
            fresh: None,
        };
        call::answer(outcome, &mut out);
    }

    /// Ends a call with a status (waiting for a message still being sent, if any). Also used
    /// to refuse a call that never got state here (unknown method, wrong codec).
    pub(super) fn end(
        &mut self,
        id: u32,
        status: Status,
        trailers: Metadata,
        conn: &mut Connection,
    ) {
        match conn.end_call(CallId(id), &status, &trailers) {
            Ok(()) => {}
            Err(CallError::WouldBlock) => {
                if let Some(w) = self.calls.get_mut(&id).and_then(ServerCall::send_mut) {
                    w.end = Some(Box::new((status, trailers)));
                    return;
                }
            }
            // A status too large for the client is shortened by the engine; anything else
            // means the call is already over.
            Err(_) => {}
        }
        if let Some(call) = self.calls.remove(&id) {
            // A handler still running (its call ended without it) stops; the handle is reused
            // if nothing else holds it.
            if let Some(waits) = call.over(None, Some(&mut self.cancel_pool)) {
                self.let_go(waits, crate::status::call_over());
            }
        }
    }

    /// Applies a streaming handler's command to its call.
    pub(super) fn apply(&mut self, cmd: SCmd, conn: &mut Connection) {
        let id = cmd.id();
        let mut out = Native {
            role: self,
            conn,
            id,
            fresh: None,
        };
        call::command(cmd, &mut out);
    }

    pub(super) fn send(
        &mut self,
        id: u32,
        message: crate::codec::Payload,
        ack: Ack,
        conn: &mut Connection,
    ) {
        match send_message(conn, CallId(id), message, ack) {
            Sent::Done => {}
            Sent::Blocked(b) => match self.calls.get_mut(&id).and_then(ServerCall::send_mut) {
                Some(w) => {
                    self.held += b.0.len();
                    w.blocked = Some(b);
                }
                _ => {
                    let _ = b.1.send(Err(crate::status::call_over()));
                }
            },
            Sent::Refused(CallError::NotOpen(_), ack) => {
                let _ = ack.send(Err(crate::status::call_over()));
            }
            Sent::Refused(e, ack) => {
                let st = call_error_status(e, "response message");
                let _ = ack.send(Err(st.clone()));
                self.end(id, st, Metadata::new(), conn);
            }
        }
    }

    pub(super) fn on_writable(&mut self, id: u32, conn: &mut Connection) {
        let Some(w) = self.calls.get_mut(&id).and_then(ServerCall::send_mut) else {
            return;
        };
        let blocked = w.blocked.take();
        let end = w.end.take();
        if let Some((message, ack)) = blocked.map(|b| *b) {
            self.held = self.held.saturating_sub(message.len());
            self.send(id, message, ack, conn);
        }
        if let Some((status, trailers)) = end.map(|b| *b) {
            self.end(id, status, trailers, conn);
        }
    }
}
