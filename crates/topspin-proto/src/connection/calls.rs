//! The calls a connection has open: per-call state, and the store that keeps it with the
//! deadline heap (protocol.md §6–§8).

use crate::budget::MemoryBudget;
use crate::error::{ErrorCode, ProtocolError};
use bytes::Bytes;
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Instant;

/// The rest of a message being sent in several frames.
#[derive(Debug)]
pub(crate) struct PendingSend {
    pub(crate) message: super::Payload,
    /// Where the rest starts: a segment and an offset in it.
    pub(crate) seg: usize,
    pub(crate) offset: usize,
    /// Bytes not sent yet.
    pub(crate) left: usize,
}

/// A split message being received. Its buffer grows as chunks arrive (never past twice what
/// has arrived, nor past `total`), and what it holds is charged to the connection's
/// [`MemoryBudget`] until it completes or is dropped (the call ended, the connection went).
#[derive(Debug)]
pub(crate) struct Assembly {
    buf: Vec<u8>,
    pub(crate) total: usize,
    pub(crate) end_stream: bool,
    /// Wire cost of its frames so far that the connection has not yet given back.
    pub(crate) owed: u64,
    budget: Arc<MemoryBudget>,
    charged: usize,
}

impl Assembly {
    pub(crate) fn new(
        total: usize,
        end_stream: bool,
        owed: u64,
        budget: Arc<MemoryBudget>,
    ) -> Assembly {
        Assembly {
            buf: Vec::new(),
            total,
            end_stream,
            owed,
            budget,
            charged: 0,
        }
    }

    /// Bytes arrived so far.
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// Appends a chunk (the caller checked it stays within `total`), growing the buffer to at
    /// most twice what has arrived and charging the growth to the budget.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        let need = self.buf.len() + chunk.len();
        if need > self.buf.capacity() {
            let target = need.saturating_mul(2).min(self.total).max(need);
            self.buf.reserve_exact(target - self.buf.len());
            let cap = self.buf.capacity();
            self.budget.charge(cap - self.charged);
            self.charged = cap;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// Whether every byte of the message arrived.
    pub(crate) fn is_complete(&self) -> bool {
        self.buf.len() == self.total
    }

    /// The whole message (its charge is given back when `self` drops).
    pub(crate) fn take(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.buf))
    }
}

impl Drop for Assembly {
    fn drop(&mut self) {
        self.budget.release(self.charged);
    }
}

#[derive(Debug)]
pub(crate) struct CallState {
    /// Our credit for sending on this call (may be negative: overdraft).
    pub(crate) send_credit: i64,
    /// The peer's credit as we count it.
    pub(crate) recv_window: i64,
    /// Credit the application gave back that is not yet sent.
    pub(crate) grant_pending: u64,
    /// Boxed: only messages larger than a frame (16 MiB by default) need these, and keeping
    /// them out of line halves the state moved on every call's insert and removal.
    pub(crate) pending: Option<Box<PendingSend>>,
    pub(crate) assembling: Option<Box<Assembly>>,
    /// Client: half-closed. Server: unused (END removes the call).
    pub(crate) send_closed: bool,
    /// Server: the client half-closed.
    pub(crate) recv_closed: bool,
    /// Response headers sent (server) or received (client), or a response message went by.
    pub(crate) headers_done: bool,
    pub(crate) writable_wanted: bool,
    /// A half-close or END waits for a split message to finish going out (it needs no credit,
    /// so Writable follows as soon as the message is out, whatever the credit).
    pub(crate) close_wanted: bool,
    pub(crate) deadline: Option<Instant>,
}

impl CallState {
    pub(crate) fn new(send_credit: u32, recv_window: u32, deadline: Option<Instant>) -> CallState {
        CallState {
            send_credit: i64::from(send_credit),
            recv_window: i64::from(recv_window),
            grant_pending: 0,
            pending: None,
            assembling: None,
            send_closed: false,
            recv_closed: false,
            headers_done: false,
            writable_wanted: false,
            close_wanted: false,
            deadline,
        }
    }
}

/// The error for state the engine checked a moment before and then did not find (a bug, never
/// the peer's doing): the connection closes with `INTERNAL_ERROR` rather than panicking.
#[cold]
pub(crate) fn state_lost(id: u32) -> ProtocolError {
    ProtocolError::new(ErrorCode::INTERNAL_ERROR, format!("call {id} state lost"))
}

/// The open calls by id, and their deadlines.
///
/// Ended calls leave stale entries in the deadline heap (removing from the middle of a heap is
/// costly); the store compacts the heap before the stale entries outnumber the live ones, so a
/// peer that opens and cancels calls forever cannot grow it.
#[derive(Debug, Default)]
pub(crate) struct Calls {
    map: FxHashMap<u32, CallState>,
    deadlines: BinaryHeap<Reverse<(Instant, u32)>>,
    /// Open calls that have a deadline.
    with_deadline: usize,
}

impl Calls {
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    #[inline]
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.map.contains_key(&id)
    }

    #[inline]
    pub(crate) fn get(&self, id: u32) -> Option<&CallState> {
        self.map.get(&id)
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, id: u32) -> Option<&mut CallState> {
        self.map.get_mut(&id)
    }

    /// A call the caller knows is open (it checked): its state, or an internal error should
    /// the store disagree.
    #[inline]
    pub(crate) fn open(&mut self, id: u32) -> Result<&mut CallState, ProtocolError> {
        self.map.get_mut(&id).ok_or_else(|| state_lost(id))
    }

    /// Opens a call's state, remembering its deadline.
    pub(crate) fn insert(&mut self, id: u32, state: CallState) {
        if let Some(t) = state.deadline {
            if self.deadlines.len() >= 2 * self.with_deadline + 64 {
                let map = &self.map;
                self.deadlines
                    .retain(|Reverse((t, id))| map.get(id).is_some_and(|c| c.deadline == Some(*t)));
            }
            self.deadlines.push(Reverse((t, id)));
            self.with_deadline += 1;
        }
        self.map.insert(id, state);
    }

    /// Forgets a call's state.
    pub(crate) fn remove(&mut self, id: u32) -> Option<CallState> {
        let state = self.map.remove(&id)?;
        if state.deadline.is_some() {
            self.with_deadline -= 1;
            if self.with_deadline == 0 {
                self.deadlines.clear();
            }
        }
        Some(state)
    }

    /// Forgets every call; returns their ids in order.
    pub(crate) fn take_all(&mut self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.map.drain().map(|(id, _)| id).collect();
        ids.sort_unstable();
        self.deadlines.clear();
        self.with_deadline = 0;
        ids
    }

    /// The ids of the open calls above `last`, in order.
    pub(crate) fn ids_above(&self, last: u32) -> Vec<u32> {
        let mut ids: Vec<u32> = self.map.keys().copied().filter(|&id| id > last).collect();
        ids.sort_unstable();
        ids
    }

    /// The earliest deadline (possibly of a call that ended since).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.peek().map(|Reverse((t, _))| *t)
    }

    /// Removes and returns an open call whose deadline is at or before `now`, if any.
    pub(crate) fn pop_expired(&mut self, now: Instant) -> Option<u32> {
        while let Some(&Reverse((t, id))) = self.deadlines.peek() {
            if t > now {
                return None;
            }
            self.deadlines.pop();
            if self.map.get(&id).is_some_and(|c| c.deadline == Some(t)) {
                self.remove(id);
                return Some(id);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn deadlines_expire_in_order_and_ended_calls_are_skipped() {
        let now = Instant::now();
        let mut calls = Calls::default();
        for (id, ms) in [(1, 30), (2, 10), (3, 20)] {
            let t = now + Duration::from_millis(ms);
            calls.insert(id, CallState::new(100, 100, Some(t)));
        }
        calls.remove(2);
        assert_eq!(calls.next_deadline(), Some(now + Duration::from_millis(10)));
        let later = now + Duration::from_millis(25);
        assert_eq!(calls.pop_expired(later), Some(3));
        assert_eq!(calls.pop_expired(later), None);
        assert_eq!(calls.len(), 1);
        assert!(calls.contains(1));
    }

    #[test]
    fn the_heap_stays_bounded_when_calls_come_and_go() {
        let t = Instant::now() + Duration::from_secs(60);
        let mut calls = Calls::default();
        calls.insert(0, CallState::new(1, 1, Some(t))); // one long-lived call
        for id in 1..100_000 {
            calls.insert(id, CallState::new(1, 1, Some(t)));
            calls.remove(id);
        }
        assert!(calls.deadlines.len() <= 2 * calls.with_deadline + 65);
        assert_eq!(calls.take_all(), vec![0]);
        assert!(calls.is_empty() && calls.next_deadline().is_none());
    }
}
