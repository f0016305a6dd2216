//! A bounded, adaptive spin before a connection's task sleeps.
//!
//! On a VM, waking a thread whose CPU went idle costs tens of µs (~40 µs here): a ping-pong
//! whose two sides sit on different CPUs pays it on every message. So for a short window after
//! a connection made progress (it sent a call, or answered one), its task does not sleep:
//! it yields (`tokio::task::yield_now`), which makes the runtime poll its I/O driver without
//! blocking (`epoll_wait` with a zero timeout) and then poll the task again. The CPU stays
//! busy, and the reply — or the next request — is picked up without a wake-up.
//!
//! Bounds: at most [`WINDOW`] per burst of progress; after a window that ended with nothing
//! arriving, the next 2, 4, … 256 windows are skipped (a connection whose peer answers slowly,
//! or calls rarely, spins rarely). Off when the process may use only one CPU (pinned: the
//! peer cannot run while this thread spins) and under `TOPSPIN_SPIN=0`. While it spins, other
//! tasks of the runtime run first (a yield goes to the back of the queue).
//!
//! Measured on a quiet 2-CPU VM, unpinned (`scripts/run.sh`): echo 20 B 57.5 → 10.0 µs median,
//! CPU per call 47.3 → 31.0 µs (client + server); blob 1 MiB: wall time unchanged, CPU per call
//! 328 → 441 µs (the price of spinning while large messages stream). On a heavily loaded machine
//! (load 5–13) it did worse, hence the back-off.

use std::sync::OnceLock;
use std::task::Context;
use std::time::{Duration, Instant};

/// How long a connection spins after it last made progress.
pub(crate) const WINDOW: Duration = Duration::from_micros(50);
/// Most windows skipped after misses.
const MAX_SKIP: u32 = 256;

/// Whether this process may run on more than one CPU (its affinity mask, as `taskset` sets
/// it): only then can a peer on the same host run while this thread spins or writes early.
pub(crate) fn several_cpus() -> bool {
    static SEVERAL: OnceLock<bool> = OnceLock::new();
    *SEVERAL.get_or_init(|| std::thread::available_parallelism().is_ok_and(|n| n.get() > 1))
}

/// Whether spinning can help at all in this process (more than one CPU to run on).
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("TOPSPIN_SPIN").map_or(true, |v| v != "0") && several_cpus())
}

/// One connection's spin state.
#[derive(Debug, Default)]
pub(crate) struct Spin {
    /// End of the current window.
    until: Option<Instant>,
    /// Windows in a row that ended with nothing arriving.
    misses: u32,
    /// Windows still to skip.
    skip: u32,
}

impl Spin {
    /// The task is about to wait (nothing is ready; every waker is registered). `progressed`:
    /// this poll made progress. `true` when the task should rather yield (it has arranged to be
    /// polled again right after the runtime's next look at its I/O).
    pub(crate) fn before_wait(&mut self, progressed: bool, cx: &mut Context<'_>) -> bool {
        if !enabled() {
            return false;
        }
        // The clock is read only when a window opens or is checked.
        if progressed {
            if self.until.is_some() {
                self.misses = 0; // something arrived while spinning
            }
            if self.skip > 0 {
                self.skip -= 1;
                self.until = None;
                return false;
            }
            self.until = Some(Instant::now() + WINDOW);
        } else {
            match self.until {
                Some(u) if Instant::now() < u => {}
                Some(_) => {
                    self.until = None;
                    self.misses = (self.misses + 1).min(8);
                    self.skip = (1u32 << self.misses).min(MAX_SKIP);
                    return false;
                }
                None => return false,
            }
        }
        // Polled once: registers the task to be woken after the runtime polls its I/O driver.
        let y = std::pin::pin!(tokio::task::yield_now());
        let _ = std::future::Future::poll(y, cx);
        true
    }
}
