//! Where a client connection's "bytes arrived" goes while a caller reads its own reply.
//!
//! A caller whose call is the connection's only one reads the reply itself
//! ([`Driver::read_inline`](super::Driver::read_inline)) instead of waiting for the connection's
//! task to read it and wake the caller: one task wake-up and one scheduler turn less per call
//! (with a current-thread runtime also the runtime's extra non-blocking look at its I/O driver
//! before it polls a `block_on` future a task woke). The transport is then polled with this
//! route's waker, which wakes the reader while there is one and the task otherwise.
//!
//! A wake the route gave the reader is the reader's to act on: if the reader stops reading for
//! itself before it read again ([`ReadRoute::clear`], also when its call's future is dropped),
//! the wake goes on to the task, so nothing that arrived is left unread.

use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};

#[derive(Debug, Default)]
pub(crate) struct ReadRoute {
    st: Mutex<RouteState>,
}

#[derive(Debug, Default)]
struct RouteState {
    /// The caller reading for itself, if any.
    reader: Option<Waker>,
    /// The connection's task.
    task: Option<Waker>,
    /// The reader was woken and has not read since.
    delivered: bool,
}

impl ReadRoute {
    fn lock(&self) -> std::sync::MutexGuard<'_, RouteState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `reader` is about to read until the transport has nothing more (what woke it so far
    /// is being acted on); wakes go to it from now on, and to `task` once it stops.
    pub(crate) fn set(&self, reader: &Waker, task: &Waker) {
        let mut st = self.lock();
        if !st.reader.as_ref().is_some_and(|w| w.will_wake(reader)) {
            st.reader = Some(reader.clone());
        }
        if !st.task.as_ref().is_some_and(|w| w.will_wake(task)) {
            st.task = Some(task.clone());
        }
        st.delivered = false;
    }

    /// The reader stops reading for itself: a wake it got and did not act on goes to the task.
    pub(crate) fn clear(&self) {
        let forward = {
            let mut st = self.lock();
            if st.reader.take().is_none() {
                return;
            }
            if std::mem::take(&mut st.delivered) {
                st.task.clone()
            } else {
                None
            }
        };
        if let Some(task) = forward {
            task.wake();
        }
    }
}

impl Wake for ReadRoute {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let task = {
            let mut st = self.lock();
            if let Some(r) = &st.reader {
                // Woken under the lock, which saves cloning (and dropping) the reader's waker:
                // a waker only schedules its task, it does not poll it here.
                r.wake_by_ref();
                st.delivered = true;
                return;
            }
            st.task.clone()
        };
        if let Some(w) = task {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::CountingWaker;

    #[test]
    fn wakes_the_reader_while_there_is_one_and_hands_an_unread_wake_to_the_task() {
        let route = Arc::new(ReadRoute::default());
        let w = Waker::from(route.clone());
        let (reader, rw) = CountingWaker::new();
        let (task, tw) = CountingWaker::new();
        let n = |c: &Arc<CountingWaker>| c.count();
        route.set(&rw, &tw);
        w.wake_by_ref();
        assert_eq!((n(&reader), n(&task)), (1, 0));
        // The reader read after that wake: stopping hands nothing on.
        route.set(&rw, &tw);
        route.clear();
        assert_eq!((n(&reader), n(&task)), (1, 0));
        // No reader: the task.
        w.wake_by_ref();
        assert_eq!((n(&reader), n(&task)), (1, 1));
        // The reader was woken and went away without reading: the task gets it.
        route.set(&rw, &tw);
        w.wake_by_ref();
        route.clear();
        assert_eq!((n(&reader), n(&task)), (2, 2));
        route.clear(); // twice is nothing more
        assert_eq!(n(&task), 2);
    }
}
