//! Gauges of what a server's (or a channel's) connections hold right now, for tests, metrics
//! and operators: connections, open calls, bytes waiting to be sent, bytes reserved for
//! messages being received.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use topspin_proto::{MemoryBudget, DEFAULT_MEMORY_BUDGET};

/// The process-wide budget of bytes reserved for messages being received, shared by every
/// server and channel that has no budget of its own (`Config::with_memory_budget`). Its limit
/// is [`DEFAULT_MEMORY_BUDGET`] (1 GiB).
pub fn process_memory_budget() -> Arc<MemoryBudget> {
    static BUDGET: OnceLock<Arc<MemoryBudget>> = OnceLock::new();
    BUDGET
        .get_or_init(|| MemoryBudget::new(DEFAULT_MEMORY_BUDGET))
        .clone()
}

#[derive(Debug, Default)]
pub(crate) struct Counts {
    connections: AtomicUsize,
    open_calls: AtomicUsize,
    unsent_bytes: AtomicUsize,
}

/// Live gauges of one [`Server`](crate::Server): cheap to clone, read with
/// [`Gauges::snapshot`].
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let server = topspin::Server::builder().bind("tcp://127.0.0.1:0").await?;
/// let gauges = server.gauges();
/// tokio::spawn(server.serve());
/// let now = gauges.snapshot();
/// println!("{} connections, {} calls open", now.connections, now.open_calls);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Gauges {
    pub(crate) counts: Arc<Counts>,
    pub(crate) budget: Arc<MemoryBudget>,
}

/// What [`Gauges`] read at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GaugeSnapshot {
    /// Connections open (handshaking, serving or draining).
    pub connections: usize,
    /// Calls open on them.
    pub open_calls: usize,
    /// Bytes produced for the peers and not yet taken by their transports.
    pub unsent_bytes: usize,
    /// Bytes reserved for messages being received, in the memory budget these connections
    /// charge (shared with whoever else charges it: by default the whole process).
    pub reserved_bytes: usize,
    /// That budget's limit.
    pub memory_budget: usize,
}

impl Gauges {
    pub(crate) fn new(budget: Arc<MemoryBudget>) -> Gauges {
        Gauges {
            counts: Arc::default(),
            budget,
        }
    }

    /// The gauges now.
    pub fn snapshot(&self) -> GaugeSnapshot {
        GaugeSnapshot {
            connections: self.counts.connections.load(Ordering::Relaxed),
            open_calls: self.counts.open_calls.load(Ordering::Relaxed),
            unsent_bytes: self.counts.unsent_bytes.load(Ordering::Relaxed),
            reserved_bytes: self.budget.used(),
            memory_budget: self.budget.limit(),
        }
    }
}

/// One connection's share of its [`Gauges`]: it reports only changes, when its task is about to
/// wait, so a busy connection touches the shared counters once per wake-up, not per call.
#[derive(Debug)]
pub(crate) struct Share {
    counts: Option<Arc<Counts>>,
    open_calls: usize,
    unsent_bytes: usize,
}

impl Share {
    pub(crate) fn new(gauges: Option<&Gauges>) -> Share {
        let counts = gauges.map(|g| g.counts.clone());
        if let Some(c) = &counts {
            c.connections.fetch_add(1, Ordering::Relaxed);
        }
        Share {
            counts,
            open_calls: 0,
            unsent_bytes: 0,
        }
    }

    /// Reports the connection's current figures.
    #[inline]
    pub(crate) fn report(&mut self, open_calls: usize, unsent_bytes: usize) {
        let Some(c) = &self.counts else { return };
        if open_calls != self.open_calls {
            move_by(&c.open_calls, self.open_calls, open_calls);
            self.open_calls = open_calls;
        }
        if unsent_bytes != self.unsent_bytes {
            move_by(&c.unsent_bytes, self.unsent_bytes, unsent_bytes);
            self.unsent_bytes = unsent_bytes;
        }
    }
}

fn move_by(counter: &AtomicUsize, from: usize, to: usize) {
    if to > from {
        counter.fetch_add(to - from, Ordering::Relaxed);
    } else {
        counter.fetch_sub(from - to, Ordering::Relaxed);
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.report(0, 0);
        if let Some(c) = &self.counts {
            c.connections.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
