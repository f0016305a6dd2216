//! A one-shot completion whose memory is reused call after call: the client's unary path
//! allocates nothing per call in steady state (a `tokio::sync::oneshot` allocates each time).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

#[derive(Debug)]
struct State<T> {
    value: Option<T>,
    waker: Option<Waker>,
    /// The completer was dropped without a value.
    abandoned: bool,
}

/// A slot: the state under its lock, and flags either end reads without taking it (the lock
/// is taken only to move the value or the waker).
#[derive(Debug)]
struct Inner<T> {
    st: Mutex<State<T>>,
    /// The outcome is in (`value` or `abandoned`); set under the lock.
    done: AtomicBool,
    /// The waiter is driving the outcome in itself: the completer leaves the waker alone
    /// (the waiter looks again when it is done driving). Cleared under the lock by a waiter
    /// that registers its waker.
    muted: AtomicBool,
    /// The waiter went away.
    closed: AtomicBool,
}

impl<T> Inner<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The outcome is in (the caller holds the lock and put it in `st`): the waker to wake,
    /// unless the waiter drives the outcome in itself.
    fn finish(&self, st: &mut State<T>) -> Option<Waker> {
        self.done.store(true, Ordering::Release);
        if self.muted.load(Ordering::Relaxed) {
            return None;
        }
        st.waker.take()
    }
}

type Slot<T> = Arc<Inner<T>>;

/// Slots waiting for reuse, shared by the clones of a channel.
#[derive(Debug)]
pub(crate) struct Pool<T> {
    free: Mutex<Vec<Slot<T>>>,
}

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Pool {
            free: Mutex::new(Vec::new()),
        }
    }
}

const MAX_POOLED: usize = 4096;

impl<T> Pool<T> {
    /// A fresh pair: the driver completes, the caller waits.
    pub(crate) fn pair(self: &Arc<Self>) -> (Completer<T>, Waiter<T>) {
        let slot = self
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_else(|| {
                Arc::new(Inner {
                    st: Mutex::new(State {
                        value: None,
                        waker: None,
                        abandoned: false,
                    }),
                    done: AtomicBool::new(false),
                    muted: AtomicBool::new(false),
                    closed: AtomicBool::new(false),
                })
            });
        (
            Completer(Some(slot.clone())),
            Waiter {
                slot: Some(slot),
                pool: self.clone(),
            },
        )
    }

    /// Takes back a slot its waiter has just resolved (and reset to its initial state).
    fn recycle(&self, slot: Slot<T>) {
        // Reuse only a slot nobody else holds.
        if Arc::strong_count(&slot) != 1 {
            return;
        }
        // Nobody else holds it: the flags are this end's to reset.
        slot.done.store(false, Ordering::Relaxed);
        slot.muted.store(false, Ordering::Relaxed);
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < MAX_POOLED {
            free.push(slot);
        }
    }
}

/// The driver's end: completes the call once.
#[derive(Debug)]
pub(crate) struct Completer<T>(Option<Slot<T>>);

impl<T> Completer<T> {
    /// Delivers the value; gives it back if the waiter is gone.
    pub(crate) fn send(mut self, value: T) -> Result<(), T> {
        let Some(slot) = self.0.take() else {
            return Err(value);
        };
        let waker = {
            let mut st = slot.lock();
            if slot.closed.load(Ordering::Acquire) {
                return Err(value);
            }
            st.value = Some(value);
            slot.finish(&mut st)
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Whether the waiter went away (the caller dropped the call).
    pub(crate) fn is_closed(&self) -> bool {
        self.0
            .as_ref()
            .is_none_or(|s| s.closed.load(Ordering::Acquire))
    }
}

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            let waker = {
                let mut st = slot.lock();
                st.abandoned = true;
                slot.finish(&mut st)
            };
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}

/// The caller's end: resolves to the value, or `None` if the driver went away without one.
#[derive(Debug)]
pub(crate) struct Waiter<T> {
    slot: Option<Slot<T>>,
    pool: Arc<Pool<T>>,
}

impl<T> Waiter<T> {
    /// Takes the outcome if there is one (and resets the slot for reuse, under the lock the
    /// completer is done with); otherwise registers `waker`, or (`None`) mutes the one
    /// registered, so that a completion this task makes itself wakes nobody — that takes no
    /// lock unless the outcome is in.
    fn check(&mut self, waker: Option<&Waker>) -> Poll<Option<T>> {
        let Some(slot) = self.slot.as_ref() else {
            return Poll::Ready(None);
        };
        if waker.is_none() {
            slot.muted.store(true, Ordering::Relaxed);
            if !slot.done.load(Ordering::Acquire) {
                return Poll::Pending;
            }
        }
        let out = {
            let mut st = slot.lock();
            if let Some(v) = st.value.take() {
                st.waker = None;
                Some(v)
            } else if st.abandoned {
                st.waker = None;
                st.abandoned = false;
                None
            } else {
                if let Some(w) = waker {
                    if !st.waker.as_ref().is_some_and(|r| r.will_wake(w)) {
                        st.waker = Some(w.clone());
                    }
                    slot.muted.store(false, Ordering::Relaxed);
                }
                return Poll::Pending;
            }
        };
        if let Some(slot) = self.slot.take() {
            self.pool.recycle(slot);
        }
        Poll::Ready(out)
    }

    /// Whether the outcome is in (or the completer is gone).
    fn resolved(slot: &Slot<T>) -> bool {
        slot.done.load(Ordering::Acquire)
    }

    /// Polls, first letting `drive` try to bring the outcome in on this task (the caller
    /// reading its own reply): while it runs the waker is muted, so the completion it makes
    /// does not wake this task again. `drive` gets whether the outcome is still awaited.
    pub(crate) fn poll_driving(
        &mut self,
        cx: &mut Context<'_>,
        drive: impl FnOnce(&mut Context<'_>, &dyn Fn() -> bool),
    ) -> Poll<Option<T>> {
        if let Poll::Ready(v) = self.check(None) {
            return Poll::Ready(v);
        }
        if let Some(slot) = self.slot.as_ref() {
            drive(cx, &|| !Self::resolved(slot));
        }
        self.check(Some(cx.waker()))
    }
}

impl<T> Future for Waiter<T> {
    type Output = Option<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.check(Some(cx.waker()))
    }
}

impl<T> Drop for Waiter<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.closed.store(true, Ordering::Release);
            // Recycled later by nobody: the completer still holds it, so it is just freed.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::CountingWaker;

    /// A completion the waiter drives in itself wakes nobody; one from elsewhere after the
    /// waiter registered wakes it.
    #[test]
    fn a_completion_the_waiter_drives_wakes_nobody() {
        let pool = Arc::new(Pool::<u32>::default());
        let (counter, waker) = CountingWaker::new();
        let mut cx = Context::from_waker(&waker);
        let (c, mut w) = pool.pair();
        let pending = w.poll_driving(&mut cx, |_, waiting| assert!(waiting()));
        assert!(pending.is_pending());
        let mut c = Some(c);
        let r = w.poll_driving(&mut cx, |_, waiting| {
            if let Some(c) = c.take() {
                assert_eq!(c.send(5), Ok(()));
            }
            assert!(!waiting());
        });
        assert_eq!(r, Poll::Ready(Some(5)));
        assert_eq!(counter.count(), 0, "driven in: no wake");
        let (c, mut w) = pool.pair();
        assert!(w.poll_driving(&mut cx, |_, _| {}).is_pending());
        assert_eq!(c.send(6), Ok(()));
        assert_eq!(counter.count(), 1, "completed elsewhere: woken");
        assert_eq!(Pin::new(&mut w).poll(&mut cx), Poll::Ready(Some(6)));
        assert_eq!(pool.free.lock().unwrap().len(), 1, "one slot, reused");
    }

    #[tokio::test]
    async fn completes_and_reuses() {
        let pool = Arc::new(Pool::<u32>::default());
        let (c, w) = pool.pair();
        let t = tokio::spawn(w);
        c.send(7).unwrap();
        assert_eq!(t.await.unwrap(), Some(7));
        assert_eq!(
            pool.free.lock().unwrap().len(),
            1,
            "slot went back to the pool"
        );
        let (c, w) = pool.pair();
        assert_eq!(pool.free.lock().unwrap().len(), 0, "and was reused");
        drop(c);
        assert_eq!(
            w.await,
            None,
            "a dropped completer resolves the waiter with None"
        );
    }

    /// A slot resolved by an abandoned completer is reset before reuse: the next call on it
    /// waits for its own value.
    #[tokio::test]
    async fn a_slot_reused_after_abandonment_starts_afresh() {
        let pool = Arc::new(Pool::<u32>::default());
        let (c, w) = pool.pair();
        drop(c);
        assert_eq!(w.await, None);
        assert_eq!(pool.free.lock().unwrap().len(), 1);
        let (c, mut w) = pool.pair();
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(
            Pin::new(&mut w).poll(&mut cx).is_pending(),
            "not resolved yet"
        );
        assert!(!c.is_closed());
        c.send(3).unwrap();
        assert_eq!(w.await, Some(3));
    }

    #[tokio::test]
    async fn a_dropped_waiter_closes() {
        let pool = Arc::new(Pool::<u32>::default());
        let (c, w) = pool.pair();
        drop(w);
        assert!(c.is_closed());
        assert_eq!(c.send(1), Err(1));
    }
}
