//! Per-call flow control (protocol.md §7): charging what the peer sends against its credit,
//! and giving credit back as the application consumes messages.

use super::calls::CallState;
use super::{CallError, Connection};
use crate::error::{ErrorCode, ProtocolError};
use crate::frame::CallId;
use crate::settings::MAX_WINDOW;
use std::time::Instant;

impl Connection {
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
        let Some(call) = self.calls.get_mut(id.0) else {
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

    /// Charges a received message frame against the peer's credit.
    pub(super) fn debit(&mut self, id: u32, cost: i64) -> Result<(), ProtocolError> {
        let call = self.calls.open(id)?;
        if let Err(e) = no_credit(call, id) {
            return Err(self.fail(e, true));
        }
        call.recv_window -= cost;
        Ok(())
    }

    /// A split message cannot complete if its chunks exhaust the window before the application
    /// sees it, so its chunks' credit is given back as they arrive while it is assembled
    /// (protocol.md §7) — and not again when the message is consumed: the message's
    /// [`Event::Message`](super::Event::Message) credit is only what was not given back here.
    /// While the memory budget, or this connection's share of it, is spent the credit is
    /// withheld, and given once it has room (checked again on [`Connection::handle_timeout`]).
    pub(super) fn advance_credit_if_stalled(&mut self, id: u32, now: Instant) {
        let spent = self.share.is_spent() && !self.may_progress(id);
        let Some(call) = self.calls.get_mut(id) else {
            return;
        };
        if call.recv_window > 0 {
            return;
        }
        let Some(asm) = call.assembling.as_mut() else {
            return;
        };
        if spent {
            if self.credit_withheld.is_none() {
                self.credit_withheld = Some(now);
                self.refresh_due();
            }
            return;
        }
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

    /// Whether a call's split message may go on while the budget is spent: one per connection
    /// (the first to ask, until it completes or ends) always does, so messages that each fit
    /// `MAX_MESSAGE_SIZE` but together exceed the budget cannot wait for one another for ever
    /// (protocol.md §9). What a connection holds is then bounded by its share of the budget
    /// plus one message.
    fn may_progress(&mut self, id: u32) -> bool {
        let current = self
            .progressing
            .filter(|&p| self.calls.get(p).is_some_and(|c| c.assembling.is_some()));
        match current {
            Some(p) => p == id,
            None => {
                let assembling = self.calls.get(id).is_some_and(|c| c.assembling.is_some());
                if assembling {
                    self.progressing = Some(id);
                }
                assembling
            }
        }
    }

    /// Grants the chunk credit withheld while the memory budget was spent, if it has room now;
    /// otherwise checks again after [`Limits::credit_recheck`](crate::Limits::credit_recheck).
    pub(super) fn grant_withheld_credit(&mut self, now: Instant) {
        // Each call still short of room sets it again.
        self.credit_withheld = None;
        self.refresh_due();
        for id in self.calls.ids_above(0) {
            self.advance_credit_if_stalled(id, now);
        }
    }

    /// A receiver whose `INITIAL_CALL_WINDOW` is 0 grants the first credit itself when a call
    /// starts (protocol.md §7): one byte, enough for one frame of any size (the overdraft
    /// rule); more follows as the application consumes.
    pub(super) fn grant_first_credit(&mut self, id: u32) {
        if self.local.initial_call_window == 0 {
            if let Some(call) = self.calls.get_mut(id) {
                call.recv_window += 1;
                self.put_credit(id, 1);
            }
        }
    }
}

/// A message frame the peer sent on a call where its credit was used up (protocol.md §7).
#[inline]
pub(super) fn no_credit(call: &CallState, id: u32) -> Result<(), ProtocolError> {
    if call.recv_window <= 0 {
        return Err(ProtocolError::new(
            ErrorCode::FLOW_CONTROL,
            format!(
                "message frame on call {id} sent without credit (the sender's credit is {})",
                call.recv_window
            ),
        ));
    }
    Ok(())
}
