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

/// A server connection's context with the default `Config` (a `Stream` peer, the native face).
pub(crate) fn conn_context() -> Arc<crate::request::ConnContext> {
    let config = crate::Config::default();
    Arc::new(crate::request::ConnContext {
        peer: crate::transport::PeerAddr::Stream,
        #[cfg(feature = "tls")]
        tls: None,
        compression: None,
        max_message_size: config.max_message_size(),
        budget: config.memory_budget(),
        protocol: crate::request::Protocol::Topspin,
    })
}
