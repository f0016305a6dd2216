//! Per-call state kept by a connection.

use bytes::{Bytes, BytesMut};
use std::time::Instant;

/// The rest of a message being sent in several frames.
#[derive(Debug)]
pub(crate) struct PendingSend {
    pub(crate) message: Bytes,
    pub(crate) offset: usize,
}

/// A split message being received.
#[derive(Debug)]
pub(crate) struct Assembly {
    pub(crate) buf: BytesMut,
    pub(crate) total: usize,
    pub(crate) end_stream: bool,
    /// Wire cost of its frames so far that the connection has not yet given back.
    pub(crate) owed: u64,
}

#[derive(Debug)]
pub(crate) struct CallState {
    /// Our credit for sending on this call (may be negative: overdraft).
    pub(crate) send_credit: i64,
    /// The peer's credit as we count it.
    pub(crate) recv_window: i64,
    /// Credit the application gave back that is not yet sent.
    pub(crate) grant_pending: u64,
    /// Boxed: only messages larger than a frame (16 MiB by default) need these, and keeping
    /// them out of line halves the state moved on every call's insert and removal.
    pub(crate) pending: Option<Box<PendingSend>>,
    pub(crate) assembling: Option<Box<Assembly>>,
    /// Client: half-closed. Server: unused (END removes the call).
    pub(crate) send_closed: bool,
    /// Server: the client half-closed.
    pub(crate) recv_closed: bool,
    /// Response headers sent (server) or received (client), or a response message went by.
    pub(crate) headers_done: bool,
    pub(crate) writable_wanted: bool,
    pub(crate) deadline: Option<Instant>,
}

impl CallState {
    pub(crate) fn new(send_credit: u32, recv_window: u32, deadline: Option<Instant>) -> CallState {
        CallState {
            send_credit: i64::from(send_credit),
            recv_window: i64::from(recv_window),
            grant_pending: 0,
            pending: None,
            assembling: None,
            send_closed: false,
            recv_closed: false,
            headers_done: false,
            writable_wanted: false,
            deadline,
        }
    }
}
