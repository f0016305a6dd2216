//! `topspin._native`: the Rust side of the Python binding.
//!
//! Bytes-level calls over `topspin::Channel` and a `topspin::Server` whose handlers are Python
//! callables. One multi-thread tokio runtime per process, created lazily (and again in a forked
//! child). Tokio threads never take the GIL: results for asyncio go through a [`Completer`], a
//! queue plus a socket the event loop watches (`loop.add_reader`), and the loop thread sets the
//! futures' results. Sync calls release the GIL while they wait and check for signals (Ctrl-C)
//! every 50 ms.

use bytes::Bytes;
use futures_util::stream::{self, Stream};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use std::future::Future;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{AbortHandle, JoinHandle};
use topspin::codec::Codec;
use topspin::tls::{ClientTls, ServerTls};
use topspin::{Code, Compression, Encoding, Metadata, Request, Response, Status, Streaming};

mod gen;

/// Bytes in, bytes out, announced as protobuf on the wire (the messages are protobuf, encoded
/// by Python's `protobuf`).
#[derive(Clone, Copy, Debug, Default)]
struct PbBytes;

impl Codec for PbBytes {
    type Encode = Bytes;
    type Decode = Bytes;
    const ID: u8 = topspin::codec::CODEC_PROTOBUF;
    fn encode(&self, item: Bytes) -> Result<Bytes, Status> {
        Ok(item)
    }
    fn decode(&self, buf: Bytes) -> Result<Bytes, Status> {
        Ok(buf)
    }
}

// ---------------------------------------------------------------------------------------------
// Runtime, per process.

static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's runtime; a forked child gets a new one (the parent's threads are not there).
fn runtime() -> PyResult<&'static Runtime> {
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

fn check_pid(pid: u32, what: &str) -> PyResult<()> {
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
fn wait<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
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

// ---------------------------------------------------------------------------------------------
// Conversions.

/// Request bytes from Python: large `bytes` are shared without a copy.
fn to_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        let s = b.as_bytes();
        if s.len() < 64 * 1024 {
            return Ok(Bytes::copy_from_slice(s));
        }
        let backed: PyBackedBytes = b.clone().into();
        return Ok(Bytes::from_owner(backed));
    }
    // bytearray, memoryview …: one copy through bytes().
    let b = obj
        .py()
        .import("builtins")?
        .getattr("bytes")?
        .call1((obj,))?;
    let b = b.cast::<PyBytes>()?;
    Ok(Bytes::copy_from_slice(b.as_bytes()))
}

/// Python bytes from a message; a large one is copied without the GIL.
fn bytes_to_py<'py>(py: Python<'py>, b: &Bytes) -> PyResult<Bound<'py, PyBytes>> {
    if b.len() < 64 * 1024 {
        return Ok(PyBytes::new(py, b));
    }
    PyBytes::new_with(py, b.len(), |buf| {
        py.detach(|| buf.copy_from_slice(b));
        Ok(())
    })
}

fn md_from_py(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Metadata> {
    let Some(obj) = obj else {
        return Ok(Metadata::new());
    };
    if obj.is_none() {
        return Ok(Metadata::new());
    }
    let mut b = Metadata::builder();
    for item in obj.try_iter()? {
        let item = item?;
        let (k, v): (String, Bound<'_, PyAny>) = item.extract()?;
        let bad = |e: topspin_proto::InvalidMetadata| {
            PyValueError::new_err(format!("metadata {k:?}: {e}"))
        };
        b = if let Ok(s) = v.cast::<PyString>() {
            b.text(&k, &s.to_cow()?).map_err(bad)?
        } else {
            let v = to_bytes(&v)?;
            if k.ends_with("-bin") {
                b.binary(&k, &v).map_err(bad)?
            } else {
                b.entry(&k, &v).map_err(bad)?
            }
        };
    }
    Ok(b.build())
}

fn md_to_py<'py>(py: Python<'py>, md: &Metadata) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for (k, v) in md.iter() {
        let v: Bound<'py, PyAny> = if k.ends_with("-bin") {
            PyBytes::new(py, v).into_any()
        } else {
            PyString::new(py, &String::from_utf8_lossy(v)).into_any()
        };
        list.append(PyTuple::new(py, [PyString::new(py, k).into_any(), v])?)?;
    }
    Ok(list)
}

static MAKE_ERROR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// A `topspin.StatusError` for a status.
fn status_err(py: Python<'_>, s: &Status) -> PyErr {
    let r = (|| -> PyResult<PyErr> {
        let f = MAKE_ERROR.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            Ok(py.import("topspin._errors")?.getattr("_make")?.unbind())
        })?;
        let e = f.bind(py).call1((
            s.code().as_u16(),
            s.message(),
            PyBytes::new(py, s.details()),
            md_to_py(py, s.metadata())?,
        ))?;
        Ok(PyErr::from_value(e))
    })();
    r.unwrap_or_else(|e| e)
}

fn status_from_py(
    code: u16,
    message: &str,
    details: Option<&Bound<'_, PyAny>>,
    trailers: Option<&Bound<'_, PyAny>>,
) -> PyResult<Status> {
    let mut s = Status::new(Code::from_u16(code), message.to_owned());
    if let Some(d) = details {
        if !d.is_none() {
            s = s.with_details(to_bytes(d)?);
        }
    }
    let md = md_from_py(trailers)?;
    if !md.is_empty() {
        s = s.with_metadata(md);
    }
    Ok(s)
}

fn timeout_of(t: Option<f64>) -> PyResult<Option<Duration>> {
    match t {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => Ok(Some(Duration::from_secs_f64(t))),
        Some(t) if t.is_infinite() && t > 0.0 => Ok(None),
        Some(t) => Err(PyValueError::new_err(format!(
            "timeout must be >= 0, not {t}"
        ))),
    }
}

/// A [`topspin::Config`] with the defaults but for the options given.
fn config_of(
    max_message_size: Option<u32>,
    compression: Option<&str>,
) -> PyResult<topspin::Config> {
    let mut c = topspin::Config::default();
    if let Some(m) = max_message_size {
        c = c.with_max_message_size(m);
    }
    if let Some(name) = compression {
        let enc = Encoding::from_name(name).ok_or_else(|| {
            PyValueError::new_err(format!(
                "topspin: unknown compression {name:?} (expected \"zstd\" or \"gzip\")"
            ))
        })?;
        c = c.with_compression(Some(Compression::new(enc)));
    }
    Ok(c)
}

fn request<T>(msg: T, timeout: Option<Duration>, md: Metadata) -> Request<T> {
    let r = Request::new(msg);
    let r = if md.is_empty() {
        r
    } else {
        r.with_metadata(md)
    };
    match timeout {
        Some(t) => r.with_timeout(t),
        None => r,
    }
}

// ---------------------------------------------------------------------------------------------
// Completer: hands results from tokio threads to an asyncio loop.

enum Outcome {
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

struct CompleterInner {
    queue: Mutex<Vec<(Arc<Py<PyAny>>, Outcome)>>,
    wake: UnixStream,
    read: UnixStream,
}

impl CompleterInner {
    fn complete(&self, target: Arc<Py<PyAny>>, outcome: Outcome) {
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
struct Completer {
    inner: Arc<CompleterInner>,
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

fn reply_to_py(py: Python<'_>, r: Response<Bytes>, full: bool) -> PyResult<Py<PyAny>> {
    let body = bytes_to_py(py, r.get_ref())?;
    if !full {
        return Ok(body.into_any().unbind());
    }
    let h = md_to_py(py, r.metadata())?;
    let t = md_to_py(py, r.trailers())?;
    Ok(
        PyTuple::new(py, [body.into_any(), h.into_any(), t.into_any()])?
            .into_any()
            .unbind(),
    )
}

/// Cancels an asyncio call (drops its future: CANCEL on the wire).
#[pyclass(frozen, module = "topspin._native")]
struct Abort {
    handle: AbortHandle,
}

#[pymethods]
impl Abort {
    fn abort(&self) {
        self.handle.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// Streams of messages (responses on a client, requests on a server) and senders.

enum StreamState {
    Pending(JoinHandle<Result<Response<Streaming<Bytes>>, Status>>),
    Open(Streaming<Bytes>),
    Done,
}

struct StreamInner {
    state: tokio::sync::Mutex<StreamState>,
    headers: Mutex<Option<Metadata>>,
    trailers: Mutex<Option<Metadata>>,
    cancel: watch::Sender<bool>,
}

impl StreamInner {
    fn new(state: StreamState) -> Arc<StreamInner> {
        Arc::new(StreamInner {
            state: tokio::sync::Mutex::new(state),
            headers: Mutex::new(None),
            trailers: Mutex::new(None),
            cancel: watch::Sender::new(false),
        })
    }

    async fn next(self: Arc<Self>) -> Result<Option<Bytes>, Status> {
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

    async fn step(&self, st: &mut StreamState) -> Result<Option<Bytes>, Status> {
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
struct MessageStream {
    inner: Arc<StreamInner>,
    pid: u32,
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
struct Sender {
    tx: Mutex<Option<mpsc::Sender<Bytes>>>,
    pid: u32,
}

impl Sender {
    fn new(tx: mpsc::Sender<Bytes>) -> Sender {
        Sender {
            tx: Mutex::new(Some(tx)),
            pid: std::process::id(),
        }
    }
    fn get(&self) -> Option<mpsc::Sender<Bytes>> {
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

fn receiver_stream(rx: mpsc::Receiver<Bytes>) -> impl Stream<Item = Bytes> + Send + 'static {
    stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) })
}

const STREAM_QUEUE: usize = 16;

// ---------------------------------------------------------------------------------------------
// Client.

/// A connection to a server, bytes-level. Cheap to share between threads.
#[pyclass(frozen, module = "topspin._native")]
struct Channel {
    ch: topspin::Channel,
    pid: u32,
}

/// The task of a call with one response.
type UnaryCall = JoinHandle<Result<Response<Bytes>, Status>>;

/// A client-streaming call in progress.
#[pyclass(frozen, module = "topspin._native")]
struct PendingReply {
    jh: Mutex<Option<UnaryCall>>,
    abort: AbortHandle,
    pid: u32,
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

// ---------------------------------------------------------------------------------------------
// Server.

enum Reply {
    Unary(oneshot::Sender<Result<Response<Bytes>, Status>>),
    Stream(oneshot::Sender<Option<Status>>),
}

/// One call to a Python handler.
#[pyclass(frozen, module = "topspin._native")]
struct ServerCall {
    id: u64,
    metadata: Metadata,
    peer: Option<topspin::PeerAddr>,
    remaining: Option<f64>,
    cancellation: Option<topspin::Cancellation>,
    request: Mutex<Option<Bytes>>,
    requests: Option<Arc<StreamInner>>,
    sender: Option<Mutex<Option<mpsc::Sender<Bytes>>>>,
    /// A streaming response's headers, sent before its first message or at its end.
    headers: Mutex<Option<oneshot::Sender<Metadata>>>,
    reply: Mutex<Option<Reply>>,
}

impl ServerCall {
    fn new<T>(id: u64, req: &Request<T>, reply: Reply) -> ServerCall {
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
    /// Ends the call with a status.
    #[pyo3(signature = (code, message, details=None, trailers=None))]
    fn finish_err(
        &self,
        code: u16,
        message: &str,
        details: Option<&Bound<'_, PyAny>>,
        trailers: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = status_from_py(code, message, details, trailers)?;
        if let Some(tx) = lock(&self.headers).take() {
            let _ = tx.send(Metadata::new());
        }
        let reply = lock(&self.reply).take();
        match reply {
            Some(Reply::Unary(tx)) => {
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

/// Tells Python a call's handler future was dropped before it finished (cancellation).
struct CancelGuard {
    c: Arc<CompleterInner>,
    on_cancel: Arc<Py<PyAny>>,
    id: u64,
    armed: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if self.armed {
            self.c
                .complete(self.on_cancel.clone(), Outcome::Cancelled(self.id));
        }
    }
}

#[derive(Clone)]
struct Dispatch {
    c: Arc<CompleterInner>,
    on_call: Arc<Py<PyAny>>,
    on_cancel: Arc<Py<PyAny>>,
    ids: Arc<AtomicU64>,
}

impl Dispatch {
    fn guard(&self) -> CancelGuard {
        CancelGuard {
            c: self.c.clone(),
            on_cancel: self.on_cancel.clone(),
            id: self.ids.fetch_add(1, Ordering::Relaxed),
            armed: true,
        }
    }
}

fn response_stream(
    rx: mpsc::Receiver<Bytes>,
    end: oneshot::Receiver<Option<Status>>,
    guard: CancelGuard,
) -> impl Stream<Item = Result<Bytes, Status>> + Send + 'static {
    stream::unfold(
        (rx, Some(end), Some(guard)),
        |(mut rx, end, mut guard)| async move {
            if let Some(b) = rx.recv().await {
                return Some((Ok(b), (rx, end, guard)));
            }
            let end = end?;
            let r = end.await;
            if let Some(g) = guard.as_mut() {
                g.armed = false;
            }
            guard = None;
            match r {
                Ok(None) => None,
                Ok(Some(s)) => Some((Err(s), (rx, None, guard))),
                Err(_) => Some((
                    Err(Status::internal("the handler ended without a status")),
                    (rx, None, guard),
                )),
            }
        },
    )
}

/// A server whose handlers are Python callables, dispatched on an asyncio loop.
#[pyclass(frozen, module = "topspin._native")]
struct Server {
    builder: Mutex<Option<topspin::ServerBuilder>>,
    dispatch: Dispatch,
    shutdown: Mutex<Option<topspin::ShutdownHandle>>,
    address: Mutex<Option<String>>,
    count: Mutex<u32>,
}

#[pymethods]
impl Server {
    /// `on_call(method_index, call)` and `on_cancel(call_id)` run on the loop that drains
    /// `completer`.
    #[new]
    /// `ws_allow_origins` (pages of these origins besides the server's own) and
    /// `ws_allow_any_origin` (any page) widen which browser pages may open `ws://` and
    /// `wss://` calls (WebSocketSettings::allow_origins / allow_any_origin).
    #[pyo3(signature = (completer, on_call, on_cancel, max_message_size=None, compression=None,
        tls_cert_pem=None, tls_key_pem=None, tls_client_ca_pem=None, ws_allow_origins=None,
        ws_allow_any_origin=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        completer: &Completer,
        on_call: Py<PyAny>,
        on_cancel: Py<PyAny>,
        max_message_size: Option<u32>,
        compression: Option<&str>,
        tls_cert_pem: Option<PathBuf>,
        tls_key_pem: Option<PathBuf>,
        tls_client_ca_pem: Option<PathBuf>,
        ws_allow_origins: Option<Vec<String>>,
        ws_allow_any_origin: bool,
    ) -> PyResult<Server> {
        let bad = |e: &dyn std::fmt::Display| PyValueError::new_err(format!("topspin: {e}"));
        let mut b = topspin::Server::builder().config(config_of(max_message_size, compression)?);
        match (&tls_cert_pem, &tls_key_pem) {
            (Some(c), Some(k)) => {
                let mut tls = ServerTls::from_pem_files(c, k).map_err(|e| bad(&e))?;
                if let Some(ca) = &tls_client_ca_pem {
                    tls = tls.client_ca_pem_file(ca).map_err(|e| bad(&e))?;
                }
                b = b.tls(tls);
            }
            (None, None) if tls_client_ca_pem.is_none() => {}
            _ => return Err(bad(&"a TLS server needs both cert_pem and key_pem")),
        }
        if ws_allow_origins.is_some() || ws_allow_any_origin {
            let mut ws = topspin::ws::WebSocketSettings::default();
            if let Some(origins) = ws_allow_origins {
                ws = ws.allow_origins(origins);
            }
            if ws_allow_any_origin {
                ws = ws.allow_any_origin();
            }
            b = b.websocket(ws);
        }
        Ok(Server {
            builder: Mutex::new(Some(b)),
            dispatch: Dispatch {
                c: completer.inner.clone(),
                on_call: Arc::new(on_call),
                on_cancel: Arc::new(on_cancel),
                ids: Arc::new(AtomicU64::new(1)),
            },
            shutdown: Mutex::new(None),
            address: Mutex::new(None),
            count: Mutex::new(0),
        })
    }

    /// Registers `/pkg.Service/Method` of a kind ("unary", "server_streaming",
    /// "client_streaming", "streaming"); returns its index.
    fn add_method(&self, name: &str, kind: &str) -> PyResult<u32> {
        let mut g = lock(&self.builder);
        let Some(b) = g.take() else {
            return Err(PyRuntimeError::new_err("the server was already started"));
        };
        let mut n = lock(&self.count);
        let idx = *n;
        *n += 1;
        let d = self.dispatch.clone();
        let b = match kind {
            "unary" => b.unary(name, PbBytes, move |req: Request<Bytes>| {
                let d = d.clone();
                async move {
                    let mut guard = d.guard();
                    let (tx, rx) = oneshot::channel();
                    let mut call = ServerCall::new(guard.id, &req, Reply::Unary(tx));
                    *lock(&call.request) = Some(req.into_inner());
                    call.sender = None;
                    d.c.complete(d.on_call.clone(), Outcome::Call(idx, call));
                    let r = rx.await;
                    guard.armed = false;
                    r.unwrap_or_else(|_| Err(Status::internal("the handler ended without a reply")))
                }
            }),
            "client_streaming" => {
                b.client_streaming(name, PbBytes, move |req: Request<Streaming<Bytes>>| {
                    let d = d.clone();
                    async move {
                        let mut guard = d.guard();
                        let (tx, rx) = oneshot::channel();
                        let mut call = ServerCall::new(guard.id, &req, Reply::Unary(tx));
                        call.requests = Some(StreamInner::new(StreamState::Open(req.into_inner())));
                        d.c.complete(d.on_call.clone(), Outcome::Call(idx, call));
                        let r = rx.await;
                        guard.armed = false;
                        r.unwrap_or_else(|_| {
                            Err(Status::internal("the handler ended without a reply"))
                        })
                    }
                })
            }
            "server_streaming" => b.server_streaming(name, PbBytes, move |req: Request<Bytes>| {
                let d = d.clone();
                async move {
                    let guard = d.guard();
                    let (etx, erx) = oneshot::channel();
                    let (stx, srx) = mpsc::channel(STREAM_QUEUE);
                    let mut call = ServerCall::new(guard.id, &req, Reply::Stream(etx));
                    *lock(&call.request) = Some(req.into_inner());
                    call.sender = Some(Mutex::new(Some(stx)));
                    let (htx, hrx) = oneshot::channel();
                    call.headers = Mutex::new(Some(htx));
                    d.c.complete(d.on_call.clone(), Outcome::Call(idx, call));
                    // The headers go when the handler sends its first message or ends.
                    let headers = hrx.await.unwrap_or_default();
                    Ok(Response::new(response_stream(srx, erx, guard)).with_metadata(headers))
                }
            }),
            "streaming" => b.streaming(name, PbBytes, move |req: Request<Streaming<Bytes>>| {
                let d = d.clone();
                async move {
                    let guard = d.guard();
                    let (etx, erx) = oneshot::channel();
                    let (stx, srx) = mpsc::channel(STREAM_QUEUE);
                    let mut call = ServerCall::new(guard.id, &req, Reply::Stream(etx));
                    call.requests = Some(StreamInner::new(StreamState::Open(req.into_inner())));
                    call.sender = Some(Mutex::new(Some(stx)));
                    let (htx, hrx) = oneshot::channel();
                    call.headers = Mutex::new(Some(htx));
                    d.c.complete(d.on_call.clone(), Outcome::Call(idx, call));
                    // The headers go when the handler sends its first message or ends.
                    let headers = hrx.await.unwrap_or_default();
                    Ok(Response::new(response_stream(srx, erx, guard)).with_metadata(headers))
                }
            }),
            other => {
                *g = Some(b);
                return Err(PyValueError::new_err(format!(
                    "unknown call kind {other:?}"
                )));
            }
        };
        *g = Some(b);
        Ok(idx)
    }

    /// Binds and starts serving; returns the address bound (with the real port).
    fn start(&self, py: Python<'_>, address: String) -> PyResult<String> {
        let Some(b) = lock(&self.builder).take() else {
            return Err(PyRuntimeError::new_err("the server was already started"));
        };
        let rt = runtime()?;
        let server = wait(py, async move { b.bind(address.as_str()).await })?
            .map_err(|e| PyRuntimeError::new_err(format!("topspin: {e}")))?;
        let addr = server.local_addr().to_string();
        *lock(&self.shutdown) = Some(server.shutdown_handle());
        *lock(&self.address) = Some(addr.clone());
        rt.spawn(server.serve());
        Ok(addr)
    }

    /// Graceful shutdown: GOAWAY, calls in flight get `grace` seconds, then the rest end.
    /// Blocks (without the GIL) until every connection is closed.
    fn stop(&self, py: Python<'_>, grace: f64) -> PyResult<()> {
        let Some(h) = lock(&self.shutdown).clone() else {
            return Ok(());
        };
        let g = timeout_of(Some(grace))?.unwrap_or(Duration::ZERO);
        wait(py, async move { h.shutdown(g).await })
    }

    /// Graceful shutdown completing `fut` (for asyncio).
    fn stop_async(&self, completer: &Completer, fut: Py<PyAny>, grace: f64) -> PyResult<()> {
        let c = completer.inner.clone();
        let fut = Arc::new(fut);
        let h = lock(&self.shutdown).clone();
        let g = timeout_of(Some(grace))?.unwrap_or(Duration::ZERO);
        runtime()?.spawn(async move {
            if let Some(h) = h {
                h.shutdown(g).await;
            }
            c.complete(fut, Outcome::Unit);
        });
        Ok(())
    }
}

/// Parses .proto files (with protox, no protoc) into a serialized FileDescriptorSet with every
/// import and source info.
#[pyfunction]
fn parse_protos(
    py: Python<'_>,
    files: Vec<String>,
    includes: Vec<String>,
) -> PyResult<Py<PyBytes>> {
    let r = py.detach(|| gen::parse(&files, &includes));
    match r {
        Ok(b) => Ok(PyBytes::new(py, &b).unbind()),
        Err(e) => Err(PyValueError::new_err(e)),
    }
}

/// The Rust side of the `topspin` Python package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Channel>()?;
    m.add_class::<Completer>()?;
    m.add_class::<Abort>()?;
    m.add_class::<MessageStream>()?;
    m.add_class::<Sender>()?;
    m.add_class::<PendingReply>()?;
    m.add_class::<Server>()?;
    m.add_class::<ServerCall>()?;
    m.add_function(wrap_pyfunction!(parse_protos, m)?)?;
    Ok(())
}
