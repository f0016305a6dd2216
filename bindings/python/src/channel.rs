//! The client: [`Channel`] (calls of the four kinds, blocking or completing asyncio futures),
//! the pending reply of a client-streaming call, and [`Abort`] for asyncio calls.

use bytes::Bytes;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinHandle};
use topspin::tls::ClientTls;
use topspin::{Response, Status};

use crate::completer::{Completer, Outcome};
use crate::convert::{
    config_of, md_from_py, reply_to_py, request, status_err, timeout_of, to_bytes,
};
use crate::runtime::{check_pid, lock, runtime, wait};
use crate::streams::{
    receiver_stream, MessageStream, Sender, StreamInner, StreamState, STREAM_QUEUE,
};
use crate::PbBytes;

/// A connection to a server, bytes-level. Cheap to share between threads.
#[pyclass(frozen, module = "topspin._native")]
pub(crate) struct Channel {
    pub(crate) ch: topspin::Channel,
    pub(crate) pid: u32,
}

/// The task of a call with one response.
pub(crate) type UnaryCall = JoinHandle<Result<Response<Bytes>, Status>>;

/// A client-streaming call in progress.
#[pyclass(frozen, module = "topspin._native")]
pub(crate) struct PendingReply {
    pub(crate) jh: Mutex<Option<UnaryCall>>,
    pub(crate) abort: AbortHandle,
    pub(crate) pid: u32,
}

#[pymethods]
impl PendingReply {
    /// Waits for the reply: bytes, or (bytes, headers, trailers) when `full`.
    fn wait(&self, py: Python<'_>, full: bool) -> PyResult<Py<PyAny>> {
        check_pid(self.pid, "call")?;
        let Some(jh) = lock(&self.jh).take() else {
            return Err(PyRuntimeError::new_err("the reply was already taken"));
        };
        let r = match wait(py, jh) {
            Ok(r) => r,
            Err(e) => {
                self.abort.abort();
                return Err(e);
            }
        };
        match r {
            Ok(Ok(resp)) => reply_to_py(py, resp, full),
            Ok(Err(s)) => Err(status_err(py, &s)),
            Err(_) => Err(status_err(py, &Status::cancelled("the call was cancelled"))),
        }
    }

    fn wait_async(&self, completer: &Completer, fut: Py<PyAny>, full: bool) -> PyResult<()> {
        check_pid(self.pid, "call")?;
        let Some(jh) = lock(&self.jh).take() else {
            return Err(PyRuntimeError::new_err("the reply was already taken"));
        };
        let c = completer.inner.clone();
        let fut = Arc::new(fut);
        runtime()?.spawn(async move {
            let o = match jh.await {
                Ok(Ok(r)) => Outcome::Reply(r, full),
                Ok(Err(s)) => Outcome::Failed(s),
                Err(_) => Outcome::Failed(Status::cancelled("the call was cancelled")),
            };
            c.complete(fut, o);
        });
        Ok(())
    }

    /// Cancels the call.
    fn cancel(&self) {
        self.abort.abort();
    }
}

#[pymethods]
impl Channel {
    /// A channel to `address` (`tcp://host:port`, `unix:///path`, `tls://host:port`,
    /// `ws://host:port/path`, `wss://host:port/path`); connects on first use. `ca_pem`,
    /// `cert_pem`/`key_pem` (mutual TLS) and `server_name` are the TLS settings of `tls://`
    /// and `wss://` (PEM file paths); `timeout` (seconds) applies to calls that set none;
    /// `compression` ("zstd", "gzip") compresses requests and accepts compressed responses.
    #[new]
    #[pyo3(signature = (address, ca_pem=None, cert_pem=None, key_pem=None, server_name=None,
        max_message_size=None, timeout=None, compression=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        address: &str,
        ca_pem: Option<PathBuf>,
        cert_pem: Option<PathBuf>,
        key_pem: Option<PathBuf>,
        server_name: Option<&str>,
        max_message_size: Option<u32>,
        timeout: Option<f64>,
        compression: Option<&str>,
    ) -> PyResult<Channel> {
        let rt = runtime()?;
        let _g = rt.enter();
        let bad =
            |e: &dyn std::fmt::Display| PyValueError::new_err(format!("topspin: {address}: {e}"));
        let mut ep = topspin::Endpoint::new(address).map_err(|s| bad(&s))?;
        let tls_wanted =
            ca_pem.is_some() || cert_pem.is_some() || key_pem.is_some() || server_name.is_some();
        if tls_wanted {
            let mut tls = match &ca_pem {
                Some(ca) => ClientTls::ca_pem_file(ca).map_err(|e| bad(&e))?,
                None => ClientTls::webpki_roots(),
            };
            match (&cert_pem, &key_pem) {
                (Some(c), Some(k)) => tls = tls.identity_pem_files(c, k).map_err(|e| bad(&e))?,
                (None, None) => {}
                _ => return Err(bad(&"cert_pem and key_pem go together")),
            }
            if let Some(n) = server_name {
                tls = tls.server_name(n).map_err(|e| bad(&e))?;
            }
            ep = ep.tls(tls);
        }
        ep = ep.config(config_of(max_message_size, compression)?);
        if let Some(t) = timeout_of(timeout)? {
            ep = ep.timeout(t);
        }
        Ok(Channel {
            ch: ep.connect_lazy(),
            pid: std::process::id(),
        })
    }

    /// A unary call, waiting without the GIL. Returns bytes, or (bytes, headers, trailers).
    #[pyo3(signature = (method, data, timeout=None, metadata=None, full=false))]
    fn unary(
        &self,
        py: Python<'_>,
        method: String,
        data: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        metadata: Option<&Bound<'_, PyAny>>,
        full: bool,
    ) -> PyResult<Py<PyAny>> {
        check_pid(self.pid, "Channel")?;
        let req = request(to_bytes(data)?, timeout_of(timeout)?, md_from_py(metadata)?);
        let ch = &self.ch;
        let r = wait(py, async move { ch.unary(PbBytes, method, req).await })?;
        match r {
            Ok(resp) => reply_to_py(py, resp, full),
            Err(s) => Err(status_err(py, &s)),
        }
    }

    /// A unary call completing an asyncio future through `completer`.
    #[pyo3(signature = (completer, fut, method, data, timeout=None, metadata=None, full=false))]
    #[allow(clippy::too_many_arguments)]
    fn unary_async(
        &self,
        completer: &Completer,
        fut: Py<PyAny>,
        method: String,
        data: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        metadata: Option<&Bound<'_, PyAny>>,
        full: bool,
    ) -> PyResult<Abort> {
        check_pid(self.pid, "Channel")?;
        let req = request(to_bytes(data)?, timeout_of(timeout)?, md_from_py(metadata)?);
        let ch = self.ch.clone();
        let c = completer.inner.clone();
        let fut = Arc::new(fut);
        let jh = runtime()?.spawn(async move {
            let o = match ch.unary(PbBytes, method, req).await {
                Ok(r) => Outcome::Reply(r, full),
                Err(s) => Outcome::Failed(s),
            };
            c.complete(fut, o);
        });
        Ok(Abort {
            handle: jh.abort_handle(),
        })
    }

    /// A server-streaming call: the stream of responses.
    #[pyo3(signature = (method, data, timeout=None, metadata=None))]
    fn server_streaming(
        &self,
        method: String,
        data: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        metadata: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<MessageStream> {
        check_pid(self.pid, "Channel")?;
        let req = request(to_bytes(data)?, timeout_of(timeout)?, md_from_py(metadata)?);
        let ch = self.ch.clone();
        let jh = runtime()?.spawn(async move { ch.server_streaming(PbBytes, method, req).await });
        Ok(MessageStream {
            inner: StreamInner::new(StreamState::Pending(jh)),
            pid: self.pid,
        })
    }

    /// A client-streaming call: (sender of requests, pending reply).
    #[pyo3(signature = (method, timeout=None, metadata=None))]
    fn client_streaming(
        &self,
        method: String,
        timeout: Option<f64>,
        metadata: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(Sender, PendingReply)> {
        check_pid(self.pid, "Channel")?;
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let req = request(
            receiver_stream(rx),
            timeout_of(timeout)?,
            md_from_py(metadata)?,
        );
        let ch = self.ch.clone();
        let jh = runtime()?.spawn(async move { ch.client_streaming(PbBytes, method, req).await });
        let abort = jh.abort_handle();
        Ok((
            Sender::new(tx),
            PendingReply {
                jh: Mutex::new(Some(jh)),
                abort,
                pid: self.pid,
            },
        ))
    }

    /// A bidirectional call: (sender of requests, stream of responses).
    #[pyo3(signature = (method, timeout=None, metadata=None))]
    fn streaming(
        &self,
        method: String,
        timeout: Option<f64>,
        metadata: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(Sender, MessageStream)> {
        check_pid(self.pid, "Channel")?;
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let req = request(
            receiver_stream(rx),
            timeout_of(timeout)?,
            md_from_py(metadata)?,
        );
        let ch = self.ch.clone();
        let jh = runtime()?.spawn(async move { ch.streaming(PbBytes, method, req).await });
        Ok((
            Sender::new(tx),
            MessageStream {
                inner: StreamInner::new(StreamState::Pending(jh)),
                pid: self.pid,
            },
        ))
    }
}

/// Cancels an asyncio call (drops its future: CANCEL on the wire).
#[pyclass(frozen, module = "topspin._native")]
pub(crate) struct Abort {
    pub(crate) handle: AbortHandle,
}

#[pymethods]
impl Abort {
    fn abort(&self) {
        self.handle.abort();
    }
}
