//! The far deadlines of connections — handshake, keep-alive, a frame or a write that stalls,
//! idleness: seconds to an hour away, and almost never reached — kept on one thread of the
//! process instead of in the runtime's timer wheel. A tokio runtime with any timer in its
//! wheel pays for it at every park (finding the next expiration, reading the clock): about
//! 400 instructions per call of an echo, measured with callgrind, for deadlines that are
//! moved on and on and seldom ring. Call deadlines (the engine's) and the roles' timers stay
//! on tokio's wheel: they are near and precise.
//!
//! An [`Alarm`] belongs to one connection. Setting it again does not take back an earlier
//! setting: that one may still ring first, which only makes the connection look at its
//! timers early (as its tokio timer firing early would). Dropping the alarm lets its waker
//! go, so a connection that ended pins nothing but a small entry until its time comes.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::task::Waker;
use std::time::Instant;

/// What the alarm thread and a connection share.
#[derive(Debug, Default)]
struct Bell {
    rang: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

/// One connection's alarm.
#[derive(Debug, Default)]
pub(crate) struct Alarm {
    bell: Arc<Bell>,
}

impl Alarm {
    /// Rings at `at`: marks the alarm rung and wakes `waker`.
    pub(crate) fn set(&self, at: Instant, waker: &Waker) {
        {
            let mut w = self
                .bell
                .waker
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !w.as_ref().is_some_and(|w| w.will_wake(waker)) {
                *w = Some(waker.clone());
            }
        }
        self.bell.rang.store(false, AtomicOrdering::Release);
        thread().push(at, self.bell.clone());
    }

    /// Whether it rang since it was last asked (a load, and a store only when it did).
    pub(crate) fn rang(&self) -> bool {
        self.bell.rang.load(AtomicOrdering::Acquire)
            && self.bell.rang.swap(false, AtomicOrdering::AcqRel)
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        // The entries left in the heap keep the bell, not the task.
        self.bell
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// A setting waiting in the heap: earliest first.
struct Entry {
    at: Instant,
    bell: Arc<Bell>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Entry) -> bool {
        self.at == other.at
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Entry) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Entry) -> Ordering {
        other.at.cmp(&self.at) // a max-heap of the reverse: the earliest on top
    }
}

/// The alarm thread's heap and the condition it sleeps on. Bounded by time, not by what a peer
/// sends: a connection adds an entry only when its next far deadline comes earlier than the one
/// set, or after its alarm rang; a setting taken over stays until its own time (at most the
/// longest far timeout, the idle hour). A peer that keeps half-sending frames makes its
/// connection add one about every `frame_timeout` (30 s): ~120 entries of 24 bytes per
/// connection at worst, popped as they come due; `max_connections` bounds the connections.
struct Thread {
    heap: Mutex<BinaryHeap<Entry>>,
    moved: Condvar,
}

/// The process's alarm thread, started on first use.
fn thread() -> &'static Thread {
    static THREAD: OnceLock<&'static Thread> = OnceLock::new();
    THREAD.get_or_init(|| {
        let t: &'static Thread = Box::leak(Box::new(Thread {
            heap: Mutex::new(BinaryHeap::new()),
            moved: Condvar::new(),
        }));
        // If the thread cannot start, nothing rings: connections then keep only their
        // tokio timers, and the far deadlines are looked at when something else wakes them.
        let _ = std::thread::Builder::new()
            .name("topspin-alarms".into())
            .spawn(move || t.run());
        t
    })
}

impl Thread {
    fn push(&self, at: Instant, bell: Arc<Bell>) {
        let mut heap = self.heap.lock().unwrap_or_else(PoisonError::into_inner);
        let earlier = heap.peek().is_none_or(|top| at < top.at);
        heap.push(Entry { at, bell });
        drop(heap);
        if earlier {
            self.moved.notify_one();
        }
    }

    fn run(&self) {
        let mut heap = self.heap.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            while heap.peek().is_some_and(|top| top.at <= now) {
                if let Some(e) = heap.pop() {
                    due.push(e.bell);
                }
            }
            if !due.is_empty() {
                drop(heap);
                for bell in due {
                    bell.rang.store(true, AtomicOrdering::Release);
                    let waker = bell
                        .waker
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clone();
                    if let Some(w) = waker {
                        w.wake();
                    }
                }
                heap = self.heap.lock().unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            heap = match heap.peek().map(|top| top.at - now) {
                Some(wait) => {
                    self.moved
                        .wait_timeout(heap, wait)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self
                    .moved
                    .wait(heap)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rings_at_its_time_and_wakes_once() {
        struct Count(std::sync::atomic::AtomicUsize);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, AtomicOrdering::SeqCst);
            }
        }
        let count = Arc::new(Count(Default::default()));
        let waker = Waker::from(count.clone());
        let a = Alarm::default();
        let b = Alarm::default();
        let t0 = Instant::now();
        a.set(t0 + Duration::from_millis(300), &waker);
        b.set(t0 + Duration::from_millis(50), &waker);
        assert!(!a.rang() && !b.rang());
        while !b.rang() {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the earlier alarm never rang"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(t0.elapsed() >= Duration::from_millis(50));
        assert!(!b.rang(), "asked once, forgotten");
        while !a.rang() {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the later alarm never rang"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert_eq!(count.0.load(AtomicOrdering::SeqCst), 2);
        // A dropped alarm wakes no one.
        let c = Alarm::default();
        c.set(Instant::now() + Duration::from_millis(20), &waker);
        drop(c);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(count.0.load(AtomicOrdering::SeqCst), 2);
    }
}
