//! The server: [`Server`], whose handlers are Python callables dispatched on an asyncio loop.

use bytes::Bytes;
use futures_util::stream::{self, Stream};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use topspin::tls::ServerTls;
use topspin::ServerBuilder;
use topspin::{Request, Response, Status, Streaming};

use crate::completer::{Completer, CompleterInner, Outcome};
use crate::convert::{config_of, timeout_of};
use crate::health::{reflection, Health};
use crate::runtime::{lock, runtime, wait};
use crate::server_call::{Reply, ServerCall};
use crate::streams::{StreamInner, StreamState, STREAM_QUEUE};
use crate::PbBytes;

/// Tells Python a call's handler future was dropped before it finished (cancellation).
pub(crate) struct CancelGuard {
    pub(crate) c: Arc<CompleterInner>,
    pub(crate) on_cancel: Arc<Py<PyAny>>,
    pub(crate) id: u64,
    pub(crate) armed: bool,
    /// The request's charge to the memory budget while Python holds it.
    pub(crate) held: Option<Held>,
}

/// Requests from this size on are charged to the memory budget while their handler runs (as
/// the Rust server charges a message it receives past one 64 KiB read).
const HELD_FROM: usize = 64 * 1024;

/// A request message's charge to the server's memory budget while its Python handler runs:
/// twice its size, for the `bytes` Python gets (a copy: the runtime's buffer, and its own
/// charge, go once Python has it) and the message parsed from them. Released when the call
/// ends. So what Python handlers hold of their requests stays within the budget, as Rust
/// handlers' do: a call that finds no room is refused `RESOURCE_EXHAUSTED` before Python sees
/// it.
pub(crate) struct Held {
    budget: Arc<topspin::MemoryBudget>,
    bytes: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
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
pub(crate) struct Dispatch {
    pub(crate) c: Arc<CompleterInner>,
    pub(crate) on_call: Arc<Py<PyAny>>,
    pub(crate) on_cancel: Arc<Py<PyAny>>,
    pub(crate) ids: Arc<AtomicU64>,
    /// The server's memory budget (`Config::memory_budget`).
    pub(crate) budget: Arc<topspin::MemoryBudget>,
}

impl Dispatch {
    pub(crate) fn guard(&self) -> CancelGuard {
        CancelGuard {
            c: self.c.clone(),
            on_cancel: self.on_cancel.clone(),
            id: self.ids.fetch_add(1, Ordering::Relaxed),
            armed: true,
            held: None,
        }
    }

    /// Charges a request of `len` bytes to the budget for its handler ([`Held`]).
    fn hold(&self, len: usize) -> Result<Option<Held>, Status> {
        if len < HELD_FROM {
            return Ok(None);
        }
        let bytes = len.saturating_mul(2);
        if !self.budget.try_reserve(bytes) {
            return Err(Status::resource_exhausted(format!(
                "no room in the server's memory budget for a request of {len} bytes to a \
                 Python handler (it is charged twice its size while the handler runs: \
                 memory_budget)"
            )));
        }
        Ok(Some(Held {
            budget: self.budget.clone(),
            bytes,
        }))
    }
}

pub(crate) fn response_stream(
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
pub(crate) struct Server {
    pub(crate) builder: Mutex<Option<topspin::ServerBuilder>>,
    pub(crate) dispatch: Dispatch,
    pub(crate) shutdown: Mutex<Option<topspin::ShutdownHandle>>,
    pub(crate) address: Mutex<Option<String>>,
    pub(crate) count: Mutex<u32>,
}

#[pymethods]
impl Server {
    /// `on_call(method_index, call)` and `on_cancel(call_id)` run on the loop that drains
    /// `completer`.
    #[new]
    /// `ws_allow_origins` (pages of these origins besides the server's own) and
    /// `ws_allow_any_origin` (any page) widen which browser pages may open `ws://` and
    /// `wss://` calls (WebSocketSettings::allow_origins / allow_any_origin).
    /// `memory_budget` (bytes; default: the process's, 1 GiB) bounds what received messages
    /// may hold, Python handlers' requests included (`Config::memory_budget`).
    #[pyo3(signature = (completer, on_call, on_cancel, max_message_size=None, compression=None,
        tls_cert_pem=None, tls_key_pem=None, tls_client_ca_pem=None, ws_allow_origins=None,
        ws_allow_any_origin=false, memory_budget=None))]
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
        memory_budget: Option<usize>,
    ) -> PyResult<Server> {
        let bad = |e: &dyn std::fmt::Display| PyValueError::new_err(format!("topspin: {e}"));
        let mut config = config_of(max_message_size, compression)?;
        if let Some(n) = memory_budget {
            config = config.with_memory_budget(topspin::MemoryBudget::new(n));
        }
        let budget = config.memory_budget();
        let mut b = topspin::Server::builder().config(config);
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
                budget,
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
            "unary" => add_unary(b, name, d, idx),
            "client_streaming" => add_client_streaming(b, name, d, idx),
            "server_streaming" => add_server_streaming(b, name, d, idx),
            "streaming" => add_streaming(b, name, d, idx),
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

    /// Serves `grpc.health.v1.Health` (`Check`, `Watch`) from `health`'s table, on both faces.
    /// Its statuses turn `NOT_SERVING` when the server begins a graceful shutdown.
    fn add_health(&self, health: &Health) -> PyResult<()> {
        self.add_service(health.service.clone())
    }

    /// Serves reflection (`topspin.reflection.v1`, gRPC's `grpc.reflection.v1` and `v1alpha`)
    /// describing the files of these encoded `FileDescriptorSet`s.
    fn add_reflection(&self, file_descriptor_sets: Vec<Bound<'_, PyBytes>>) -> PyResult<()> {
        self.add_service(reflection(&file_descriptor_sets)?)
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

impl Server {
    /// Adds a Rust service to the builder (before `start`).
    fn add_service(&self, service: impl topspin::Service) -> PyResult<()> {
        let mut g = lock(&self.builder);
        let Some(b) = g.take() else {
            return Err(PyRuntimeError::new_err("the server was already started"));
        };
        *g = Some(b.add_service(service));
        Ok(())
    }
}

// The handlers of the four kinds: each hands its call to Python (`on_call(idx, call)` on the
// loop) and waits for the reply, or returns the stream of responses that Python feeds.

fn add_unary(b: ServerBuilder, name: &str, d: Dispatch, idx: u32) -> ServerBuilder {
    b.unary(name, PbBytes, move |req: Request<Bytes>| {
        let d = d.clone();
        async move {
            let held = d.hold(req.get_ref().len())?;
            let mut guard = d.guard();
            guard.held = held;
            let (tx, rx) = oneshot::channel();
            let mut call = ServerCall::new(guard.id, &req, Reply::Unary(tx));
            *lock(&call.request) = Some(req.into_inner());
            call.sender = None;
            d.c.complete(d.on_call.clone(), Outcome::Call(idx, call));
            let r = rx.await;
            guard.armed = false;
            r.unwrap_or_else(|_| Err(Status::internal("the handler ended without a reply")))
        }
    })
}

fn add_client_streaming(b: ServerBuilder, name: &str, d: Dispatch, idx: u32) -> ServerBuilder {
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
            r.unwrap_or_else(|_| Err(Status::internal("the handler ended without a reply")))
        }
    })
}

fn add_server_streaming(b: ServerBuilder, name: &str, d: Dispatch, idx: u32) -> ServerBuilder {
    b.server_streaming(name, PbBytes, move |req: Request<Bytes>| {
        let d = d.clone();
        async move {
            let held = d.hold(req.get_ref().len())?;
            let mut guard = d.guard();
            guard.held = held;
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
    })
}

fn add_streaming(b: ServerBuilder, name: &str, d: Dispatch, idx: u32) -> ServerBuilder {
    b.streaming(name, PbBytes, move |req: Request<Streaming<Bytes>>| {
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
    })
}
