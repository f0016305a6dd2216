//! `topspin._native`: the Rust side of the Python binding.
//!
//! Bytes-level calls over `topspin::Channel` and a `topspin::Server` whose handlers are Python
//! callables. One multi-thread tokio runtime per process, created lazily (and again in a forked
//! child). Tokio threads never take the GIL: results for asyncio go through a [`Completer`], a
//! queue plus a socket the event loop watches (`loop.add_reader`), and the loop thread sets the
//! futures' results. Sync calls release the GIL while they wait and check for signals (Ctrl-C)
//! every 50 ms.

#![warn(clippy::too_many_lines)]

use bytes::Bytes;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use topspin::codec::Codec;
use topspin::Status;

use crate::channel::{Abort, Channel, PendingReply};
use crate::completer::Completer;
use crate::server::Server;
use crate::server_call::ServerCall;
use crate::streams::{MessageStream, Sender};

mod channel;
mod completer;
mod convert;
mod gen;
mod health;
mod runtime;
mod server;
mod server_call;
mod streams;

/// Bytes in, bytes out, announced as protobuf on the wire (the messages are protobuf, encoded
/// by Python's `protobuf`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PbBytes;

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
    m.add_class::<health::Health>()?;
    m.add(
        "HEALTH_FILE_DESCRIPTOR_SET",
        PyBytes::new(m.py(), health::health_file_descriptor_set()),
    )?;
    m.add_function(wrap_pyfunction!(parse_protos, m)?)?;
    Ok(())
}
