//! The request side of a gRPC-face call: its body read within the stream window, deframed
//! into messages (each reserved against the memory budget as it grows), handed to the handler
//! — one message for unary and server-streaming methods, a stream for the others — the window
//! given back as the handler consumes, and a message that stops arriving timed out.

use super::wire::Deframer;
use crate::server::call::{Received, ServerCall, Waiting};
use crate::{Encoding, Status};
use bytes::Bytes;
use h2::RecvStream;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::time::Sleep;
use topspin_proto::Code;

/// How often a call whose window is withheld (memory budget spent) looks for room again.
const RETRY_WINDOW: Duration = Duration::from_millis(20);

/// Sets a call's timer to ring at `at`, making it the first time.
pub(super) fn arm(mut timer: Pin<&mut Option<Sleep>>, at: Instant) {
    match timer.as_mut().as_pin_mut() {
        Some(t) => t.reset(at.into()),
        None => timer.set(Some(tokio::time::sleep_until(at.into()))),
    }
}

/// Whether an armed timer rang (one never armed never rings).
pub(super) fn poll_armed(timer: Pin<&mut Option<Sleep>>, cx: &mut std::task::Context<'_>) -> bool {
    timer.as_pin_mut().is_some_and(|t| t.poll(cx).is_ready())
}

/// What bounds a call's requests (its connection's settings).
pub(super) struct Limits {
    /// The stream window: request bytes handed to the handler and not consumed yet.
    pub(super) window: usize,
    /// What large request messages are reserved against.
    pub(super) budget: Arc<topspin_proto::MemoryBudget>,
    pub(super) max_message_size: u32,
    /// A message that stops arriving for this long (window open) ends its call.
    pub(super) frame_timeout: Duration,
    /// Where the stall timer waits while not armed.
    pub(super) far: Instant,
    /// The connection's buffer for split messages (`wire::Spare`).
    pub(super) spare: Arc<super::wire::Spare>,
}

/// What a call's request side holds.
pub(super) struct Inbound {
    deframer: Deframer,
    /// The body may still bring data.
    pub(super) body_open: bool,
    /// Request bytes handed to the handler and not consumed yet; the body is read only while
    /// they are under the stream window, so a handler that does not read bounds the client.
    pub(super) outstanding: usize,
    /// Window taken off h2 while an unfinished message is held and the memory budget is
    /// spent: given back once there is room (as native chunk credit is withheld).
    pub(super) withheld: usize,
    /// The stall timer is armed: part of a message is held and the window is open (the
    /// client can send). Re-armed lazily: bytes only move `last_bytes`, the timer is reset
    /// when it rings early.
    pub(super) stall_armed: bool,
    /// When bytes last came, while the stall timer is armed (read from the clock only then).
    last_bytes: Instant,
    limit: u32,
    recv: Option<Encoding>,
    window: usize,
    frame_timeout: Duration,
}

impl Inbound {
    pub(super) fn new(limits: Limits, recv: Option<Encoding>, body_open: bool) -> Inbound {
        Inbound {
            deframer: Deframer::new(limits.window, Some(limits.budget)).with_spare(limits.spare),
            body_open,
            outstanding: 0,
            withheld: 0,
            stall_armed: false,
            last_bytes: limits.far,
            limit: limits.max_message_size,
            recv,
            window: limits.window,
            frame_timeout: limits.frame_timeout,
        }
    }

    /// Whether the body is to be read now.
    #[inline]
    pub(super) fn wants_data(&self) -> bool {
        self.body_open && self.outstanding < self.window
    }

    /// A chunk of the body arrived: the messages it completes go to `call` (the handler's
    /// request stream, or kept as the one request), and the window reopens (bounded by
    /// `outstanding`) unless an unfinished message is held with the memory budget spent.
    pub(super) fn on_data(
        &mut self,
        chunk: Bytes,
        call: &mut ServerCall,
        body: &mut RecvStream,
        mut retry: Pin<&mut Option<Sleep>>,
        stall: Pin<&mut Option<Sleep>>,
    ) -> Result<(), Status> {
        let n = chunk.len();
        self.deframer.push(chunk);
        while let Some(r) = self.deframer.next(self.limit as usize, self.recv)? {
            // Counted as the larger of its wire and decompressed sizes: a slow reader's queue
            // holds at most a window of what the handler will see.
            let cost = r.wire_len.max(r.message.len());
            let credit = u32::try_from(cost).unwrap_or(u32::MAX);
            if call.on_message(r.message, credit, r.compressed)? == Received::Queued {
                self.outstanding += cost;
            }
        }
        if self.deframer.must_wait() {
            if self.withheld == 0 {
                arm(retry.as_mut(), Instant::now() + RETRY_WINDOW);
            }
            self.withheld += n;
        } else {
            let _ = body.flow_control().release_capacity(n + self.withheld);
            self.withheld = 0;
        }
        // Bytes came: a message still incomplete has `frame_timeout` from now (not while its
        // window is withheld: the client cannot send then).
        let partial = self.withheld == 0 && !self.deframer.is_empty();
        if partial {
            self.last_bytes = Instant::now();
            if !self.stall_armed {
                arm(stall, self.last_bytes + self.frame_timeout);
            }
        }
        self.stall_armed = partial;
        Ok(())
    }

    /// Time to look again whether the withheld window can be given back.
    pub(super) fn on_retry(
        &mut self,
        body: &mut RecvStream,
        retry: Pin<&mut Option<Sleep>>,
        stall: Pin<&mut Option<Sleep>>,
    ) {
        if self.deframer.must_wait() {
            arm(retry, Instant::now() + RETRY_WINDOW);
        } else {
            let _ = body.flow_control().release_capacity(self.withheld);
            self.withheld = 0;
            self.last_bytes = Instant::now();
            self.stall_armed = !self.deframer.is_empty();
            arm(stall, self.last_bytes + self.frame_timeout);
        }
    }

    /// The stall timer rang: the message in progress stopped arriving (an error), or bytes
    /// came since it was armed (armed again).
    pub(super) fn on_stalled(&mut self, stall: Pin<&mut Option<Sleep>>) -> Result<(), Status> {
        if self.last_bytes + self.frame_timeout > Instant::now() {
            arm(stall, self.last_bytes + self.frame_timeout);
            return Ok(());
        }
        Err(Status::new(
            Code::Unavailable,
            format!(
                "a request message stayed incomplete for {:?} (frame_timeout)",
                self.frame_timeout
            ),
        ))
    }

    /// The body ended: `call`'s request stream ends; a unary or server-streaming handler gets
    /// its one message (`Ok(Some(..))`: start it).
    pub(super) fn on_end(
        &mut self,
        call: &mut ServerCall,
    ) -> Result<Option<(Waiting, Bytes)>, Status> {
        self.body_open = false;
        if !self.deframer.is_empty() {
            return Err(Status::internal(
                "the request stream ended inside a message",
            ));
        }
        call.on_half_closed()
    }
}
