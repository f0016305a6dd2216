//! A server's graceful shutdown: the signal it shares with its connections, the handle that
//! starts and awaits it, the `on_shutdown` hooks, and [`shutdown_signal`] (SIGINT or SIGTERM).

use super::*;

/// The shutdown signal a server shares with its connections: a token, and the end of the grace
/// period (set before the token is cancelled). A connection with a maximum age has its own,
/// a child of the server's.
#[derive(Clone, Debug, Default)]
pub(crate) struct Shutdown {
    pub(crate) token: CancellationToken,
    deadline: Arc<OnceLock<Instant>>,
    /// The server's grace deadline, for a connection's own signal.
    parent: Option<Arc<OnceLock<Instant>>>,
}

impl Shutdown {
    /// The end of the grace period, once a shutdown has begun.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        if !self.token.is_cancelled() {
            return None;
        }
        let own = self.deadline.get().copied();
        let server = self.parent.as_ref().and_then(|p| p.get().copied());
        Some(match (own, server) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or_else(Instant::now),
        })
    }

    /// A signal for one connection: cancelled with the server's (whose grace then applies)
    /// or on its own by [`Shutdown::begin`].
    pub(super) fn child(&self) -> Shutdown {
        Shutdown {
            token: self.token.child_token(),
            deadline: Arc::default(),
            parent: Some(self.deadline.clone()),
        }
    }

    /// Begins a graceful shutdown with `grace` for the calls in flight.
    pub(super) fn begin(&self, grace: Duration) {
        let deadline = Instant::now()
            .checked_add(grace)
            .unwrap_or_else(Instant::now);
        // The first shutdown's grace period stands.
        let _ = self.deadline.set(deadline);
        self.token.cancel();
    }
}

/// A callback of [`ServerBuilder::on_shutdown`].
pub(super) type ShutdownHook = Box<dyn FnOnce() + Send>;

/// The [`ServerBuilder::on_shutdown`] hooks; the first shutdown takes and runs them.
#[derive(Clone)]
pub(super) struct ShutdownHooks(pub(super) Arc<Mutex<Vec<ShutdownHook>>>);

impl std::fmt::Debug for ShutdownHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map_or(0, |h| h.len());
        write!(f, "{n} shutdown hook(s)")
    }
}

/// Starts or awaits a server's graceful shutdown. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ShutdownHandle {
    pub(super) signal: Shutdown,
    pub(super) done: watch::Receiver<bool>,
    pub(super) hooks: ShutdownHooks,
}

impl ShutdownHandle {
    /// Begins a graceful shutdown: stop accepting, send GOAWAY on every connection, let calls
    /// in flight finish for up to `grace`, then end the rest with `UNAVAILABLE`. Returns when
    /// every connection is closed. The first call runs the [`ServerBuilder::on_shutdown`]
    /// hooks before anything else.
    pub async fn shutdown(&self, grace: Duration) {
        // The first shutdown runs the hooks, before any connection hears of it.
        let hooks = std::mem::take(&mut *self.hooks.0.lock().unwrap_or_else(|e| e.into_inner()));
        for hook in hooks {
            hook();
        }
        self.signal.begin(grace);
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }
}

/// Completes when the process is asked to stop: SIGINT (Ctrl-C) or SIGTERM, which process
/// managers, systemd and Kubernetes send before they kill a process. Give it to
/// [`Server::serve_with_shutdown`] so that a server drains instead of dying mid-call.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot watch SIGTERM ({e}); shutting down on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
