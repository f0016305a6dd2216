//! The tokio runtime (one per process, again in a forked child) and blocking waits on it.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::runtime::Runtime;

static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's runtime; a forked child gets a new one (the parent's threads are not there).
pub(crate) fn runtime() -> PyResult<&'static Runtime> {
    let pid = std::process::id();
    let mut g = lock(&RUNTIME);
    if let Some((p, rt)) = *g {
        if p == pid {
            return Ok(rt);
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("topspin")
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("topspin: cannot start a runtime: {e}")))?;
    // Leaked on purpose: it lives as long as the process (and a parent's, after fork, cannot
    // be dropped safely in the child).
    let rt: &'static Runtime = Box::leak(Box::new(rt));
    *g = Some((pid, rt));
    Ok(rt)
}

pub(crate) fn check_pid(pid: u32, what: &str) -> PyResult<()> {
    if pid != std::process::id() {
        return Err(PyRuntimeError::new_err(format!(
            "topspin: this {what} was created in the parent process before fork(); \
             create a new one in the child"
        )));
    }
    Ok(())
}

/// Runs `fut` on the runtime from a Python thread without the GIL, checking for signals
/// (KeyboardInterrupt) every 50 ms; an exception from a signal handler drops the future
/// (which cancels its call).
pub(crate) fn wait<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let rt = runtime()?;
    let mut fut = std::pin::pin!(fut);
    loop {
        let r = py.detach(|| {
            rt.block_on(async { tokio::time::timeout(Duration::from_millis(50), &mut fut).await })
        });
        match r {
            Ok(v) => return Ok(v),
            Err(_) => py.check_signals()?,
        }
    }
}
