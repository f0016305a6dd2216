//! What callers hold of a client connection: where a call's results go ([`Sink`]), a call
//! about to start ([`CallStart`], [`Start`]), the commands queued to the connection's task
//! ([`Cmd`]), the counters the channel reads ([`ConnShared`]) and the handle itself
//! ([`ConnHandle`], with the direct start of a call under the driver's lock, [`Direct`]).

use super::UnaryReply;
use crate::connection::{Ack, Blocked, ReadRoute};
use crate::streaming::Item;
use crate::Status;
use bytestring::ByteString;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::Context;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use topspin_proto::Metadata;

/// Where a call's results go.
#[derive(Debug)]
pub(crate) enum Sink {
    /// One response message (unary and client-streaming calls).
    Unary(UnaryReply),
    /// A response stream: headers first, then items.
    Stream {
        headers: Option<oneshot::Sender<Result<Metadata, Status>>>,
        items: mpsc::UnboundedSender<Item>,
    },
}

impl Sink {
    pub(crate) fn fail(self, status: Status) {
        match self {
            Sink::Unary(tx) => {
                let _ = tx.send(Err(status));
            }
            Sink::Stream { headers, items } => match headers {
                Some(h) => {
                    let _ = h.send(Err(status));
                }
                None => {
                    let _ = items.send(Item::End(Err(status)));
                }
            },
        }
    }

    pub(crate) fn abandoned(&self) -> bool {
        match self {
            Sink::Unary(tx) => tx.is_closed(),
            Sink::Stream { headers, items } => {
                items.is_closed() && headers.as_ref().is_none_or(|h| h.is_closed())
            }
        }
    }
}

/// A call about to start: everything but where its results go.
#[derive(Debug)]
pub(crate) struct CallStart {
    pub(crate) token: u64,
    pub(crate) method: ByteString,
    pub(crate) codec: u8,
    /// When the application started the call plus its timeout: the deadline runs while the
    /// call waits in queues too.
    pub(crate) deadline: Option<Instant>,
    pub(crate) metadata: Metadata,
    /// The one request message (unary and server streaming, sent with END_STREAM), or none
    /// (a request stream follows).
    pub(crate) message: Option<crate::codec::Payload>,
}

impl CallStart {
    /// The call with where its results go.
    pub(crate) fn into_start(self, sink: Sink) -> Start {
        Start {
            call: self,
            sink,
            early: None,
        }
    }
}

/// A request to start a call.
#[derive(Debug)]
pub(crate) struct Start {
    pub(super) call: CallStart,
    pub(super) sink: Sink,
    pub(super) early: Option<Box<Early>>,
}

impl Start {
    /// The call and where its results go (for the gRPC connection task, `grpc.rs`).
    pub(crate) fn into_parts(self) -> (CallStart, Sink) {
        (self.call, self.sink)
    }
}

#[derive(Debug)]
pub(crate) enum Cmd {
    Start(Start),
    /// Several calls written together.
    Batch(Vec<Start>),
    Send {
        token: u64,
        message: crate::codec::Payload,
        ack: Ack,
    },
    HalfClose {
        token: u64,
    },
    Cancel {
        token: u64,
        /// The call's id, when its caller knows it (a unary call started directly): no
        /// token look-up then.
        id: Option<u32>,
    },
    Credit {
        token: u64,
        bytes: u32,
    },
}

impl Cmd {
    /// Fails whatever waits on this command.
    pub(super) fn fail(self, status: &Status) {
        match self {
            Cmd::Start(s) => s.sink.fail(status.clone()),
            Cmd::Batch(v) => v.into_iter().for_each(|s| s.sink.fail(status.clone())),
            Cmd::Send { ack, .. } => {
                let _ = ack.send(Err(status.clone()));
            }
            Cmd::HalfClose { .. } | Cmd::Cancel { .. } | Cmd::Credit { .. } => {}
        }
    }
}

/// Shared between a connection task and the channel.
#[derive(Debug, Default)]
pub(crate) struct ConnShared {
    /// The server sent GOAWAY or the connection closed: new calls go to a new connection.
    pub(crate) unusable: AtomicBool,
    /// Calls open or waiting on this connection as of the connection task's last turn: the
    /// load a balancer compares (written only when it changes, relaxed).
    pub(crate) open: AtomicU32,
    /// Calls a balancer sent here since the connection task last took its queue (it clears
    /// this then): with `open`, the load before the task has run.
    pub(crate) queued: AtomicU32,
    /// Calls in a row that ended `UNAVAILABLE` on this connection (a balancer ejects the
    /// endpoint past a threshold; reset by any other outcome).
    pub(crate) failures: AtomicU32,
    /// Notified when the connection becomes unusable.
    pub(crate) gone: tokio::sync::Notify,
}

impl ConnShared {
    /// No new call goes to this connection; whoever keeps it (a balancer) is told.
    pub(crate) fn mark_unusable(&self) {
        self.unusable.store(true, Ordering::Release);
        // One permit at most is stored: the keeper waiting for this connection's end.
        self.gone.notify_one();
    }
}

/// A live connection as the channel sees it: one reference count to clone and drop per call
/// (its parts are reached through `Deref`).
#[derive(Clone, Debug)]
pub(crate) struct ConnHandle(Arc<ConnParts>);

impl ConnHandle {
    pub(crate) fn new(
        tx: mpsc::Sender<Cmd>,
        shared: Arc<ConnShared>,
        direct: Option<Direct>,
    ) -> ConnHandle {
        ConnHandle(Arc::new(ConnParts { tx, shared, direct }))
    }
}

impl std::ops::Deref for ConnHandle {
    type Target = ConnParts;
    fn deref(&self) -> &ConnParts {
        &self.0
    }
}

/// What a [`ConnHandle`] reaches.
#[derive(Debug)]
pub(crate) struct ConnParts {
    pub(crate) tx: mpsc::Sender<Cmd>,
    pub(crate) shared: Arc<ConnShared>,
    /// Starts a call without the command queue while the connection is quiet (`None`: the
    /// gRPC face, which always queues).
    pub(crate) direct: Option<Direct>,
}

impl ConnParts {
    pub(crate) fn usable(&self) -> bool {
        !self.tx.is_closed() && !self.shared.unusable.load(Ordering::Acquire)
    }

    /// Starts the call `s` on the caller's thread if the connection is quiet (see
    /// [`Driver::act_outside`]); otherwise gives it back, to be queued. `Ok(Some((id,
    /// written)))`: a unary call now open under `id` (its guard cancels it by id), `written`
    /// at once on this thread (the connection was idle: its caller may read the reply too).
    #[allow(clippy::result_large_err)] // the call itself, moved back to its caller's stack
    pub(crate) fn start_direct(&self, s: Start) -> Result<Option<(u32, bool)>, Start> {
        let Some(d) = &self.direct else {
            return Err(s);
        };
        let mut slot = Some(s);
        let id = d.0.try_start(&mut slot);
        slot.map_or(Ok(id), Err)
    }

    /// The caller of the connection's only call reads its reply itself, if the connection is
    /// quiet and its task not running (see [`Driver::read_inline`]); `false` if it may not
    /// (it then waits to be woken with the reply). `first`: the first try for this call.
    pub(crate) fn read_inline(
        &self,
        cx: &mut Context<'_>,
        first: bool,
        waiting: &dyn Fn() -> bool,
    ) -> bool {
        let Some(d) = &self.direct else {
            return false;
        };
        if d.0.read_inline(cx, first, waiting) {
            return true;
        }
        d.1.clear();
        false
    }

    /// The caller no longer reads for itself (its call is over, or gone): what it was woken
    /// for and did not read goes to the task.
    pub(crate) fn read_done(&self) {
        if let Some(d) = &self.direct {
            d.1.clear();
        }
    }
}

/// A connection's driver as its handles see it (any transport).
#[derive(Clone)]
pub(crate) struct Direct(pub(super) Arc<dyn StartDirect>, pub(super) Arc<ReadRoute>);

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Direct")
    }
}

pub(crate) trait StartDirect: Send + Sync {
    /// See [`ConnHandle::start_direct`]: takes the call out of `s` if it starts it.
    fn try_start(&self, s: &mut Option<Start>) -> Option<(u32, bool)>;
    /// See [`ConnParts::read_inline`].
    fn read_inline(&self, cx: &mut Context<'_>, first: bool, waiting: &dyn Fn() -> bool) -> bool;
}

/// Requests of a streaming call that arrived while the call waited for the server's
/// concurrency limit.
#[derive(Debug, Default)]
pub(crate) struct Early {
    pub(crate) send: Option<Blocked>,
    pub(crate) half_close: bool,
}
