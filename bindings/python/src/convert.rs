//! Python <-> Rust values: message bytes, metadata, statuses (`topspin.StatusError`),
//! timeouts, configuration, requests and replies.

use bytes::Bytes;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use std::time::Duration;
use topspin::{Code, Compression, Encoding, Metadata, Request, Response, Status};

/// Request bytes from Python: large `bytes` are shared without a copy.
pub(crate) fn to_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
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
pub(crate) fn bytes_to_py<'py>(py: Python<'py>, b: &Bytes) -> PyResult<Bound<'py, PyBytes>> {
    if b.len() < 64 * 1024 {
        return Ok(PyBytes::new(py, b));
    }
    PyBytes::new_with(py, b.len(), |buf| {
        py.detach(|| buf.copy_from_slice(b));
        Ok(())
    })
}

pub(crate) fn md_from_py(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Metadata> {
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

pub(crate) fn md_to_py<'py>(py: Python<'py>, md: &Metadata) -> PyResult<Bound<'py, PyList>> {
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
pub(crate) fn status_err(py: Python<'_>, s: &Status) -> PyErr {
    let r = (|| -> PyResult<PyErr> {
        let f = MAKE_ERROR.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            Ok(py.import("topspin._errors")?.getattr("_make")?.unbind())
        })?;
        let e = f.bind(py).call1((
            s.code().as_u16(),
            s.message(),
            PyBytes::new(py, s.details()),
            md_to_py(py, s.metadata())?,
            md_to_py(py, s.headers())?,
        ))?;
        Ok(PyErr::from_value(e))
    })();
    r.unwrap_or_else(|e| e)
}

pub(crate) fn status_from_py(
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

pub(crate) fn timeout_of(t: Option<f64>) -> PyResult<Option<Duration>> {
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
pub(crate) fn config_of(
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

pub(crate) fn request<T>(msg: T, timeout: Option<Duration>, md: Metadata) -> Request<T> {
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

pub(crate) fn reply_to_py(py: Python<'_>, r: Response<Bytes>, full: bool) -> PyResult<Py<PyAny>> {
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
