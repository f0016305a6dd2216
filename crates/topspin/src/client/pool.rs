//! The connections of a channel: a fixed pool of slots, each (re)connected on demand with
//! exponential backoff and jitter after failures. A channel over many endpoints has one such
//! pool per endpoint (a subchannel) and a [`Picker`] (`client/balance.rs`'s `Balancer`)
//! choosing among them per call.

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
    /// Many endpoints: the balancer picks a subchannel (a pool of its own) per call; `slots`
    /// is then empty.
    balancer: Option<Arc<dyn Picker>>,
}

/// A boxed future of a [`Picker`].
pub(crate) type PickFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<ConnHandle, Status>> + Send + 'static>,
>;

/// What a pool over many endpoints asks of its balancer (`client/balance.rs`), which picks a
/// subchannel — a pool of one address — per call.
pub(crate) trait Picker: Send + Sync + std::fmt::Debug {
    /// The addresses of the current set.
    fn addresses(&self) -> Vec<crate::Address>;
    /// Waits for the first endpoint set and one ready endpoint (or fails as a call would).
    fn connect(self: Arc<Self>) -> PickFuture;
    /// The connection for a call if an endpoint is ready now.
    fn pick_now(&self) -> Result<ConnHandle, Pending>;
    /// The connection for a call once an endpoint is ready, within the call's deadline
    /// (`wait_for_ready`: even while every endpoint fails).
    fn pick_waiting(self: Arc<Self>, deadline: Option<Instant>, wait_for_ready: bool)
        -> PickFuture;
}

/// Why a call cannot start on a connection right now.
#[derive(Debug)]
pub(crate) enum Pending {
    /// This slot of a one-address pool needs (re)connecting.
    Slot(usize),
    /// No subchannel is ready now: wait for the balancer (within the call's deadline).
    Balance,
}

impl Pool {
    /// The pool of a channel over many endpoints, `balancer` picking among them.
    pub(crate) fn balanced(endpoint: Endpoint, balancer: Arc<dyn Picker>) -> Pool {
        Pool {
            slots: Vec::new(),
            balancer: Some(balancer),
            ..Pool::single(endpoint)
        }
    }

    /// The pool of one address (also a balancer's subchannel).
    pub(crate) fn single(endpoint: Endpoint) -> Pool {
        Pool {
            slots: (0..endpoint.connections).map(|_| Slot::default()).collect(),
            endpoint,
            next: AtomicUsize::new(0),
            token: AtomicU64::new(1),
            replies: Arc::default(),
            reconnect: true,
            balancer: None,
        }
    }

    /// A pool of one connection that already exists and is never replaced.
    pub(crate) fn fixed(endpoint: Endpoint, handle: ConnHandle) -> Pool {
        let mut pool = Pool::single(Endpoint {
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

    /// The addresses calls go to: a balancer's current set, or the one address.
    pub(crate) fn endpoints(&self) -> Vec<crate::Address> {
        match &self.balancer {
            Some(b) => b.addresses(),
            None => vec![self.endpoint.address.clone()],
        }
    }

    /// A fresh call token (unique per channel).
    pub(crate) fn token(&self) -> u64 {
        self.token.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) async fn connect_all(&self) -> Result<(), Status> {
        if let Some(b) = &self.balancer {
            return b.clone().connect().await.map(|_| ());
        }
        for slot in 0..self.slots.len() {
            self.conn(slot).await?;
        }
        Ok(())
    }

    /// Number of connection slots.
    pub(crate) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// When a slot that failed to connect may try again (`None`: not backing off).
    pub(crate) fn retry_at(&self, slot: usize) -> Option<Instant> {
        let st = self.slots[slot]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        st.retry_at.filter(|_| st.handle.is_none())
    }

    /// The last connection error of a slot.
    pub(crate) fn last_error(&self, slot: usize) -> Option<Status> {
        let st = self.slots[slot]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        st.last_error.clone()
    }

    /// The connection of a slot, usable or not (a balancer's keeper watches it).
    pub(crate) fn handle(&self, slot: usize) -> Option<ConnHandle> {
        let st = self.slots[slot]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        st.handle.clone()
    }

    pub(crate) fn cached(&self, slot: usize) -> Option<ConnHandle> {
        let st = self.slots[slot]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        st.handle.as_ref().filter(|h| h.usable()).cloned()
    }

    /// The slot's live connection, (re)connecting if needed, with backoff after failures.
    pub(crate) async fn conn(&self, slot: usize) -> Result<ConnHandle, Status> {
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
            )
            .with_unprocessed());
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
                // Not connected: the call was never written anywhere.
                Err(status.with_unprocessed())
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
                ))
                .with_unprocessed());
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

    /// The connection for the next call if it is up, else what to wait for.
    #[inline]
    pub(crate) fn pick_now(&self) -> Result<ConnHandle, Pending> {
        if let Some(b) = &self.balancer {
            return b.pick_now();
        }
        let slot = self.next_slot();
        self.cached(slot).ok_or(Pending::Slot(slot))
    }

    /// A usable connection of this pool, trying each slot from the next one (a subchannel's
    /// pick: no connecting).
    pub(crate) fn ready(&self) -> Option<ConnHandle> {
        let n = self.slots.len();
        let first = self.next_slot();
        (0..n).find_map(|i| self.cached((first + i) % n))
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
            Err(pending) => Box::pin(self.conn_within(pending, deadline)).await,
        }
    }

    /// The connection for a wait-for-ready call: unlike [`Pool::pick`], it does not fail
    /// while the server (or, balanced, every endpoint) is unreachable, but waits through
    /// failed attempts and backoff until a connection is ready or the deadline passes (then
    /// `DEADLINE_EXCEEDED`, unprocessed). Errors other than `UNAVAILABLE` end it at once.
    /// (The hook for per-call `wait_for_ready`.)
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) async fn pick_wait_for_ready(
        &self,
        deadline: Option<Instant>,
    ) -> Result<ConnHandle, Status> {
        if let Some(b) = &self.balancer {
            return b.clone().pick_waiting(deadline, true).await;
        }
        loop {
            match self.pick(deadline).await {
                Ok(h) => return Ok(h),
                Err(e) if e.code() != crate::Code::Unavailable => return Err(e),
                Err(e) => {
                    let now = Instant::now();
                    if deadline.is_some_and(|d| d <= now) {
                        return Err(Status::deadline_exceeded(format!(
                            "the call's deadline passed while waiting for {} to be ready: {}",
                            self.endpoint.address,
                            e.message()
                        ))
                        .with_unprocessed());
                    }
                    // Until the next attempt may start (at most 1 s, never past the deadline).
                    let retry = (0..self.slots.len()).filter_map(|s| self.retry_at(s)).min();
                    let mut wake = retry.unwrap_or(now).max(now + Duration::from_millis(5));
                    wake = wake.min(now + Duration::from_secs(1));
                    if let Some(d) = deadline {
                        wake = wake.min(d);
                    }
                    tokio::time::sleep_until(wake.into()).await;
                }
            }
        }
    }

    /// The connection for a call that could not start at once: connects the slot, or waits
    /// for the balancer to have a ready endpoint, within the call's deadline.
    pub(crate) async fn conn_within(
        &self,
        pending: Pending,
        deadline: Option<Instant>,
    ) -> Result<ConnHandle, Status> {
        let slot = match pending {
            Pending::Slot(slot) => slot,
            Pending::Balance => match &self.balancer {
                Some(b) => return b.clone().pick_waiting(deadline, false).await,
                None => return Err(Status::internal("no balancer for a balanced pick")),
            },
        };
        let Some(d) = deadline else {
            return self.conn(slot).await;
        };
        match tokio::time::timeout_at(d.into(), self.conn(slot)).await {
            Ok(r) => r,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "the call's deadline passed while connecting to {}",
                self.endpoint.address
            ))
            .with_unprocessed()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    /// A port nobody listens on yet (bound, read, released).
    fn free_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    }

    async fn serve_later(address: String) -> crate::ShutdownHandle {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let server = crate::Server::builder()
            .bind(address.as_str())
            .await
            .expect("bind");
        let handle = server.shutdown_handle();
        tokio::spawn(server.serve());
        handle
    }

    #[tokio::test]
    async fn wait_for_ready_waits_through_failures_until_a_server_appears() {
        for balanced in [false, true] {
            let address = format!("tcp://127.0.0.1:{}", free_port());
            let endpoint = if balanced {
                Endpoint::balanced([address.as_str()]).expect("endpoint")
            } else {
                Endpoint::new(address.as_str()).expect("endpoint")
            }
            .backoff(Duration::from_millis(20), Duration::from_millis(100));
            let pool = Arc::new(super::super::balance::pool_for(endpoint));
            // Without waiting: nobody listens, the call fails at once, unsent.
            let e = pool.pick(None).await.expect_err("nobody listens");
            assert_eq!(e.code(), Code::Unavailable, "{e}");
            assert!(e.is_unprocessed(), "{e:?}");
            // A deadline bounds the wait.
            let soon = Instant::now() + Duration::from_millis(100);
            let e = pool
                .pick_wait_for_ready(Some(soon))
                .await
                .expect_err("deadline");
            assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
            assert!(e.is_unprocessed());
            // Waiting: the server comes up 300 ms later and the pick succeeds.
            let server = tokio::spawn(serve_later(address.clone()));
            let deadline = Instant::now() + Duration::from_secs(10);
            let h = pool.pick_wait_for_ready(Some(deadline)).await;
            assert!(h.is_ok(), "balanced {balanced}: {h:?}");
            server.await.expect("server").shutdown(Duration::ZERO).await;
        }
    }
}
