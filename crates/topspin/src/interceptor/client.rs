//! The client's interceptors and spans. `client/call.rs` takes this path instead of its own
//! when a call has an interceptor or a subscriber wants spans: the interceptors run before the
//! call is queued (a rejection sends nothing), and the call's end is recorded — for a unary
//! or client-streaming call where its reply is awaited (`call::reply`), for a response stream
//! by a small task that passes its items on.

use super::{CallInfo, Chain, Record, Side};
use crate::client::call::{begin_later, begin_now, CallGuard};
use crate::client::conn::{CallStart, ConnHandle, Sink};
use crate::client::pool::Pool;
use crate::streaming::Item;
use crate::{Response, Status};
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

/// Whether a call of `method` takes this path.
pub(crate) fn wanted(chain: &Chain, method: &str) -> bool {
    (!chain.is_empty() && chain.any_for(method)) || crate::observe::span_wanted()
}

/// Runs the interceptors, then starts the call like `call::begin`.
pub(crate) async fn begin(
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
pub(crate) fn reply(mut rec: Box<Record>, r: &Option<Result<Response<Bytes>, Status>>) {
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
                Some(Item::Message(m, credit)) => {
                    rec.response_bytes += m.len() as u64;
                    let _ = items.send(Item::Message(m, credit));
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
