//! Per-call flow control (protocol.md §7): charging what the peer sends against its credit,
//! and giving credit back as the application consumes messages.

use super::{CallError, Connection};
use crate::error::{ErrorCode, ProtocolError};
use crate::frame::CallId;
use crate::settings::MAX_WINDOW;

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
        if call.recv_window <= 0 {
            let e = ProtocolError::new(
                ErrorCode::FLOW_CONTROL,
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
    pub(super) fn advance_credit_if_stalled(&mut self, id: u32) {
        let Some(call) = self.calls.get_mut(id) else {
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
}
