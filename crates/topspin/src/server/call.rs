//! One server call's rules, whatever its face: the same for a native call (`server::conn`,
//! driven by the sans-IO engine) and for a call of the gRPC face (`grpc::call`, an h2 stream).
//! Each face translates its transport's events into these steps and implements [`Respond`]
//! for its own response side; what a call may receive, when its handler starts, how it is
//! polled and how its outcome is answered is decided here, once.
//!
//! The life of a call:
//! 1. [`lookup`]: its method's handler, or `UNIMPLEMENTED`.
//! 2. A unary or server-streaming call gathers its one request message ([`Waiting`]): a
//!    second one, or none by the half-close, ends it `INVALID_ARGUMENT`. A client-streaming
//!    or bidi call starts at once, its requests a stream.
//! 3. [`prepare`]: a call whose deadline passed on its way in is not started
//!    (`DEADLINE_EXCEEDED`); otherwise its handler's future is built.
//! 4. [`first_poll`]: polled once on the connection's task (a handler that answers at once
//!    needs no hand-off), unless its method is known to block (`handler::Inline`); a handler
//!    that is not done goes on on a task of its own (`handler::Spawned`). A panic ends the
//!    call alone, `INTERNAL` (`handler::Running`).
//! 5. [`answer`]: its outcome becomes the face's response — headers, the one reply message,
//!    then the end with its trailers; an error ends the call with its status. A streaming
//!    handler's commands (headers, messages waiting for flow control, request credit) go
//!    through [`command`].
//! 6. A call that ends before its handler returned (the peer cancelled, its deadline passed,
//!    the server's grace ran out: [`expired`], [`shut_down`]; its connection went) cancels the
//!    handler; one that ends after does not ([`Cancel`]).
//!
//! A call's state between these steps is one [`ServerCall`] on both faces: the native
//! connection keeps one per call in its map, a gRPC-face call on its own task.

use super::handler::{BoxFut, Done, HandlerRef, Input, IoRef, Outcome, Running, SCmd};
use super::Registry;
use crate::codec::Payload;
use crate::request::{Cancellation, ServerContext};
use crate::streaming::Item;
use crate::Status;
use bytes::Bytes;
use std::future::Future;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use topspin_proto::{Code, Metadata};

/// The handler of `method`, or the status that refuses the call.
pub(crate) fn lookup(registry: &Registry, method: &str) -> Result<HandlerRef, Status> {
    registry.get(method).ok_or_else(|| unimplemented(method))
}

/// A call of a method this server does not have.
fn unimplemented(method: &str) -> Status {
    Status::unimplemented(format!("method {method} is not implemented by this server"))
}

/// A call whose deadline passed while it ran: its handler is cancelled. (The native engine
/// expires its calls itself, `topspin_proto::Connection::handle_timeout`.)
#[cfg_attr(not(feature = "grpc"), allow(dead_code))]
pub(crate) fn expired() -> Status {
    Status::new(Code::DeadlineExceeded, "the call's deadline passed")
}

/// A call still running when the server's shutdown grace ran out.
pub(crate) fn shut_down() -> Status {
    Status::unavailable("the server shut down before the call finished")
}

/// A call's cancellation, as every face keeps it: fired when the call ends — the peer
/// cancelled, its deadline passed, the server's grace ran out, its connection went — before its
/// handler returned, never after (a clone the application kept must not fire once its handler
/// is done: "abandoned" and "done" stay apart). Dropped, it is over ([`Cancel::over`]).
#[derive(Debug)]
pub(crate) struct Cancel {
    /// `None` once over.
    handle: Option<Cancellation>,
    returned: bool,
}

impl Cancel {
    /// The cancellation of a call whose handler runs.
    pub(crate) fn running(handle: Cancellation) -> Cancel {
        Cancel {
            handle: Some(handle),
            returned: false,
        }
    }

    /// The cancellation of a call whose handler returned already (its answer waits to go).
    pub(crate) fn returned(handle: Cancellation) -> Cancel {
        Cancel {
            handle: Some(handle),
            returned: true,
        }
    }

    /// The handler returned: the call's end is no cancellation any more.
    pub(crate) fn handler_returned(&mut self) {
        self.returned = true;
    }

    /// The call is over: its handler, if still running, is cancelled; the handle goes back to
    /// `pool` for the next call when nothing else holds it.
    pub(crate) fn over(mut self, pool: Option<&mut Vec<Cancellation>>) {
        if let Some(handle) = self.handle.take() {
            if !self.returned {
                handle.cancel();
            }
            if let Some(pool) = pool {
                handle.recycle(pool);
            }
        }
    }
}

impl Drop for Cancel {
    fn drop(&mut self) {
        if let (Some(handle), false) = (&self.handle, self.returned) {
            handle.cancel();
        }
    }
}

/// A unary or server-streaming call before its handler starts: its handler, its request
/// metadata and context, and its one request message once it came.
pub(crate) struct Waiting {
    pub(crate) handler: HandlerRef,
    pub(crate) metadata: Metadata,
    pub(crate) ctx: ServerContext,
    message: Option<Bytes>,
}

impl Waiting {
    pub(crate) fn new(
        handler: HandlerRef,
        metadata: Metadata,
        ctx: ServerContext,
        message: Option<Bytes>,
    ) -> Waiting {
        Waiting {
            handler,
            metadata,
            ctx,
            message,
        }
    }

    /// A request message came: the call's one, or one too many (the call ends with the
    /// status returned). `compressed`: it arrived compressed, and its face decompressed it
    /// (gRPC's; a native message keeps its flag byte for the handler to read).
    pub(crate) fn on_message(&mut self, message: Bytes, compressed: bool) -> Result<(), Status> {
        if self.message.is_some() {
            return Err(Status::invalid_argument(format!(
                "{} takes one request message, got more",
                &*self.ctx.method
            )));
        }
        self.message = Some(message);
        self.ctx.compressed = compressed;
        Ok(())
    }

    /// The client half-closed: the handler starts with its one request, or the call ends
    /// with the status returned if none came.
    pub(crate) fn on_half_closed(self) -> Result<(Waiting, Bytes), Status> {
        let mut w = self;
        match w.message.take() {
            Some(m) => Ok((w, m)),
            None => Err(Status::invalid_argument(format!(
                "{} takes one request message, got none",
                &*w.ctx.method
            ))),
        }
    }
}

/// One call's state, whatever its face: gathering its one request message, or started.
/// `S` is what the face keeps of a started call's response side (the native face: a reply or
/// an END waiting for the client's credit; the gRPC face keeps that on the call's task).
pub(crate) enum ServerCall<S = ()> {
    /// A unary or server-streaming call before its handler starts.
    Waiting(Waiting),
    /// Its handler started; it may have returned, its answer still on its way.
    Started(Started<S>),
    /// Between the two (its one request taken, its handler not yet started), or over.
    Gone,
}

/// A call whose handler started.
pub(crate) struct Started<S> {
    /// Fired if the call ends before its handler returned.
    cancel: Cancel,
    /// Client-streaming and bidi: where the request messages go, until the client half-closes.
    /// Unbounded as a channel, bounded by what the face lets in: the call's window of
    /// unconsumed request bytes (native credit; the gRPC face reads the body only while its
    /// `outstanding` is under the window).
    requests: Option<mpsc::UnboundedSender<Item>>,
    /// The face's response side.
    pub(crate) send: S,
}

/// What became of a request message ([`ServerCall::on_message`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Received {
    /// Kept as the call's one request.
    Kept,
    /// Handed to the handler's request stream: its credit comes back as the handler consumes.
    Queued,
    /// Nobody takes it (the handler has no request stream, or it ended): its credit is the
    /// face's to give back at once.
    Unwanted(u32),
}

impl<S> ServerCall<S> {
    /// A call whose handler started: `cancel` its handle, `requests` its request stream.
    #[inline(always)]
    pub(crate) fn started(
        cancel: Cancel,
        requests: Option<mpsc::UnboundedSender<Item>>,
        send: S,
    ) -> ServerCall<S> {
        ServerCall::Started(Started {
            cancel,
            requests,
            send,
        })
    }

    /// A request message came with `credit`: the call's one request, one too many (the call
    /// ends with the status returned), or one for the handler's request stream.
    /// `compressed`: it arrived compressed and its face decompressed it (gRPC's; a native
    /// message keeps its flag byte for the handler's decoder).
    #[inline]
    pub(crate) fn on_message(
        &mut self,
        message: Bytes,
        credit: u32,
        compressed: bool,
    ) -> Result<Received, Status> {
        match self {
            ServerCall::Waiting(w) => w.on_message(message, compressed).map(|()| Received::Kept),
            ServerCall::Started(Started {
                requests: Some(tx), ..
            }) => {
                // A handler that dropped its request stream takes no more: nothing to return.
                let _ = tx.send(Item::Message(message, credit, compressed));
                Ok(Received::Queued)
            }
            _ => Ok(Received::Unwanted(credit)),
        }
    }

    /// The client half-closed: a started call's request stream ends (`Ok(None)`); a waiting
    /// call's handler is to start with its one request (`Ok(Some(..))`, the state is then
    /// [`ServerCall::Gone`]), or the call ends with the status returned if none came.
    #[inline]
    pub(crate) fn on_half_closed(&mut self) -> Result<Option<(Waiting, Bytes)>, Status> {
        match self {
            ServerCall::Started(s) => {
                if let Some(tx) = s.requests.take() {
                    let _ = tx.send(Item::End(Ok(Metadata::new())));
                }
                Ok(None)
            }
            ServerCall::Waiting(_) => match std::mem::replace(self, ServerCall::Gone) {
                ServerCall::Waiting(w) => w.on_half_closed().map(Some),
                _ => Ok(None),
            },
            ServerCall::Gone => Ok(None),
        }
    }

    /// The handler returned: the call's end is no cancellation any more.
    #[inline]
    pub(crate) fn handler_returned(&mut self) {
        if let ServerCall::Started(s) = self {
            s.cancel.handler_returned();
        }
    }

    /// The face's response side of a started call.
    #[inline]
    pub(crate) fn send_mut(&mut self) -> Option<&mut S> {
        match self {
            ServerCall::Started(s) => Some(&mut s.send),
            _ => None,
        }
    }

    /// The call is over: a handler still running is cancelled (its request stream told
    /// `why`, when the peer cancelled it); the handle goes back to `pool`. Returns the face's
    /// response side, for what it kept to be let go.
    pub(crate) fn over(
        self,
        why: Option<&Status>,
        pool: Option<&mut Vec<Cancellation>>,
    ) -> Option<S> {
        match self {
            ServerCall::Started(s) => {
                s.cancel.over(pool);
                if let (Some(tx), Some(st)) = (s.requests, why) {
                    let _ = tx.send(Item::End(Err(st.clone())));
                }
                Some(s.send)
            }
            _ => None,
        }
    }
}

/// The handler's future for a call about to start, or the status that ends the call instead:
/// a call whose deadline passed on its way in is not started (its handler's work could only
/// be thrown away). `recycled`: a box of a finished call to put the future in.
#[inline(always)]
pub(crate) fn prepare(
    id: u32,
    handler: &HandlerRef,
    input: Input,
    metadata: Metadata,
    ctx: ServerContext,
    io: IoRef<'_>,
    recycled: Option<BoxFut>,
) -> Result<Running, (Status, ServerContext)> {
    if ctx.deadline.is_some_and(|d| d <= Instant::now()) {
        let st = Status::new(
            Code::DeadlineExceeded,
            "the deadline passed before the handler started",
        );
        return Err((st, ctx));
    }
    let cancel = ctx.cancel.clone();
    Ok(Running {
        id,
        cancel,
        fut: Some(handler.call(input, metadata, ctx, io, recycled)),
    })
}

/// The first poll of a call's handler, on its connection's task with a waker that does
/// nothing: a handler that answers at once is done without a trip through the scheduler.
/// `Pending`: it goes on on a task of its own (`handler::Spawned`), which registers for its
/// call's cancellation. Not polled when its method is known to block (`handler::Inline`);
/// a call cancelled before its first poll (one that waited to start) is dropped unpolled.
#[inline(always)]
pub(crate) fn first_poll(running: &mut Running, handler: &HandlerRef) -> Poll<Done> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    if running.cancel.is_cancelled() {
        return std::pin::Pin::new(running).poll(&mut cx);
    }
    running.poll_first(&mut cx, handler.inline())
}

/// A streaming handler's message waiting for flow control, and who waits for it to go.
pub(crate) type Ack = oneshot::Sender<Result<(), Status>>;

/// A face's response side of one call, as the call's rules drive it.
pub(crate) trait Respond {
    /// The response headers (before any message), sent at once, empty ones too: a client may
    /// wait for a response stream to open (grpc-go's `Header()`). `Err`: the call ends with
    /// that status.
    fn headers(&mut self, headers: Metadata) -> Result<(), Status>;
    /// A unary reply's headers, sent just before its message: a face may leave empty ones out
    /// (a native call without HEADERS has empty response headers, protocol.md §5.4).
    #[inline(always)]
    fn reply_headers(&mut self, headers: Metadata) -> Result<(), Status> {
        self.headers(headers)
    }
    /// The one reply message of a unary-response call. `Ok(Some(trailers))`: it went, the
    /// call ends now; `Ok(None)`: the face keeps it (and the trailers) until the peer has room,
    /// then ends the call OK. `Err`: the call ends with that status.
    fn reply(&mut self, message: Payload, trailers: Metadata) -> Result<Option<Metadata>, Status>;
    /// A streaming handler's message: `ack` is told once it went (or why it cannot).
    /// `compress`: the response's `MessageCompression` switch was on.
    fn send(&mut self, message: Payload, compress: bool, ack: Ack);
    /// The handler consumed `bytes` of request messages: the peer may send as much again.
    fn credit(&mut self, bytes: u32);
    /// The call's end: its status and trailers. A status's own metadata, details and headers
    /// are the face's to encode — a failing one's, and an OK one's a response stream ended
    /// with (its metadata are then the trailers).
    fn end(&mut self, status: Status, trailers: Metadata);
}

/// Answers a handler's outcome: a reply is headers, its message and an OK end with its
/// trailers; a finished stream ends with its trailers; an error ends the call with its status.
#[inline(always)]
pub(crate) fn answer(outcome: Outcome, out: &mut impl Respond) {
    match outcome {
        Outcome::Reply(Ok((message, headers, trailers))) => {
            match out
                .reply_headers(headers)
                .and_then(|()| out.reply(message, trailers))
            {
                Ok(Some(trailers)) => out.end(Status::ok(), trailers),
                Ok(None) => {}
                Err(st) => out.end(st, Metadata::new()),
            }
        }
        Outcome::Reply(Err(st)) | Outcome::Finished(Err(st)) => out.end(st, Metadata::new()),
        Outcome::Finished(Ok(trailers)) => out.end(Status::ok(), trailers),
    }
}

/// Applies a streaming handler's command to its call.
#[inline]
pub(crate) fn command(cmd: SCmd, out: &mut impl Respond) {
    match cmd {
        SCmd::Headers { metadata, .. } => {
            if let Err(st) = out.headers(metadata) {
                out.end(st, Metadata::new());
            }
        }
        SCmd::Send {
            message,
            ack,
            compress,
            ..
        } => out.send(message, compress, ack),
        SCmd::Credit { bytes, .. } => out.credit(bytes),
    }
}

#[cfg(test)]
mod tests;
