//! The [`Completer`]: hands results from tokio threads to an asyncio loop (a queue plus a
//! socket the loop watches).

use bytes::Bytes;
use pyo3::prelude::*;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use topspin::{Response, Status};

use crate::convert::{bytes_to_py, reply_to_py, status_err};
use crate::runtime::lock;
use crate::server_call::ServerCall;

pub(crate) enum Outcome {
    /// A unary reply (with its headers and trailers when `full`).
    Reply(Response<Bytes>, bool),
    /// A stream's next message, or its end (None).
    Item(Option<Bytes>),
    /// Done, no value.
    Unit,
    /// Failed.
    Failed(Status),
    /// A server call arrived: target(method index, call).
    Call(u32, ServerCall),
    /// A server call was cancelled: target(call id).
    Cancelled(u64),
}

pub(crate) struct CompleterInner {
    /// Outcomes waiting for the loop to drain them: a few per call (its start, its reply or
    /// cancellation), so bounded by the calls in flight (`max_concurrent_calls` per connection,
    /// `max_connections`) and by the loop draining at every wake-up.
    pub(crate) queue: Mutex<Vec<(Arc<Py<PyAny>>, Outcome)>>,
    pub(crate) wake: UnixStream,
    pub(crate) read: UnixStream,
}

impl CompleterInner {
    pub(crate) fn complete(&self, target: Arc<Py<PyAny>>, outcome: Outcome) {
        let was_empty = {
            let mut q = lock(&self.queue);
            let e = q.is_empty();
            q.push((target, outcome));
            e
        };
        if was_empty {
            // Full (WouldBlock) means a wake-up is pending anyway.
            let _ = (&self.wake).write(&[1]);
        }
    }
}

/// Results for one asyncio loop: `loop.add_reader(c.fileno(), c.drain)`.
#[pyclass(frozen, module = "topspin._native")]
pub(crate) struct Completer {
    pub(crate) inner: Arc<CompleterInner>,
}

#[pymethods]
impl Completer {
    #[new]
    fn new() -> PyResult<Completer> {
        let (wake, read) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        read.set_nonblocking(true)?;
        Ok(Completer {
            inner: Arc::new(CompleterInner {
                queue: Mutex::new(Vec::new()),
                wake,
                read,
            }),
        })
    }

    /// The descriptor to watch for reading.
    fn fileno(&self) -> i32 {
        self.inner.read.as_raw_fd()
    }

    /// Sets the results that arrived (call from the loop's thread).
    fn drain(&self, py: Python<'_>) -> PyResult<()> {
        let mut buf = [0u8; 256];
        while let Ok(n) = (&self.inner.read).read(&mut buf) {
            if n < buf.len() {
                break;
            }
        }
        let items = std::mem::take(&mut *lock(&self.inner.queue));
        let mut first_err = None;
        for (target, outcome) in items {
            if let Err(e) = deliver(py, target.bind(py), outcome) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

fn deliver(py: Python<'_>, target: &Bound<'_, PyAny>, outcome: Outcome) -> PyResult<()> {
    match outcome {
        Outcome::Call(idx, call) => {
            target.call1((idx, Py::new(py, call)?))?;
            return Ok(());
        }
        Outcome::Cancelled(id) => {
            target.call1((id,))?;
            return Ok(());
        }
        _ => {}
    }
    if target.call_method0("done")?.is_truthy()? {
        return Ok(()); // cancelled meanwhile
    }
    match outcome {
        Outcome::Reply(r, full) => {
            let v = reply_to_py(py, r, full)?;
            target.call_method1("set_result", (v,))?;
        }
        Outcome::Item(Some(b)) => {
            target.call_method1("set_result", (bytes_to_py(py, &b)?,))?;
        }
        Outcome::Item(None) | Outcome::Unit => {
            target.call_method1("set_result", (py.None(),))?;
        }
        Outcome::Failed(s) => {
            target.call_method1("set_exception", (status_err(py, &s).into_value(py),))?;
        }
        Outcome::Call(..) | Outcome::Cancelled(_) => {}
    }
    Ok(())
}
