//! One call to a Python handler ([`ServerCall`]): its request, metadata and deadline, and how
//! it ends (a reply, a stream's end, a status).

use bytes::Bytes;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};
use topspin::{Metadata, Request, Response, Status};

use crate::convert::{bytes_to_py, md_from_py, md_to_py, status_from_py, to_bytes};
use crate::runtime::lock;
use crate::streams::{MessageStream, Sender, StreamInner};

pub(crate) enum Reply {
    Unary(oneshot::Sender<Result<Response<Bytes>, Status>>),
    Stream(oneshot::Sender<Option<Status>>),
}

/// One call to a Python handler.
#[pyclass(frozen, module = "topspin._native")]
pub(crate) struct ServerCall {
    pub(crate) id: u64,
    pub(crate) metadata: Metadata,
    pub(crate) peer: Option<topspin::PeerAddr>,
    pub(crate) remaining: Option<f64>,
    pub(crate) cancellation: Option<topspin::Cancellation>,
    pub(crate) request: Mutex<Option<Bytes>>,
    pub(crate) requests: Option<Arc<StreamInner>>,
    pub(crate) sender: Option<Mutex<Option<mpsc::Sender<Bytes>>>>,
    /// A streaming response's headers, sent before its first message or at its end.
    pub(crate) headers: Mutex<Option<oneshot::Sender<Metadata>>>,
    pub(crate) reply: Mutex<Option<Reply>>,
}

impl ServerCall {
    pub(crate) fn new<T>(id: u64, req: &Request<T>, reply: Reply) -> ServerCall {
        ServerCall {
            id,
            metadata: req.metadata().clone(),
            peer: req.peer_addr().cloned(),
            remaining: req.remaining().map(|d| d.as_secs_f64()),
            cancellation: req.cancellation(),
            request: Mutex::new(None),
            requests: None,
            sender: None,
            headers: Mutex::new(None),
            reply: Mutex::new(Some(reply)),
        }
    }
}

#[pymethods]
impl ServerCall {
    /// The call's id (for cancellation events).
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }
    /// The request metadata.
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        md_to_py(py, &self.metadata)
    }
    /// The peer's address.
    #[getter]
    fn peer(&self) -> Option<String> {
        self.peer.as_ref().map(|p| p.to_string())
    }
    /// Seconds left when the call arrived (None: no deadline).
    #[getter]
    fn remaining(&self) -> Option<f64> {
        self.remaining
    }
    /// Whether the call was cancelled (client, deadline, connection lost, shutdown).
    fn is_cancelled(&self) -> bool {
        self.cancellation.as_ref().is_some_and(|c| c.is_cancelled())
    }
    /// The request message (unary and server-streaming).
    fn request<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        match lock(&self.request).take() {
            Some(b) => bytes_to_py(py, &b),
            None => Err(PyRuntimeError::new_err("no request message")),
        }
    }
    /// The request stream (client-streaming and bidi).
    fn requests(&self) -> PyResult<MessageStream> {
        match &self.requests {
            Some(s) => Ok(MessageStream {
                inner: s.clone(),
                pid: std::process::id(),
            }),
            None => Err(PyRuntimeError::new_err("no request stream")),
        }
    }
    /// The response sender (server-streaming and bidi).
    fn sender(&self) -> PyResult<Sender> {
        match self.sender.as_ref().and_then(|s| lock(s).clone()) {
            Some(tx) => Ok(Sender::new(tx)),
            None => Err(PyRuntimeError::new_err("no response stream")),
        }
    }
    /// Sends a streaming response's headers (once; later calls do nothing).
    #[pyo3(signature = (headers=None))]
    fn send_headers(&self, headers: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        if let Some(tx) = lock(&self.headers).take() {
            let _ = tx.send(md_from_py(headers)?);
        }
        Ok(())
    }
    /// Ends the call: OK with the response (unary kinds) and trailers.
    #[pyo3(signature = (data=None, trailers=None, headers=None))]
    fn finish_ok(
        &self,
        data: Option<&Bound<'_, PyAny>>,
        trailers: Option<&Bound<'_, PyAny>>,
        headers: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.send_headers(headers)?;
        let reply = lock(&self.reply).take();
        if let Some(s) = &self.sender {
            lock(s).take();
        }
        match reply {
            Some(Reply::Unary(tx)) => {
                let Some(data) = data else {
                    return Err(PyValueError::new_err("a unary reply needs a message"));
                };
                let mut r = Response::new(to_bytes(data)?);
                let h = md_from_py(headers)?;
                if !h.is_empty() {
                    r = r.with_metadata(h);
                }
                let t = md_from_py(trailers)?;
                if !t.is_empty() {
                    r = r.with_trailers(t);
                }
                let _ = tx.send(Ok(r));
            }
            Some(Reply::Stream(tx)) => {
                // Trailers set while the stream ran: the stream ends with an OK status that
                // carries them (the runtime sends an item's status, OK included, as the END).
                let t = md_from_py(trailers)?;
                let _ = tx.send((!t.is_empty()).then(|| Status::ok().with_metadata(t)));
            }
            None => {}
        }
        Ok(())
    }
    /// Ends the call with a status, after the response headers `headers` if none went yet
    /// (protocol.md §5.4: a failing call may carry them; the client keeps them on its error).
    #[pyo3(signature = (code, message, details=None, trailers=None, headers=None))]
    fn finish_err(
        &self,
        code: u16,
        message: &str,
        details: Option<&Bound<'_, PyAny>>,
        trailers: Option<&Bound<'_, PyAny>>,
        headers: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = status_from_py(code, message, details, trailers)?;
        let headers = md_from_py(headers)?;
        // A response stream that has not started yet starts with them.
        let headers = match lock(&self.headers).take() {
            Some(tx) => {
                let _ = tx.send(headers);
                Metadata::new()
            }
            None => headers,
        };
        let reply = lock(&self.reply).take();
        match reply {
            Some(Reply::Unary(tx)) => {
                let s = if headers.is_empty() {
                    s
                } else {
                    s.with_headers(headers)
                };
                let _ = tx.send(Err(s));
            }
            Some(Reply::Stream(tx)) => {
                let _ = tx.send(Some(s));
            }
            None => {}
        }
        if let Some(snd) = &self.sender {
            lock(snd).take();
        }
        Ok(())
    }
}
