//! The server's interceptors and spans: every registered handler is wrapped once, when the
//! server is bound, in an [`Observed`] handler that runs the method's interceptors before the
//! handler and records how its call ended. With no interceptor for the method and no
//! subscriber interested in spans, it hands the call straight to the handler.

use super::{CallInfo, Chain, Record, Side};
use crate::request::ServerContext;
use crate::server::handler::{place, BoxFut, CallKind, Handler, HandlerRef, Input, IoRef, Outcome};
use crate::streaming::CreditReturn;
use crate::Status;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use topspin_proto::Metadata;

/// A handler with its method's interceptors.
pub(crate) struct Observed {
    inner: HandlerRef,
    /// The interceptors that apply to this method (filtered once, at bind time).
    chain: Chain,
    /// Boxes of finished handler futures of observed calls, reused (the connection reuses
    /// the outer box).
    pool: Pool,
    /// Whether this method's first polls may run on the connection's task.
    inline: crate::server::handler::Inline,
}

type Pool = Arc<Mutex<Vec<BoxFut>>>;

/// Boxes kept for reuse per method.
const POOLED: usize = 64;

/// Wraps `handler` (of `method`) with the interceptors of `chain` that apply to it.
pub(crate) fn wrap(handler: HandlerRef, method: &str, chain: &Chain) -> HandlerRef {
    Arc::new(Observed {
        inner: handler,
        chain: chain.for_method(method),
        pool: Pool::default(),
        inline: crate::server::handler::Inline::new(method),
    })
}

/// Counts the bytes of a request stream as the handler consumes them.
struct Counted {
    inner: Box<dyn CreditReturn>,
    bytes: Arc<AtomicU64>,
}

impl CreditReturn for Counted {
    fn give_back(&self, credit: u32) {
        self.bytes.fetch_add(u64::from(credit), Ordering::Relaxed);
        self.inner.give_back(credit);
    }
    fn abandon(&self) {
        self.inner.abandon();
    }
}

impl Handler for Observed {
    fn inline(&self) -> Option<&crate::server::handler::Inline> {
        Some(&self.inline)
    }

    fn kind(&self) -> CallKind {
        self.inner.kind()
    }

    fn codec(&self) -> u8 {
        self.inner.codec()
    }

    fn call(
        &self,
        input: Input,
        metadata: Metadata,
        ctx: ServerContext,
        io: IoRef<'_>,
        recycled: Option<BoxFut>,
    ) -> BoxFut {
        if self.chain.is_empty() && !crate::observe::spans_wanted() {
            // The fast path: nothing to run, nothing to record.
            return self.inner.call(input, metadata, ctx, io, recycled);
        }
        self.call_observed(input, metadata, ctx, io, recycled)
    }
}

impl Observed {
    /// A call with interceptors to run or a span to record (kept out of line, so that the
    /// fast path above stays a check and a call).
    #[inline(never)]
    fn call_observed(
        &self,
        input: Input,
        metadata: Metadata,
        ctx: ServerContext,
        io: IoRef<'_>,
        recycled: Option<BoxFut>,
    ) -> BoxFut {
        let id = u64::from(io.id);
        let span = crate::observe::call_span(Side::Server, &ctx.method, &ctx.conn.peer, id);
        if self.chain.is_empty() && span.is_none() {
            return self.inner.call(input, metadata, ctx, io, recycled);
        }
        #[cfg(feature = "otel")]
        if let Some(span) = &span {
            crate::observe::otel::extract(span, &metadata);
        }
        let info = CallInfo::new(
            Side::Server,
            ctx.method.clone(),
            metadata,
            Some(ctx.conn.peer.clone()),
            ctx.deadline,
            id,
        );
        let mut rec = Record::new(self.chain.clone(), info, span);
        let input = match input {
            Input::One(b) => {
                rec.request_bytes = b.len() as u64;
                Input::One(b)
            }
            Input::Stream { rx, credit } => {
                let bytes = Arc::new(AtomicU64::new(0));
                rec.consumed = Some(bytes.clone());
                Input::Stream {
                    rx,
                    credit: Box::new(Counted {
                        inner: credit,
                        bytes,
                    }),
                }
            }
        };
        match rec.start_sync() {
            Err(status) => place(recycled, std::future::ready(Outcome::Reply(Err(status)))),
            Ok(None) => {
                let reuse = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
                let md = rec.info.metadata().clone();
                let fut = self.inner.call(input, md, ctx, io, reuse);
                place(recycled, run(rec, fut, self.pool.clone()))
            }
            Ok(Some(i)) => {
                let inner = self.inner.clone();
                let pool = self.pool.clone();
                let io = io.to_owned();
                place(recycled, async move {
                    if let Err(status) = rec.start_from(i, None).await {
                        return Outcome::Reply(Err(status));
                    }
                    let fut =
                        inner.call(input, rec.info.metadata().clone(), ctx, io.as_ref(), None);
                    run(rec, fut, pool).await
                })
            }
        }
    }
}

/// Runs the handler inside the call's span and records how it ended; its box goes back to
/// `pool`.
async fn run(mut rec: Record, mut fut: BoxFut, pool: Pool) -> Outcome {
    let span = rec.span.clone();
    let out = std::future::poll_fn(|cx| {
        let _entered = span.as_ref().map(tracing::Span::enter);
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(Poll::Ready(o)) => Poll::Ready(o),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => {
                // The connection ends this call with INTERNAL (see `server::handler::Running`).
                rec.finish(&Status::internal("the handler panicked"));
                std::panic::resume_unwind(panic)
            }
        }
    })
    .await;
    let ok = Status::ok();
    let status = match &out {
        Outcome::Reply(Ok((message, _, _))) => {
            rec.response_bytes = message.len() as u64;
            &ok
        }
        Outcome::Finished(Ok(_)) => &ok,
        Outcome::Reply(Err(s)) | Outcome::Finished(Err(s)) => s,
    };
    rec.finish(status);
    let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
    if pool.len() < POOLED {
        pool.push(fut);
    }
    drop(pool);
    out
}
