//! The one call path every call kind goes through, at the level of bytes: pick a connection,
//! queue the call's start (waiting for room, within the call's deadline), and guard it so that
//! dropping the caller's future or stream cancels it. The typed API in `mod.rs`, the CLI and
//! the language bindings all sit on this.

use super::conn::{send_now, CallStart, Cmd, ConnHandle, Sink};
use super::pool::{Pending, Pool};
use crate::codec::Codec;
use crate::interceptor::{CallInfo, Chain, Record, Side};
use crate::streaming::CreditReturn;
use crate::streaming::Item;
use crate::{Response, Status};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use std::future::Future;
use std::time::Instant;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};
use topspin_proto::Metadata;

/// Cancels a call when its future or stream is dropped before the end.
pub(crate) struct CallGuard {
    conn: Option<ConnHandle>,
    token: u64,
    /// The call's id on its connection, when known (a unary call started directly).
    id: Option<u32>,
    /// The call was written by its caller on an idle connection: the caller may read the
    /// reply as well ([`crate::connection::Driver::read_inline`]).
    wrote_idle: bool,
    /// Interceptors and span of an observed unary-response call (`crate::interceptor`).
    pub(crate) obs: Option<Box<Record>>,
}

impl CallGuard {
    pub(crate) fn new(h: &ConnHandle, token: u64) -> CallGuard {
        CallGuard {
            conn: Some(h.clone()),
            token,
            id: None,
            wrote_idle: false,
            obs: None,
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.conn = None;
    }

    /// Whether its caller wrote the call on an idle connection (and may read the reply).
    pub(crate) fn wrote_idle(&self) -> bool {
        self.wrote_idle
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            send_now(
                &conn.tx,
                Cmd::Cancel {
                    token: self.token,
                    id: self.id,
                },
            );
        }
    }
}

/// Gives a response stream's consumed credit back to its connection.
pub(crate) struct ClientCredit {
    pub(crate) tx: mpsc::Sender<Cmd>,
    pub(crate) token: u64,
}

impl CreditReturn for ClientCredit {
    fn give_back(&self, credit: u32) {
        send_now(
            &self.tx,
            Cmd::Credit {
                token: self.token,
                bytes: credit,
            },
        );
    }
    fn abandon(&self) {
        send_now(
            &self.tx,
            Cmd::Cancel {
                token: self.token,
                id: None,
            },
        );
    }
}

fn not_sent() -> Status {
    super::conn::not_sent("the connection closed")
}

/// Queues a command, waiting for room while the connection's queue is full (backpressure) — at
/// most until `deadline`.
pub(crate) async fn queue(
    h: &ConnHandle,
    cmd: Cmd,
    deadline: Option<Instant>,
) -> Result<(), Status> {
    match h.tx.try_send(cmd) {
        Ok(()) => Ok(()),
        Err(TrySendError::Closed(_)) => Err(not_sent()),
        // Waiting is rare and its future is large: boxed, it stays out of every call's future.
        Err(TrySendError::Full(cmd)) => Box::pin(wait_for_room(h, cmd, deadline)).await,
    }
}

async fn wait_for_room(h: &ConnHandle, cmd: Cmd, deadline: Option<Instant>) -> Result<(), Status> {
    let send = h.tx.send(cmd);
    let sent = match deadline {
        None => send.await,
        Some(d) => tokio::time::timeout_at(d.into(), send).await.map_err(|_| {
            Status::deadline_exceeded(
                "the deadline passed while the call waited for room in its connection's queue",
            )
        })?,
    };
    sent.map_err(|_| not_sent())
}

/// What keeps a call from starting at once.
pub(crate) enum Slow {
    /// The pooled connection is not up: (re)connect first.
    Connect {
        slot: Pending,
        call: CallStart,
        sink: Sink,
    },
    /// The connection's queue is full: wait for room.
    Room {
        h: ConnHandle,
        guard: CallGuard,
        cmd: Cmd,
        deadline: Option<Instant>,
    },
    Failed(Status),
    /// Interceptors to run or a span to keep first (`observed_begin`).
    Observed {
        call: CallStart,
        sink: Sink,
    },
}

/// Starts a call on the channel's next connection; returns the connection and the call's guard.
///
/// The common case — a live connection with room in its queue — happens synchronously when the
/// call's future is first polled, and the future keeps only a small result; connecting and
/// waiting for room are rare and run in a boxed future of their own.
pub(crate) fn begin(
    pool: &Pool,
    call: CallStart,
    sink: Sink,
) -> impl Future<Output = Result<(ConnHandle, CallGuard), Status>> + '_ {
    let first = if observed_wanted(&pool.endpoint.interceptors, &call.method) {
        Err(Box::new(Slow::Observed { call, sink }))
    } else {
        begin_now(pool, call, sink)
    };
    async move {
        match first {
            Ok(started) => Ok(started),
            Err(slow) => Box::pin(begin_later(pool, *slow)).await,
        }
    }
}

pub(crate) fn begin_now(
    pool: &Pool,
    call: CallStart,
    sink: Sink,
) -> Result<(ConnHandle, CallGuard), Box<Slow>> {
    let h = match pool.pick_now() {
        Ok(h) => h,
        Err(slot) => return Err(Box::new(Slow::Connect { slot, call, sink })),
    };
    let mut guard = CallGuard::new(&h, call.token);
    let deadline = call.deadline;
    // A quiet connection: the call is written from here, without the queue.
    let start = match h.start_direct(call.into_start(sink)) {
        Ok(id) => {
            if let Some((id, wrote_idle)) = id {
                guard.id = Some(id);
                guard.wrote_idle = wrote_idle;
            }
            return Ok((h, guard));
        }
        Err(start) => start,
    };
    match h.tx.try_send(Cmd::Start(start)) {
        Ok(()) => Ok((h, guard)),
        Err(TrySendError::Full(cmd)) => Err(Box::new(Slow::Room {
            h,
            guard,
            cmd,
            deadline,
        })),
        Err(TrySendError::Closed(_)) => {
            guard.disarm();
            Err(Box::new(Slow::Failed(not_sent())))
        }
    }
}

pub(crate) async fn begin_later(
    pool: &Pool,
    slow: Slow,
) -> Result<(ConnHandle, CallGuard), Status> {
    match slow {
        Slow::Connect { slot, call, sink } => {
            let deadline = call.deadline;
            let h = pool.conn_within(slot, deadline).await?;
            let guard = CallGuard::new(&h, call.token);
            queue(&h, Cmd::Start(call.into_start(sink)), deadline).await?;
            Ok((h, guard))
        }
        Slow::Room {
            h,
            guard,
            cmd,
            deadline,
        } => {
            wait_for_room(&h, cmd, deadline).await?;
            Ok((h, guard))
        }
        Slow::Failed(status) => Err(status),
        Slow::Observed { call, sink } => observed_begin(pool, call, sink).await,
    }
}

/// Waits for a call's one response and decodes it; the call is no longer cancelled on drop once
/// its answer has arrived.
pub(crate) async fn reply<C: Codec>(
    codec: &C,
    rx: super::completion::Waiter<Result<Response<Bytes>, Status>>,
    mut guard: CallGuard,
    room: impl FnOnce() -> crate::compression::Room,
) -> Result<Response<C::Decode>, Status> {
    let r = rx.await;
    guard.disarm();
    if let Some(obs) = guard.obs.take() {
        observed_reply(obs, &r);
    }
    let resp = r.ok_or_else(|| Status::unavailable("the connection task ended"))??;
    let (m, md, tr) = resp.into_parts();
    let m = crate::compression::response_message(&md, m, room)?;
    Ok(Response::from_parts(codec.decode(m)?, md, tr))
}

/// Waits for a streaming call's response headers (or its first message, or its end).
pub(crate) async fn headers(
    rx: oneshot::Receiver<Result<Metadata, Status>>,
    mut guard: CallGuard,
) -> Result<Metadata, Status> {
    let headers = rx
        .await
        .map_err(|_| Status::unavailable("the connection task ended"))??;
    guard.disarm();
    Ok(headers)
}

/// Feeds a request stream into a call, waiting for flow-control credit before each message.
pub(crate) fn pump<C: Codec, S>(codec: C, tx: mpsc::Sender<Cmd>, token: u64, mut requests: S)
where
    S: Stream<Item = C::Encode> + Send + Unpin + 'static,
{
    tokio::spawn(async move {
        while let Some(item) = requests.next().await {
            let message = match codec.encode_payload(item) {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(
                        "request stream item failed to encode: {e}; cancelling the call"
                    );
                    let _ = tx.send(Cmd::Cancel { token, id: None }).await;
                    return;
                }
            };
            let (ack, done) = oneshot::channel();
            let cmd = Cmd::Send {
                token,
                message,
                ack,
            };
            if tx.send(cmd).await.is_err() {
                return;
            }
            match done.await {
                Ok(Ok(())) => {}
                _ => return, // the call is over
            }
        }
        let _ = tx.send(Cmd::HalfClose { token }).await;
    });
}

// ---------------------------------------------------------------------------------------------
// The observed path: taken instead of the plain one when a call has an interceptor or a
// subscriber wants spans. The interceptors run before the call is queued (a rejection sends
// nothing), and the call's end is recorded — for a unary or client-streaming call where its
// reply is awaited (`observed_reply`), for a response stream by a small task that passes its
// items on.

/// Whether a call of `method` takes this path.
pub(crate) fn observed_wanted(chain: &Chain, method: &str) -> bool {
    (!chain.is_empty() && chain.any_for(method)) || crate::observe::span_wanted()
}

/// Runs the interceptors, then starts the call like `begin`.
async fn observed_begin(
    pool: &Pool,
    mut call: CallStart,
    sink: Sink,
) -> Result<(ConnHandle, CallGuard), Status> {
    let endpoint = &pool.endpoint;
    let span = crate::observe::call_span(Side::Client, &call.method, &endpoint.address, call.token);
    let info = CallInfo::new(
        Side::Client,
        call.method.clone(),
        call.metadata.clone(),
        None,
        call.deadline,
        call.token,
    );
    let mut rec = Box::new(Record::new(endpoint.interceptors.clone(), info, span));
    rec.request_bytes = call.message.as_ref().map_or(0, |m| m.len() as u64);
    if let Some(i) = rec.start_sync()? {
        rec.start_from(i, call.deadline).await?;
    }
    call.metadata = rec.info.metadata().clone();
    #[cfg(feature = "otel")]
    if let Some(span) = &rec.span {
        crate::observe::otel::inject(span, &mut call.metadata);
    }
    let (sink, mut rec) = match sink {
        Sink::Stream { headers, items } => (forward(rec, headers, items), None),
        unary => (unary, Some(rec)),
    };
    let started = match begin_now(pool, call, sink) {
        Ok(started) => Ok(started),
        Err(slow) => Box::pin(begin_later(pool, *slow)).await,
    };
    match started {
        Ok((h, mut guard)) => {
            guard.obs = rec;
            Ok((h, guard))
        }
        Err(status) => {
            if let Some(rec) = &mut rec {
                rec.finish(&status);
            }
            Err(status)
        }
    }
}

/// A unary reply arrived (`None`: the connection task ended).
pub(crate) fn observed_reply(mut rec: Box<Record>, r: &Option<Result<Response<Bytes>, Status>>) {
    match r {
        Some(Ok(resp)) => {
            rec.response_bytes = resp.get_ref().len() as u64;
            rec.finish(&Status::ok());
        }
        Some(Err(status)) => rec.finish(status),
        None => rec.finish(&Status::unavailable("the connection task ended")),
    }
}

/// A response stream's sink that passes everything on to `headers` and `items`, recording the
/// call's end on the way.
fn forward(
    mut rec: Box<Record>,
    headers: Option<oneshot::Sender<Result<crate::Metadata, Status>>>,
    items: mpsc::UnboundedSender<Item>,
) -> Sink {
    let (htx, mut hrx) = oneshot::channel();
    // Bounded by flow control like the stream it feeds: items pass straight through, and the
    // server sends at most a window ahead of what the application has consumed.
    let (itx, mut irx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        if let Some(mut out) = headers {
            let r = tokio::select! {
                r = &mut hrx => r,
                _ = out.closed() => return, // the caller went away: cancelled
            };
            match r {
                Ok(Ok(md)) => {
                    let _ = out.send(Ok(md));
                }
                Ok(Err(status)) => {
                    rec.finish(&status);
                    let _ = out.send(Err(status));
                    return;
                }
                Err(_) => {
                    rec.finish(&Status::unavailable("the connection task ended"));
                    return;
                }
            }
        }
        loop {
            let item = tokio::select! {
                item = irx.recv() => item,
                _ = items.closed() => return,
            };
            match item {
                Some(Item::Message(m, credit, compressed)) => {
                    rec.response_bytes += m.len() as u64;
                    let _ = items.send(Item::Message(m, credit, compressed));
                }
                Some(Item::End(r)) => {
                    match &r {
                        Ok(_) => rec.finish(&Status::ok()),
                        Err(status) => rec.finish(status),
                    }
                    let _ = items.send(Item::End(r));
                    return;
                }
                None => {
                    let status = Status::unavailable("the connection task ended");
                    rec.finish(&status);
                    let _ = items.send(Item::End(Err(status)));
                    return;
                }
            }
        }
    });
    Sink::Stream {
        headers: Some(htx),
        items: itx,
    }
}
