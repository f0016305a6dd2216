//! Streams of messages (responses on a client, requests on a server) and senders.

use bytes::Bytes;
use futures_util::stream::{self, Stream};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use topspin::{Metadata, Response, Status, Streaming};

use crate::completer::{Completer, Outcome};
use crate::convert::{bytes_to_py, md_to_py, status_err, to_bytes};
use crate::runtime::{check_pid, lock, runtime, wait};

pub(crate) enum StreamState {
    Pending(JoinHandle<Result<Response<Streaming<Bytes>>, Status>>),
    Open(Streaming<Bytes>),
    Done,
}

pub(crate) struct StreamInner {
    pub(crate) state: tokio::sync::Mutex<StreamState>,
    pub(crate) headers: Mutex<Option<Metadata>>,
    pub(crate) trailers: Mutex<Option<Metadata>>,
    pub(crate) cancel: watch::Sender<bool>,
}

impl StreamInner {
    pub(crate) fn new(state: StreamState) -> Arc<StreamInner> {
        Arc::new(StreamInner {
            state: tokio::sync::Mutex::new(state),
            headers: Mutex::new(None),
            trailers: Mutex::new(None),
            cancel: watch::Sender::new(false),
        })
    }

    pub(crate) async fn next(self: Arc<Self>) -> Result<Option<Bytes>, Status> {
        let mut cancelled = self.cancel.subscribe();
        let mut st = self.state.lock().await;
        let r = tokio::select! {
            r = Self::step(&self, &mut st) => r,
            _ = cancelled.wait_for(|c| *c) => Err(Status::cancelled("the call was cancelled")),
        };
        if !matches!(r, Ok(Some(_))) {
            if let StreamState::Open(s) = &*st {
                if let Some(t) = s.trailers() {
                    *lock(&self.trailers) = Some(t.clone());
                }
            }
            *st = StreamState::Done;
        }
        r
    }

    pub(crate) async fn step(&self, st: &mut StreamState) -> Result<Option<Bytes>, Status> {
        loop {
            match st {
                // The call is started (the Rust client does not wait for the server's
                // headers): its response headers come with the stream's first item.
                StreamState::Pending(jh) => match jh.await {
                    Ok(Ok(resp)) => *st = StreamState::Open(resp.into_inner()),
                    Ok(Err(s)) => return Err(s),
                    Err(_) => return Err(Status::cancelled("the call was cancelled")),
                },
                StreamState::Open(s) => {
                    let r = s.message().await;
                    let mut headers = lock(&self.headers);
                    if headers.is_none() {
                        *headers = s.received_headers().cloned();
                    }
                    return r;
                }
                StreamState::Done => return Ok(None),
            }
        }
    }
}

/// A stream of messages: `next()` (blocking) or `next_async(completer, future)`.
#[pyclass(frozen, module = "topspin._native")]
pub(crate) struct MessageStream {
    pub(crate) inner: Arc<StreamInner>,
    pub(crate) pid: u32,
}

#[pymethods]
impl MessageStream {
    /// The next message, or None at the end; raises StatusError.
    fn next(&self, py: Python<'_>) -> PyResult<Option<Py<PyBytes>>> {
        check_pid(self.pid, "stream")?;
        let inner = self.inner.clone();
        let r = wait(py, async move { inner.next().await });
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                self.cancel();
                return Err(e);
            }
        };
        match r {
            Ok(Some(b)) => Ok(Some(bytes_to_py(py, &b)?.unbind())),
            Ok(None) => Ok(None),
            Err(s) => Err(status_err(py, &s)),
        }
    }

    fn next_async(&self, completer: &Completer, fut: Py<PyAny>) -> PyResult<()> {
        check_pid(self.pid, "stream")?;
        let inner = self.inner.clone();
        let c = completer.inner.clone();
        let fut = Arc::new(fut);
        runtime()?.spawn(async move {
            let o = match inner.next().await {
                Ok(b) => Outcome::Item(b),
                Err(s) => Outcome::Failed(s),
            };
            c.complete(fut, o);
        });
        Ok(())
    }

    /// Cancels the call (CANCEL on the wire if it is still open).
    fn cancel(&self) {
        self.inner.cancel.send_replace(true);
        if let Ok(mut st) = self.inner.state.try_lock() {
            if let StreamState::Pending(jh) = &*st {
                jh.abort();
            }
            *st = StreamState::Done;
        }
    }

    /// The response headers once the stream has given its first item (else None): the
    /// server's, or empty ones when it sent a message or ended without them.
    fn headers<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        match &*lock(&self.inner.headers) {
            Some(h) => Ok(Some(md_to_py(py, h)?)),
            None => Ok(None),
        }
    }

    /// The trailers, once the stream ended (else None).
    fn trailers<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        match &*lock(&self.inner.trailers) {
            Some(h) => Ok(Some(md_to_py(py, h)?)),
            None => Ok(None),
        }
    }
}

/// Sends messages into a call's stream (requests on a client, responses on a server).
#[pyclass(frozen, module = "topspin._native")]
pub(crate) struct Sender {
    pub(crate) tx: Mutex<Option<mpsc::Sender<Bytes>>>,
    pub(crate) pid: u32,
}

impl Sender {
    pub(crate) fn new(tx: mpsc::Sender<Bytes>) -> Sender {
        Sender {
            tx: Mutex::new(Some(tx)),
            pid: std::process::id(),
        }
    }
    pub(crate) fn get(&self) -> Option<mpsc::Sender<Bytes>> {
        lock(&self.tx).clone()
    }
}

#[pymethods]
impl Sender {
    /// Sends one message, waiting for room; False once the call is over (or closed).
    fn send(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<bool> {
        check_pid(self.pid, "sender")?;
        let b = to_bytes(data)?;
        let Some(tx) = self.get() else {
            return Ok(false);
        };
        match tx.try_send(b) {
            Ok(()) => Ok(true),
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(false),
            Err(mpsc::error::TrySendError::Full(b)) => {
                wait(py, async move { tx.send(b).await.is_ok() })
            }
        }
    }

    /// Sends without waiting: True sent, False full, None the call is over.
    fn try_send(&self, data: &Bound<'_, PyAny>) -> PyResult<Option<bool>> {
        let Some(tx) = self.get() else {
            return Ok(None);
        };
        match tx.try_send(to_bytes(data)?) {
            Ok(()) => Ok(Some(true)),
            Err(mpsc::error::TrySendError::Full(_)) => Ok(Some(false)),
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(None),
        }
    }

    /// Sends, completing `fut` with None once there was room (or the call is over).
    fn send_async(
        &self,
        completer: &Completer,
        fut: Py<PyAny>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        check_pid(self.pid, "sender")?;
        let b = to_bytes(data)?;
        let c = completer.inner.clone();
        let fut = Arc::new(fut);
        let tx = self.get();
        runtime()?.spawn(async move {
            if let Some(tx) = tx {
                let _ = tx.send(b).await;
            }
            c.complete(fut, Outcome::Unit);
        });
        Ok(())
    }

    /// No more messages (half-close).
    fn close(&self) {
        lock(&self.tx).take();
    }
}

pub(crate) fn receiver_stream(
    rx: mpsc::Receiver<Bytes>,
) -> impl Stream<Item = Bytes> + Send + 'static {
    stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) })
}

pub(crate) const STREAM_QUEUE: usize = 16;
