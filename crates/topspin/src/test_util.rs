//! Helpers for the crate's unit tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

/// A waker that counts its wakes.
#[derive(Debug, Default)]
pub(crate) struct CountingWaker(AtomicUsize);

impl CountingWaker {
    /// A fresh counter and a waker that adds to it.
    pub(crate) fn new() -> (Arc<CountingWaker>, Waker) {
        let c = Arc::new(CountingWaker::default());
        (c.clone(), Waker::from(c))
    }

    /// Wakes so far.
    pub(crate) fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
