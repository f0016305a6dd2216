//! The outgoing byte queue: small frames coalesce into one buffer, large message bodies are
//! queued by reference so they are never copied.

use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;

/// Bodies at least this large are queued by reference instead of copied into the staging buffer.
pub(crate) const BY_REFERENCE_MIN: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct Transmit {
    /// Chunks ready to go, in order, all before `staging`.
    queue: VecDeque<Bytes>,
    /// Small frames being coalesced.
    pub(crate) staging: BytesMut,
    queued_bytes: usize,
}

impl Transmit {
    /// Appends a body after whatever is staged, copying it if it is small.
    #[inline]
    pub(crate) fn push_body(&mut self, body: &Bytes) {
        if body.len() < BY_REFERENCE_MIN {
            self.staging.extend_from_slice(body);
        } else {
            self.flush_staging();
            self.queued_bytes += body.len();
            self.queue.push_back(body.clone());
        }
    }

    fn flush_staging(&mut self) {
        if !self.staging.is_empty() {
            let b = self.staging.split().freeze();
            self.queued_bytes += b.len();
            self.queue.push_back(b);
        }
    }

    pub(crate) fn pop(&mut self) -> Option<Bytes> {
        if let Some(b) = self.queue.pop_front() {
            self.queued_bytes -= b.len();
            return Some(b);
        }
        if self.staging.is_empty() {
            None
        } else {
            Some(self.staging.split().freeze())
        }
    }

    /// All that waits, when it is only the staging buffer.
    pub(crate) fn contiguous(&self) -> Option<&[u8]> {
        (self.queue.is_empty() && !self.staging.is_empty()).then_some(&self.staging[..])
    }

    /// `n` bytes of [`Transmit::contiguous`] went out.
    pub(crate) fn consumed(&mut self, n: usize) {
        debug_assert!(self.queue.is_empty() && n <= self.staging.len());
        let n = n.min(self.staging.len());
        if n == self.staging.len() {
            // Back to the buffer's start: the next frames are staged in the same memory.
            self.staging.clear();
        } else {
            bytes::Buf::advance(&mut self.staging, n);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.queued_bytes + self.staging.len()
    }
}
