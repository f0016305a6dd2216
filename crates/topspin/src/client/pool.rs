//! The connections of a channel: a fixed pool of slots, each (re)connected on demand with
//! exponential backoff and jitter after failures.

use super::conn::ConnHandle;
use super::Endpoint;
use crate::Status;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
struct SlotState {
    handle: Option<ConnHandle>,
    failures: u32,
    retry_at: Option<Instant>,
    last_error: Option<Status>,
}

#[derive(Debug, Default)]
struct Slot {
    state: Mutex<SlotState>,
    connecting: tokio::sync::Mutex<()>,
}

pub(crate) type Replies = super::completion::Pool<Result<crate::Response<bytes::Bytes>, Status>>;

/// What the clones of a channel share.
#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) endpoint: Endpoint,
    slots: Vec<Slot>,
    next: AtomicUsize,
    token: AtomicU64,
    /// Reused completions of unary-response calls.
    pub(crate) replies: Arc<Replies>,
    /// Whether a dead connection is replaced (not for a connection over a given transport).
    reconnect: bool,
}

impl Pool {
    pub(crate) fn new(endpoint: Endpoint) -> Pool {
        Pool {
            slots: (0..endpoint.connections).map(|_| Slot::default()).collect(),
            endpoint,
            next: AtomicUsize::new(0),
            token: AtomicU64::new(1),
            replies: Arc::default(),
            reconnect: true,
        }
    }

    /// A pool of one connection that already exists and is never replaced.
    pub(crate) fn fixed(endpoint: Endpoint, handle: ConnHandle) -> Pool {
        let mut pool = Pool::new(Endpoint {
            connections: 1,
            ..endpoint
        });
        pool.reconnect = false;
        pool.slots[0]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .handle = Some(handle);
        pool
    }

    /// A fresh call token (unique per channel).
    pub(crate) fn token(&self) -> u64 {
        self.token.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) async fn connect_all(&self) -> Result<(), Status> {
        for slot in 0..self.slots.len() {
            self.conn(slot).await?;
        }
        Ok(())
    }

    fn cached(&self, slot: usize) -> Option<ConnHandle> {
        let st = self.slots[slot]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        st.handle.as_ref().filter(|h| h.usable()).cloned()
    }

    /// The slot's live connection, (re)connecting if needed, with backoff after failures.
    async fn conn(&self, slot: usize) -> Result<ConnHandle, Status> {
        if let Some(h) = self.cached(slot) {
            return Ok(h);
        }
        let _guard = self.slots[slot].connecting.lock().await;
        if let Some(h) = self.cached(slot) {
            return Ok(h);
        }
        if !self.reconnect {
            return Err(Status::unavailable(
                "the connection closed, and a channel over a given transport does not reconnect",
            ));
        }
        self.backing_off(slot)?;
        let ep = &self.endpoint;
        let r = ep.connect_one().await;
        let mut st = self.slots[slot]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match r {
            Ok(h) => {
                st.handle = Some(h.clone());
                st.failures = 0;
                st.retry_at = None;
                st.last_error = None;
                Ok(h)
            }
            Err(status) => {
                st.handle = None;
                st.failures += 1;
                let base = ep.backoff_initial.as_secs_f64() * 1.6f64.powi(st.failures as i32 - 1);
                let capped = base.min(ep.backoff_max.as_secs_f64());
                let jittered = capped * (0.8 + 0.4 * fastrand::f64());
                st.retry_at = Some(Instant::now() + Duration::from_secs_f64(jittered));
                st.last_error = Some(status.clone());
                Err(status)
            }
        }
    }

    /// Fails fast while the slot backs off after a failed attempt.
    fn backing_off(&self, slot: usize) -> Result<(), Status> {
        let st = self.slots[slot]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let (Some(at), Some(err)) = (st.retry_at, &st.last_error) {
            let now = Instant::now();
            if now < at {
                return Err(Status::unavailable(format!(
                    "{}; next connection attempt in {:?}",
                    err.message(),
                    at - now
                )));
            }
        }
        Ok(())
    }

    /// The next slot (round robin over the pool).
    fn next_slot(&self) -> usize {
        let n = self.slots.len();
        if n == 1 {
            0
        } else {
            self.next.fetch_add(1, Ordering::Relaxed) % n
        }
    }

    /// The connection for the next call if it is up, else the slot to connect.
    pub(crate) fn pick_now(&self) -> Result<ConnHandle, usize> {
        let slot = self.next_slot();
        self.cached(slot).ok_or(slot)
    }

    /// The connection for the next call (round robin over the pool), (re)connecting if needed.
    /// Connecting and the handshake count inside the call's deadline: past it the call fails
    /// with `DEADLINE_EXCEEDED` naming what it waited for (the attempt itself goes on, for the
    /// calls after it).
    pub(crate) async fn pick(&self, deadline: Option<Instant>) -> Result<ConnHandle, Status> {
        match self.pick_now() {
            Ok(h) => Ok(h),
            // (Re)connecting is rare and its future is large: boxed, it stays out of every
            // call's future (which would otherwise be over a kilobyte).
            Err(slot) => Box::pin(self.conn_within(slot, deadline)).await,
        }
    }

    pub(crate) async fn conn_within(
        &self,
        slot: usize,
        deadline: Option<Instant>,
    ) -> Result<ConnHandle, Status> {
        let Some(d) = deadline else {
            return self.conn(slot).await;
        };
        match tokio::time::timeout_at(d.into(), self.conn(slot)).await {
            Ok(r) => r,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "the call's deadline passed while connecting to {}",
                self.endpoint.address
            ))),
        }
    }
}
