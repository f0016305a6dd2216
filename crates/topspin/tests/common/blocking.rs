//! Two handlers that tell by order, not by timing, whether a handler that blocks its thread
//! holds up its connection: the first `block` call blocks briefly (the server learns the
//! method blocks), the second stays blocked until a `quick` call has run on the same
//! connection — or 10 s, if the connection is held up and the quick call cannot run.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub struct Handlers {
    starts: AtomicUsize,
    blocked: AtomicBool,
    quick_ran: AtomicBool,
}

impl Handlers {
    pub const fn new() -> Handlers {
        Handlers {
            starts: AtomicUsize::new(0),
            blocked: AtomicBool::new(false),
            quick_ran: AtomicBool::new(false),
        }
    }

    /// The blocking handler's body (it blocks its thread: no `.await`). The first call blocks
    /// 200 ms, long past the inline first poll's limit; later ones until `quick` ran (10 s at
    /// most). What it answers says which.
    pub fn block(&self) -> &'static str {
        if self.starts.fetch_add(1, Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(200));
            return "learnt";
        }
        self.blocked.store(true, Ordering::SeqCst);
        let until = Instant::now() + Duration::from_secs(10);
        while !self.quick_ran.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        let saw = self.quick_ran.load(Ordering::SeqCst);
        self.blocked.store(false, Ordering::SeqCst);
        if saw {
            "saw the quick call"
        } else {
            "blocked 10 s: the quick call never ran"
        }
    }

    /// The quick handler's body: `during` while a blocking handler is blocked.
    pub fn quick(&self) -> &'static str {
        let during = self.blocked.load(Ordering::SeqCst);
        self.quick_ran.store(true, Ordering::SeqCst);
        if during {
            "during"
        } else {
            "after"
        }
    }

    /// Waits until the second blocking handler has started (10 s at most), blocking the
    /// calling thread: the test's own `block_on` thread of a multi-thread runtime, never one
    /// of its workers.
    ///
    /// Not a `tokio::time::sleep` loop: while the blocking handler holds one of the two
    /// workers, the other may be parked on its condition variable rather than on the I/O and
    /// time driver, and then no timer of the runtime fires until the handler returns (seen:
    /// 4 runs in 30 timed out after 10 s that way). Blocking this thread needs no timer; the
    /// quick call that follows wakes a worker by scheduling the client's tasks.
    pub fn wait_for_second(&self) {
        assert!(
            tokio::runtime::Handle::current().runtime_flavor()
                == tokio::runtime::RuntimeFlavor::MultiThread,
            "wait_for_second blocks its thread: a multi-thread runtime's test only"
        );
        let t0 = Instant::now();
        while !self.blocked.load(Ordering::SeqCst) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the second blocking call never started"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
