//! A shared budget of bytes held for data a peer has announced but not yet completed.
//!
//! A frame header or a split message's `total_len` is a claim, not a fact: a receiver that
//! reserved what every peer announced could be made to reserve far more memory than it has
//! (protocol.md §5.3, §9). The engine grows a split message's buffer as its chunks arrive and
//! charges it to a [`MemoryBudget`] shared by every connection of a process (or of one server or
//! channel) until the message completes, its call ends or the connection is dropped. While the
//! budget is spent, a server refuses new calls with `RESOURCE_EXHAUSTED` and both sides
//! withhold credit for split-message chunks (one message per connection still goes on).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Default limit of a [`MemoryBudget`]: 1 GiB.
pub const DEFAULT_MEMORY_BUDGET: usize = 1 << 30;

/// A thread-safe count of reserved bytes with a limit, shared by the connections that charge it.
///
/// ```
/// use topspin_proto::MemoryBudget;
/// let budget = MemoryBudget::new(100);
/// assert!(budget.try_reserve(60));
/// assert!(!budget.try_reserve(60)); // would pass the limit: nothing is taken
/// budget.release(60);
/// assert_eq!(budget.used(), 0);
/// ```
#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    used: AtomicUsize,
    /// A share's whole: every byte taken from the share is taken from it too.
    parent: Option<Arc<MemoryBudget>>,
}

impl MemoryBudget {
    /// A budget of `limit` bytes, to share with [`Arc::clone`].
    pub fn new(limit: usize) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            limit,
            used: AtomicUsize::new(0),
            parent: None,
        })
    }

    /// A share of `parent` of at most `limit` bytes: what it takes is taken from `parent`
    /// too, and it is spent when either is. One connection's share of the process budget, so
    /// that a single peer cannot spend all of it.
    ///
    /// ```
    /// use topspin_proto::MemoryBudget;
    /// let process = MemoryBudget::new(100);
    /// let conn = MemoryBudget::share_of(&process, 30);
    /// assert!(conn.try_reserve(30));
    /// assert!(!conn.try_reserve(1)); // its share is spent
    /// assert_eq!(process.used(), 30); // the process has 70 left for the others
    /// conn.release(30);
    /// assert_eq!(process.used(), 0);
    /// ```
    pub fn share_of(parent: &Arc<MemoryBudget>, limit: usize) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            limit,
            used: AtomicUsize::new(0),
            parent: Some(parent.clone()),
        })
    }

    /// A budget that never refuses (it still counts).
    pub fn unlimited() -> Arc<MemoryBudget> {
        MemoryBudget::new(usize::MAX)
    }

    /// Takes `n` bytes from the budget if that keeps it within its limit; `false` (and nothing
    /// taken) otherwise.
    pub fn try_reserve(&self, n: usize) -> bool {
        let local = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            })
            .is_ok();
        match &self.parent {
            Some(p) if local && !p.try_reserve(n) => {
                self.release_local(n);
                false
            }
            _ => local,
        }
    }

    /// Takes `n` bytes even past the limit: for bytes that already arrived within the peer's
    /// credit and must be held (the budget then stays spent until they are given back).
    pub fn charge(&self, n: usize) {
        if n == 0 {
            return; // no write to a counter other threads share
        }
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_add(n))
            });
        if let Some(p) = &self.parent {
            p.charge(n);
        }
    }

    /// Whether nothing is left: `used() >= limit()` (or, for a share, its whole is spent).
    pub fn is_spent(&self) -> bool {
        self.used() >= self.limit || self.parent.as_ref().is_some_and(|p| p.is_spent())
    }

    /// The budget this is a share of, if it is one.
    pub fn whole(&self) -> Option<&Arc<MemoryBudget>> {
        self.parent.as_ref()
    }

    /// A share hands `n` of its bytes to its whole: they leave the share's count but stay
    /// charged to the whole (a message that completed and went on to its handler is no longer
    /// the connection's incomplete data). On a budget that is no share, does nothing.
    pub fn hand_to_whole(&self, n: usize) {
        if self.parent.is_some() {
            self.release_local(n);
        }
    }

    /// Gives back `n` bytes taken earlier with [`MemoryBudget::try_reserve`].
    pub fn release(&self, n: usize) {
        if n == 0 {
            return; // no write to a counter other threads share
        }
        self.release_local(n);
        if let Some(p) = &self.parent {
            p.release(n);
        }
    }

    fn release_local(&self, n: usize) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(n))
            });
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// The limit this budget was made with.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Whether the budget is spent down to less than `n` bytes of room.
    pub fn is_short_of(&self, n: usize) -> bool {
        self.used().saturating_add(n) > self.limit
            || self.parent.as_ref().is_some_and(|p| p.is_short_of(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stay_within_the_limit() {
        let b = MemoryBudget::new(10);
        assert!(b.try_reserve(10));
        assert!(!b.try_reserve(1));
        assert!(b.is_short_of(1));
        b.release(4);
        assert!(b.try_reserve(4));
        assert!(!b.try_reserve(usize::MAX)); // no overflow
        b.release(100); // never below zero
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn unlimited_counts_but_never_refuses() {
        let b = MemoryBudget::unlimited();
        assert!(b.try_reserve(usize::MAX / 2));
        assert_eq!(b.used(), usize::MAX / 2);
    }
}
