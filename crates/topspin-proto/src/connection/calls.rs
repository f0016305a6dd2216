//! The calls a connection has open: per-call state, and the store that keeps it with the
//! deadline heap (protocol.md §6–§8).

use crate::budget::MemoryBudget;
use crate::error::{ErrorCode, ProtocolError};
use bytes::Bytes;
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
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
    /// The connection's share of the memory budget (charging it charges the budget).
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
    /// The call has an entry in the deadline heap (ids are never reused, so the entry under
    /// its id is its own).
    pub(crate) has_deadline: bool,
}

impl CallState {
    pub(crate) fn new(send_credit: u32, recv_window: u32) -> CallState {
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
            has_deadline: false,
        }
    }
}

/// The error for state the engine checked a moment before and then did not find (a bug, never
/// the peer's doing): the connection closes with `INTERNAL_ERROR` rather than panicking.
#[cold]
pub(crate) fn state_lost(id: u32) -> ProtocolError {
    ProtocolError::new(ErrorCode::INTERNAL_ERROR, format!("call {id} state lost"))
}

/// How many consecutive ids the store's ring spans (its slots are at most this many: a bound
/// no peer can raise; a call the window moves past goes to the map).
const WINDOW: u32 = 1024;

/// The most empty slots one call may add to the ring (ids a peer skipped); a call further
/// ahead goes to the map.
const MAX_GAP: usize = 16;

/// The open calls by id, and their deadlines.
///
/// Ids only grow and a client numbers its calls one by one, so the calls open at once are
/// nearly always a short run of recent ids: those within [`WINDOW`] ids of the oldest one the
/// ring holds live in a ring indexed by `id - base` (a look-up is an index, no hash); a call
/// the window moves past (it outlives `WINDOW` newer ids: a long stream, or a peer that skips
/// ids) moves to a hash map, and so does an id below the window.
///
/// Ended calls leave stale entries in the deadline heap (removing from the middle of a heap is
/// costly); the store compacts the heap before the stale entries outnumber the live ones, so a
/// peer that opens and cancels calls forever cannot grow it.
#[derive(Debug, Default)]
pub(crate) struct Calls {
    /// Slot `i` is call `base + i` (`None`: ended, or never opened); the first slot is always
    /// an open call, and there are at most [`WINDOW`] slots.
    ring: VecDeque<Option<CallState>>,
    base: u32,
    /// Open calls outside the ring.
    far: FxHashMap<u32, CallState>,
    /// Open calls (ring and map).
    len: usize,
    deadlines: BinaryHeap<Reverse<(Instant, u32)>>,
    /// Open calls that have a deadline.
    with_deadline: usize,
    /// Bytes of split messages accepted for sending and still waiting for credit (the rest of
    /// each call's `pending`): output a peer that never grants credit makes this side hold.
    pub(crate) pending_bytes: usize,
}

impl Calls {
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.get(id).is_some()
    }

    #[inline]
    pub(crate) fn get(&self, id: u32) -> Option<&CallState> {
        let at = id.wrapping_sub(self.base) as usize;
        if let Some(Some(state)) = self.ring.get(at) {
            return Some(state);
        }
        if self.far.is_empty() {
            return None;
        }
        self.far.get(&id)
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, id: u32) -> Option<&mut CallState> {
        let at = id.wrapping_sub(self.base) as usize;
        if let Some(Some(state)) = self.ring.get_mut(at) {
            return Some(state);
        }
        if self.far.is_empty() {
            return None;
        }
        self.far.get_mut(&id)
    }

    /// A call the caller knows is open (it checked): its state, or an internal error should
    /// the store disagree.
    #[inline]
    pub(crate) fn open(&mut self, id: u32) -> Result<&mut CallState, ProtocolError> {
        self.get_mut(id).ok_or_else(|| state_lost(id))
    }

    /// Opens a call's state, remembering its deadline. Ids are never reused: a connection's
    /// ids only grow.
    pub(crate) fn insert(&mut self, id: u32, mut state: CallState, deadline: Option<Instant>) {
        if let Some(t) = deadline {
            state.has_deadline = true;
            self.push_deadline(id, t);
        }
        let replaced = self.put(id, state);
        if !replaced {
            self.len += 1;
        }
    }

    fn push_deadline(&mut self, id: u32, t: Instant) {
        if self.deadlines.len() >= 2 * self.with_deadline + 64 {
            let mut heap = std::mem::take(&mut self.deadlines);
            heap.retain(|Reverse((_, id))| self.get(*id).is_some_and(|c| c.has_deadline));
            self.deadlines = heap;
        }
        self.deadlines.push(Reverse((t, id)));
        self.with_deadline += 1;
    }

    /// Stores a call's state in the ring or the map; whether it replaced one.
    #[inline]
    fn put(&mut self, id: u32, state: CallState) -> bool {
        if self.ring.is_empty() {
            self.base = id;
        }
        // (Ids only grow, so neither happens in a connection; the store is right regardless.)
        if id < self.base || (!self.far.is_empty() && self.far.contains_key(&id)) {
            return self.far.insert(id, state).is_some();
        }
        while id - self.base >= WINDOW {
            self.evict_first();
            if self.ring.is_empty() {
                self.base = id;
            }
        }
        let at = (id - self.base) as usize;
        if at < self.ring.len() {
            return self.ring[at].replace(state).is_some();
        }
        if at - self.ring.len() > MAX_GAP {
            // A peer that skips ids does not make each CALL fill many empty slots.
            return self.far.insert(id, state).is_some();
        }
        while self.ring.len() < at {
            self.ring.push_back(None);
        }
        self.ring.push_back(Some(state));
        false
    }

    /// Moves the ring's first call to the map: the window moves past it.
    #[cold]
    fn evict_first(&mut self) {
        if let Some(Some(state)) = self.ring.pop_front() {
            self.far.insert(self.base, state);
        }
        self.base = self.base.wrapping_add(1);
        self.trim();
        // A long-lived call held the ring open across the whole window; what is left is
        // usually a few recent calls. Give the rest back (a connection keeping a stream open
        // for ever would otherwise hold WINDOW slots, ~48 KiB, for ever).
        if self.ring.capacity() >= 256 && self.ring.len() * 4 < self.ring.capacity() {
            self.ring.shrink_to(self.ring.len() * 2);
        }
    }

    /// Drops the ring's leading empty slots, so its first slot is an open call.
    #[inline]
    fn trim(&mut self) {
        while let Some(None) = self.ring.front() {
            self.ring.pop_front();
            self.base = self.base.wrapping_add(1);
        }
    }

    /// Forgets a call's state; whether it was open.
    pub(crate) fn remove(&mut self, id: u32) -> bool {
        let at = id.wrapping_sub(self.base) as usize;
        let had_deadline = match self.ring.get_mut(at) {
            Some(slot @ Some(_)) => {
                let had = slot.as_ref().is_some_and(|c| c.has_deadline);
                let left = slot
                    .as_ref()
                    .and_then(|c| c.pending.as_ref())
                    .map_or(0, |p| p.left);
                self.pending_bytes = self.pending_bytes.saturating_sub(left);
                *slot = None;
                if at == 0 {
                    self.trim();
                }
                had
            }
            _ if self.far.is_empty() => return false,
            _ => match self.far.remove(&id) {
                Some(state) => {
                    let left = state.pending.as_ref().map_or(0, |p| p.left);
                    self.pending_bytes = self.pending_bytes.saturating_sub(left);
                    state.has_deadline
                }
                None => return false,
            },
        };
        self.len -= 1;
        if had_deadline {
            self.with_deadline -= 1;
            if self.with_deadline == 0 {
                self.deadlines.clear();
            }
        }
        true
    }

    /// The ids of the open calls, in no order.
    fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        let ring = (self.ring.iter().enumerate())
            .filter(|(_, s)| s.is_some())
            .map(|(i, _)| self.base.wrapping_add(i as u32));
        ring.chain(self.far.keys().copied())
    }

    /// Forgets every call; returns their ids in order.
    pub(crate) fn take_all(&mut self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.ids().collect();
        ids.sort_unstable();
        self.ring.clear();
        self.far.clear();
        self.len = 0;
        self.deadlines.clear();
        self.with_deadline = 0;
        ids
    }

    /// Whether any open call is receiving a split message (a walk over the calls: for a
    /// timer that rings rarely).
    pub(crate) fn any_assembling(&self) -> bool {
        let ring = self.ring.iter().flatten();
        ring.chain(self.far.values())
            .any(|c| c.assembling.is_some())
    }

    /// The ids of the open calls above `last`, in order.
    pub(crate) fn ids_above(&self, last: u32) -> Vec<u32> {
        let mut ids: Vec<u32> = self.ids().filter(|&id| id > last).collect();
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
            if self.get(id).is_some_and(|c| c.has_deadline) {
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
            calls.insert(id, CallState::new(100, 100), Some(t));
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
        calls.insert(0, CallState::new(1, 1), Some(t)); // one long-lived call
        for id in 1..100_000 {
            calls.insert(id, CallState::new(1, 1), Some(t));
            calls.remove(id);
        }
        assert!(calls.deadlines.len() <= 2 * calls.with_deadline + 65);
        // The long-lived call moved out of the window; the ring gave its slots back.
        assert!(calls.ring.capacity() < 256, "{}", calls.ring.capacity());
        assert_eq!(calls.take_all(), vec![0]);
        assert!(calls.is_empty() && calls.next_deadline().is_none());
    }

    /// The store against a map, over calls that come and go in any order with ids that grow by
    /// gaps small and large (beyond the window too), some long-lived (moved to the map).
    #[derive(Clone, Debug)]
    enum Op {
        Open { gap: u32, deadline: bool },
        End { pick: usize },
        Look { pick: usize },
        Expire,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (prop_oneof![8 => 1u32..3, 1 => 3u32..20, 1 => 20u32..2 * WINDOW, 1 => Just(5 * WINDOW)], any::<bool>())
                .prop_map(|(gap, deadline)| Op::Open { gap, deadline }),
            3 => any::<usize>().prop_map(|pick| Op::End { pick }),
            2 => any::<usize>().prop_map(|pick| Op::Look { pick }),
            1 => Just(Op::Expire),
        ]
    }

    proptest::proptest! {
        #[test]
        fn the_store_agrees_with_a_map(ops in proptest::collection::vec(op(), 1..400)) {
            use std::collections::BTreeMap;
            let now = Instant::now();
            let mut calls = Calls::default();
            let mut model: BTreeMap<u32, Option<Instant>> = BTreeMap::new();
            let mut next = 0u32;
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Open { gap, deadline } => {
                        next += gap;
                        let t = deadline.then(|| now + Duration::from_millis(n as u64));
                        calls.insert(next, CallState::new(n as u32, 0), t);
                        model.insert(next, t);
                    }
                    Op::End { pick } | Op::Look { pick } => {
                        // An open call, or an id that is not (ended, skipped or never used).
                        let id = match model.keys().nth(pick % (model.len() + 1)) {
                            Some(&id) => id,
                            None => (pick as u32) % (next + 2),
                        };
                        if matches!(op, Op::End { .. }) {
                            assert_eq!(calls.remove(id), model.remove(&id).is_some());
                        } else {
                            assert_eq!(calls.get(id).map(|c| c.has_deadline), model.get(&id).map(Option::is_some));
                            assert_eq!(calls.get_mut(id).is_some(), model.contains_key(&id));
                        }
                    }
                    Op::Expire => {
                        let at = now + Duration::from_millis(n as u64 / 2);
                        while let Some(id) = calls.pop_expired(at) {
                            let t = model.remove(&id).flatten();
                            assert!(t.is_some_and(|t| t <= at), "{id} expired early");
                        }
                        assert!(!model.values().any(|t| t.is_some_and(|t| t <= at)));
                    }
                }
                assert_eq!(calls.len(), model.len());
                assert!(calls.ring.len() <= WINDOW as usize);
                assert!(matches!(calls.ring.front(), None | Some(Some(_))));
            }
            let above = next / 2;
            let want: Vec<u32> = model.keys().copied().filter(|&id| id > above).collect();
            assert_eq!(calls.ids_above(above), want);
            assert_eq!(calls.take_all(), model.keys().copied().collect::<Vec<_>>());
            assert!(calls.is_empty() && calls.get(next).is_none());
        }
    }
}
