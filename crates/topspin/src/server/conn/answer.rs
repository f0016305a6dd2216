//! How a connection's calls are answered: replies, stream messages and ENDs handed to the
//! engine, and what waits for the client's credit.

use super::super::handler::{BoxFut, Outcome};
use super::{Call, SCmd, ServerRole, COMMAND_QUEUE};
use crate::connection::{call_error_status, send_message, Ack, Sent};
use crate::request::Cancellation;
use crate::Status;
use topspin_proto::{CallError, CallId, Connection, Metadata};

impl ServerRole {
    /// The answer of a handler that returned in its first poll, its call not in `calls` (see
    /// `run_inline`): the same steps as `finish` and `end`, the call put in `calls` only if
    /// its reply or its END has to wait for the client.
    pub(super) fn reply_fresh(
        &mut self,
        id: u32,
        reply: Result<(crate::codec::Payload, Metadata, Metadata), Status>,
        cancel: Cancellation,
        conn: &mut Connection,
    ) {
        let (message, headers, trailers) = match reply {
            Ok(r) => r,
            Err(status) => {
                let trailers = status.wire_trailers();
                self.end_fresh(id, status, trailers, cancel, conn);
                return;
            }
        };
        if !headers.is_empty() {
            if let Err(e) = conn.send_headers(CallId(id), &headers) {
                let st = self.local_error(e, "response headers");
                self.end_fresh(id, st, Metadata::new(), cancel, conn);
                return;
            }
        }
        if !conn.is_writable(CallId(id)) {
            // No credit yet (a client whose window is 0 grants it with its CALL): the reply
            // and the END wait for Event::Writable (protocol.md §7).
            let (ack, _) = tokio::sync::oneshot::channel();
            self.held += message.len();
            self.calls.insert(
                id,
                Call::Running {
                    cancel,
                    inbound: None,
                    blocked: Some(Box::new((message, ack))),
                    end: Some(Box::new((Status::ok(), trailers))),
                    returned: true,
                },
            );
            return;
        }
        match conn.send_message(CallId(id), message, false) {
            Ok(()) => self.end_fresh(id, Status::ok(), trailers, cancel, conn),
            Err(e) => {
                let st = self.local_error(e, "response message");
                self.end_fresh(id, st, Metadata::new(), cancel, conn);
            }
        }
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
            self.calls.insert(
                id,
                Call::Running {
                    cancel,
                    inbound: None,
                    blocked: None,
                    end: Some(Box::new((status, trailers))),
                    returned: true,
                },
            );
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
        if let Some(Call::Running { returned, .. }) = self.calls.get_mut(&id) {
            *returned = true;
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
        match outcome {
            Outcome::Reply(Ok((message, headers, trailers))) => {
                if !self.calls.contains_key(&id) {
                    return;
                }
                if !headers.is_empty() {
                    if let Err(e) = conn.send_headers(CallId(id), &headers) {
                        self.end(
                            id,
                            self.local_error(e, "response headers"),
                            Metadata::new(),
                            conn,
                        );
                        return;
                    }
                }
                if !conn.is_writable(CallId(id)) {
                    // No credit yet (a client whose window is 0 grants it with its CALL): the
                    // reply and the END wait for Event::Writable (protocol.md §7).
                    if let Some(Call::Running { blocked, end, .. }) = self.calls.get_mut(&id) {
                        let (ack, _) = tokio::sync::oneshot::channel();
                        self.held += message.len();
                        *blocked = Some(Box::new((message, ack)));
                        *end = Some(Box::new((Status::ok(), trailers)));
                        return;
                    }
                }
                match conn.send_message(CallId(id), message, false) {
                    Ok(()) => self.end(id, Status::ok(), trailers, conn),
                    Err(e) => self.end(
                        id,
                        self.local_error(e, "response message"),
                        Metadata::new(),
                        conn,
                    ),
                }
            }
            Outcome::Reply(Err(status)) | Outcome::Finished(Err(status)) => {
                let trailers = status.wire_trailers();
                self.end(id, status, trailers, conn);
            }
            Outcome::Finished(Ok(trailers)) => self.end(id, Status::ok(), trailers, conn),
        }
    }

    pub(super) fn local_error(&self, e: CallError, what: &str) -> Status {
        call_error_status(e, what)
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
            cancel,
            blocked,
            returned,
            ..
        }) = self.calls.remove(&id)
        {
            if let Some((m, ack)) = blocked.map(|b| *b) {
                self.held = self.held.saturating_sub(m.len());
                let _ = ack.send(Err(Status::cancelled("the call ended")));
            }
            // A handler still running (its call ended without it) must stop; a call whose
            // handler returned was not cancelled (a clone of the handle the application kept
            // must not fire), and the handle is reused if nothing else holds it.
            if !returned {
                cancel.cancel();
            }
            cancel.recycle(&mut self.cancel_pool);
        }
    }

    pub(super) fn apply(&mut self, cmd: SCmd, conn: &mut Connection) {
        match cmd {
            SCmd::Headers { id, metadata } => {
                if let Err(e) = conn.send_headers(CallId(id), &metadata) {
                    if !matches!(e, CallError::NotOpen(_) | CallError::NotAllowed(_)) {
                        self.end(
                            id,
                            self.local_error(e, "response headers"),
                            Metadata::new(),
                            conn,
                        );
                    }
                }
            }
            SCmd::Send {
                id, message, ack, ..
            } => self.send(id, message, ack, conn),
            SCmd::Credit { id, bytes } => {
                let _ = conn.grant_credit(CallId(id), bytes);
            }
        }
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
            Sent::Blocked(b) => match self.calls.get_mut(&id) {
                Some(Call::Running { blocked, .. }) => {
                    self.held += b.0.len();
                    *blocked = Some(b);
                }
                _ => {
                    let _ = b.1.send(Err(Status::cancelled("the call is over")));
                }
            },
            Sent::Refused(CallError::NotOpen(_), ack) => {
                let _ = ack.send(Err(Status::cancelled("the call is over")));
            }
            Sent::Refused(e, ack) => {
                let st = self.local_error(e, "response message");
                let _ = ack.send(Err(st.clone()));
                self.end(id, st, Metadata::new(), conn);
            }
        }
    }

    pub(super) fn on_writable(&mut self, id: u32, conn: &mut Connection) {
        let Some(Call::Running { blocked, end, .. }) = self.calls.get_mut(&id) else {
            return;
        };
        let blocked = blocked.take();
        let end = end.take();
        if let Some((message, ack)) = blocked.map(|b| *b) {
            self.held = self.held.saturating_sub(message.len());
            self.send(id, message, ack, conn);
        }
        if let Some((status, trailers)) = end.map(|b| *b) {
            self.end(id, status, trailers, conn);
        }
    }
}
