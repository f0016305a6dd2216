//! One call of the gRPC face, from its request headers to its trailers: [`Face::call`] checks
//! the headers and runs a [`Call`], which gathers the request messages (`wire::Deframer`, the
//! memory budget), hands them to the method's handler — the same type-erased handler
//! (`server::handler`) native calls get, first polled inline, then on a task of its own if it
//! waits — and sends its response within the stream's send capacity. Every call runs on its
//! connection's task (`server.rs`).

use super::request::{poll_armed, Inbound, Limits};
use super::wire::{self, Frame};
use super::Peer;
use crate::codec::Payload;
use crate::request::{Cancellation, ServerContext};
use crate::server::call::{self, Respond, ServerCall};
use crate::server::handler::{CallIo, Done, Input, IoRef, SCmd, ServerCredit, Spawned};
use crate::server::Registry;
use crate::{Compression, Encoding, Status};
use bytes::Bytes;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::HeaderMap;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use topspin_proto::{Code, Metadata};

/// Commands a streaming call's handler may have queued to its call (headers, a message
/// waiting for its acknowledgement, credit for consumed requests). The handler waits for room.
const CALL_QUEUE: usize = 64;

/// Response bytes of one connection's calls that h2 has not been given yet (it is given them
/// only within each stream's send capacity): past `max` (`Config::max_send_buffer`) new calls
/// wait to start, as on a native connection, so a client that never reads cannot make the
/// server produce more.
pub(super) struct Unsent {
    pub(super) bytes: std::sync::atomic::AtomicUsize,
    pub(super) max: usize,
    pub(super) room: tokio::sync::Notify,
}

impl Unsent {
    pub(super) fn get(&self) -> usize {
        self.bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn add(&self, n: usize) {
        self.bytes
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    fn sub(&self, n: usize) {
        let before = self
            .bytes
            .fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
        if before > self.max && before - n <= self.max {
            self.room.notify_waiters();
        }
    }

    /// Waits until the connection's unsent bytes are within the bound.
    async fn room(&self) {
        if self.get() <= self.max {
            return; // the common case: no waiter to register
        }
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.get() <= self.max {
                return;
            }
            notified.await;
        }
    }
}

/// A response message waiting for send capacity: counted in its connection's [`Unsent`]
/// until h2 has taken all of it or the call ends.
struct Queued<'a> {
    frame: Frame,
    /// A streaming handler waiting for its message to be taken.
    ack: Option<Ack>,
    unsent: &'a Unsent,
}

impl<'a> Queued<'a> {
    fn new(frame: Frame, ack: Option<Ack>, unsent: &'a Unsent) -> Queued<'a> {
        unsent.add(bytes::Buf::remaining(&frame));
        Queued { frame, ack, unsent }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.unsent.sub(bytes::Buf::remaining(&self.frame));
        if let Some(ack) = self.ack.take() {
            let _ = ack.send(Err(crate::status::call_over()));
        }
    }
}

/// What every call of one connection shares.
pub(super) struct Face {
    pub(super) unsent: Unsent,
    pub(super) registry: Arc<Registry>,
    pub(super) peer: Peer,
    /// Every call's share of the connection's context.
    pub(super) context: Arc<crate::request::ConnContext>,
    pub(super) max_message_size: u32,
    /// The request metadata's limit, as on the native face (the header list may be larger by
    /// the HTTP/2 and gRPC headers themselves).
    pub(super) max_metadata_size: usize,
    pub(super) window: usize,
    /// A request message that stops arriving (no byte for this long while the window is
    /// open) ends its call: `Config::frame_timeout`, as a stalled native frame.
    pub(super) frame_timeout: Duration,
    /// Where a call's timers wait while not armed (no deadline, nothing withheld or stalled).
    pub(super) far: Instant,
    pub(super) compression: Option<Compression>,
    /// What large request messages are reserved against (shared with native calls).
    pub(super) budget: Arc<topspin_proto::MemoryBudget>,
    /// The buffer split request messages are gathered in, kept between them (`wire::Spare`).
    pub(super) spare: Arc<wire::Spare>,
    /// The `CallIo` of unary handlers, which send nothing through it.
    pub(super) unary_tx: mpsc::Sender<SCmd>,
    pub(super) _unary_rx: mpsc::Receiver<SCmd>,
    /// The grace period of a shutdown is over: calls end `UNAVAILABLE`.
    pub(super) abort: CancellationToken,
}

fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(wire::CONTENT_TYPE.as_bytes()))
}

/// Answers a call with a trailers-only response (HEADERS with END_STREAM).
fn trailers_only(respond: &mut SendResponse<Frame>, status: &Status, negotiating: bool) {
    let mut h = wire::response_headers(&Metadata::new(), None, negotiating);
    wire::status_trailers(&mut h, status, &Metadata::new());
    let mut resp = http::Response::new(());
    *resp.headers_mut() = h;
    let _ = respond.send_response(resp, true);
}

impl Face {
    /// What bounds each call's requests.
    fn limits(&self) -> Limits {
        Limits {
            window: self.window,
            budget: self.budget.clone(),
            max_message_size: self.max_message_size,
            frame_timeout: self.frame_timeout,
            far: self.far,
            spare: self.spare.clone(),
        }
    }

    /// One call, from its request headers to its trailers.
    pub(super) async fn call(
        &self,
        req: http::Request<RecvStream>,
        mut respond: SendResponse<Frame>,
    ) {
        let (parts, body) = req.into_parts();
        let headers = &parts.headers;
        if !is_grpc(headers) {
            // gRPC's rule for a request that is not gRPC.
            let mut resp = http::Response::new(());
            *resp.status_mut() = http::StatusCode::UNSUPPORTED_MEDIA_TYPE;
            let _ = respond.send_response(resp, true);
            return;
        }
        let method = parts.uri.path();
        let handler = match call::lookup(&self.registry, method) {
            Ok(h) => h,
            Err(st) => return trailers_only(&mut respond, &st, false),
        };
        let deadline = match headers.get(wire::GRPC_TIMEOUT) {
            None => None,
            Some(v) => match wire::parse_timeout(v.as_bytes()) {
                Ok(d) => Instant::now().checked_add(d),
                Err(st) => return trailers_only(&mut respond, &st, false),
            },
        };
        let recv = match wire::request_encoding(headers) {
            Ok(e) => e,
            Err(st) => return trailers_only(&mut respond, &st, true),
        };
        let accepts = wire::accepted_encodings(headers);
        let negotiating = recv.is_some() || accepts.is_some();
        let accepts = accepts.unwrap_or(0);
        let send = self
            .compression
            .filter(|c| accepts & c.encoding().bit() != 0);
        let metadata = wire::metadata_from_headers(headers);
        let md_len = metadata.encoded_len();
        if md_len > self.max_metadata_size {
            let st = Status::new(
                Code::ResourceExhausted,
                format!(
                    "request metadata of {md_len} bytes exceeds this server's limit of {} bytes (max_metadata_size)",
                    self.max_metadata_size
                ),
            );
            return trailers_only(&mut respond, &st, negotiating);
        }
        let ctx = ServerContext {
            deadline,
            encoding: recv,
            compressed: false,
            method: bytestring::ByteString::from(method),
            cancel: Cancellation::default(),
            conn: self.context.clone(),
        };
        let kind = handler.kind();
        let mut call = Call {
            id: respond.stream_id().as_u32(),
            out: Out::Head(respond),
            send,
            recv,
            accepts,
            negotiating,
            state: ServerCall::Waiting(call::Waiting::new(handler, metadata, ctx, None)),
        };
        // A connection whose client does not read what it was sent starts no more handlers.
        self.unsent.room().await;
        call.run(self, kind, body).await;
    }
}

/// Where the response stands.
enum Out {
    /// Nothing sent yet.
    Head(SendResponse<Frame>),
    /// Headers sent: messages and trailers go here.
    Body(SendStream<Frame>),
    /// Trailers sent (or the stream is gone).
    Closed,
}

impl Out {
    /// Ready when the client reset the stream (or the connection failed).
    fn poll_reset(&mut self, cx: &mut std::task::Context<'_>) -> Poll<()> {
        match self {
            Out::Head(r) => r.poll_reset(cx).map(|_| ()),
            Out::Body(s) => s.poll_reset(cx).map(|_| ()),
            Out::Closed => Poll::Pending,
        }
    }
}

/// What woke a call up.
enum Ev {
    Reset,
    Deadline,
    Abort,
    Done(Done),
    Capacity(Option<Result<usize, h2::Error>>),
    Cmd(Option<SCmd>),
    Data(Option<Result<Bytes, h2::Error>>),
    /// Time to look again whether withheld window can be given back.
    Retry,
    /// A request message stopped arriving for `frame_timeout` while the window was open.
    Stalled,
}

type Ack = tokio::sync::oneshot::Sender<Result<(), Status>>;

struct Call {
    id: u32,
    out: Out,
    send: Option<Compression>,
    recv: Option<Encoding>,
    /// The encodings the client accepts (`grpc-accept-encoding`, a bit per encoding).
    accepts: u8,
    negotiating: bool,
    /// The call core's state: waiting for its one request, or started (dropped with the
    /// call — it ended, or its connection went — before its handler returned, it cancels
    /// the handler: its `Request::cancellation()` fires and its future is dropped).
    state: ServerCall,
}

/// A call's timers and its connection's shutdown, pinned on its task.
struct Timers<'t, 'c> {
    /// The call's deadline, if it has one.
    deadline: Pin<&'t mut Option<Sleep>>,
    /// The end of a shutdown's grace.
    abort: Pin<&'t mut tokio_util::sync::WaitForCancellationFuture<'c>>,
    /// Armed while window is withheld (`Inbound::withheld`).
    retry: Pin<&'t mut Option<Sleep>>,
    /// Armed while a message is incomplete and the window open (`Inbound::stall_armed`).
    stall: Pin<&'t mut Option<Sleep>>,
}

/// The response side of a call.
struct Answer<'f> {
    /// The handler, once it went on on a task of its own.
    exec: Option<Spawned>,
    /// A response message waiting for the stream's send capacity.
    pending: Option<Queued<'f>>,
    /// A unary reply's trailers, sent once its message has gone to h2.
    finish: Option<Metadata>,
    /// A streaming handler's commands.
    rx: Option<mpsc::Receiver<SCmd>>,
    io: CallIo,
}

/// What a call does after an event.
enum Flow {
    Go,
    /// End the call with this status.
    End(Status),
    /// The call is over (answered, or the client went away).
    Over,
}

impl Call {
    async fn run(&mut self, face: &Face, kind: crate::CallKind, mut body: RecvStream) {
        // The call's timers exist only once armed: most calls have none (a `Sleep` made per
        // call reads the runtime's handle and the clock).
        let deadline: Option<Sleep> = match &self.state {
            ServerCall::Waiting(w) => w.ctx.deadline.map(|d| tokio::time::sleep_until(d.into())),
            _ => None,
        };
        tokio::pin!(deadline);
        let abort = face.abort.cancelled();
        tokio::pin!(abort);
        let (retry, stall): (Option<Sleep>, Option<Sleep>) = (None, None);
        tokio::pin!(retry);
        tokio::pin!(stall);
        let mut t = Timers {
            deadline,
            abort,
            retry,
            stall,
        };
        let mut req = Inbound::new(face.limits(), self.recv, !body.is_end_stream());
        let mut a = self.answer(kind, face);
        if kind.client_streams() {
            // Requests arrive as a stream: the handler starts now.
            if let Flow::Over = self.start_streaming(&mut a, face) {
                return;
            }
        }
        loop {
            if a.finish.is_some() {
                self.push(&mut a.pending);
                if a.pending.is_none() {
                    let trailers = a.finish.take().unwrap_or_default();
                    return self.end(&Status::ok(), &trailers);
                }
            }
            let ev = poll_fn(|cx| self.poll_event(cx, &mut t, &mut a, &req, &mut body)).await;
            match self.on_event(ev, &mut t, &mut a, &mut req, &mut body, face) {
                Flow::Go => {}
                Flow::End(st) => return self.end(&st, &Metadata::new()),
                Flow::Over => return,
            }
        }
    }

    /// The response side of a call of `kind`: a unary handler's `CallIo` sends nothing.
    fn answer<'f>(&self, kind: crate::CallKind, face: &Face) -> Answer<'f> {
        let (rx, io) = if kind == crate::CallKind::Unary {
            let io = CallIo {
                tx: face.unary_tx.clone(),
                id: self.id,
            };
            (None, io)
        } else {
            let (tx, rx) = mpsc::channel(CALL_QUEUE);
            (Some(rx), CallIo { tx, id: self.id })
        };
        Answer {
            exec: None,
            pending: None,
            finish: None,
            rx,
            io,
        }
    }

    /// Starts a client-streaming or bidi handler, its requests a stream.
    fn start_streaming<'f>(&mut self, a: &mut Answer<'f>, face: &'f Face) -> Flow {
        // Unbounded as a channel, bounded by what is sent into it: the body is read only while
        // `outstanding` (each queued message counted at the larger of its wire and
        // decompressed sizes, given back as the handler consumes it) is under `face.window`,
        // so at most one window plus one message waits here.
        let (tx, in_rx) = mpsc::unbounded_channel();
        let credit = Box::new(ServerCredit {
            tx: a.io.tx.clone(),
            id: self.id,
        });
        let ServerCall::Waiting(w) = std::mem::replace(&mut self.state, ServerCall::Gone) else {
            return Flow::Over;
        };
        let input = Input::Stream { rx: in_rx, credit };
        let started = self.start(w, input, Some(tx), a.io.as_ref());
        self.started(started, a, face)
    }

    /// What became of a handler's first poll.
    fn started<'f>(&mut self, started: Started, a: &mut Answer<'f>, face: &'f Face) -> Flow {
        match started {
            Started::Done(d) => self.finished(d, a, face),
            Started::Running(s) => {
                a.exec = Some(s);
                Flow::Go
            }
            Started::Ended => Flow::Over,
        }
    }

    /// The handler returned (or was cancelled: no outcome): its outcome answered by the call
    /// core's rules (`server::call::answer`).
    fn finished<'f>(&mut self, (_, outcome, _): Done, a: &mut Answer<'f>, face: &'f Face) -> Flow {
        a.exec = None;
        let Some(outcome) = outcome else {
            return Flow::Over;
        };
        self.state.handler_returned();
        if let Some(rx) = a.rx.as_mut() {
            // A response stream's headers are queued, not awaited: they go before the trailers.
            while let Ok(cmd) = rx.try_recv() {
                if let SCmd::Headers { metadata, .. } = cmd {
                    self.headers(&metadata);
                }
            }
        }
        let mut none = 0;
        let mut out = H2::new(self, a, &face.unsent, &mut none);
        call::answer(outcome, &mut out);
        out.flow()
    }

    /// The next thing that happened to the call, its sources polled in order.
    fn poll_event(
        &mut self,
        cx: &mut std::task::Context<'_>,
        t: &mut Timers<'_, '_>,
        a: &mut Answer<'_>,
        req: &Inbound,
        body: &mut RecvStream,
    ) -> Poll<Ev> {
        if self.out.poll_reset(cx).is_ready() {
            return Poll::Ready(Ev::Reset);
        }
        if poll_armed(t.deadline.as_mut(), cx) {
            return Poll::Ready(Ev::Deadline);
        }
        if t.abort.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Ev::Abort);
        }
        if let Some(e) = a.exec.as_mut() {
            if let Poll::Ready(d) = Pin::new(e).poll(cx) {
                return Poll::Ready(Ev::Done(d));
            }
        }
        if a.pending.is_some() {
            if let Out::Body(s) = &mut self.out {
                if let Poll::Ready(c) = s.poll_capacity(cx) {
                    return Poll::Ready(Ev::Capacity(c));
                }
            }
        }
        if let Some(rx) = a.rx.as_mut() {
            if let Poll::Ready(c) = rx.poll_recv(cx) {
                return Poll::Ready(Ev::Cmd(c));
            }
        }
        if req.withheld > 0 && poll_armed(t.retry.as_mut(), cx) {
            return Poll::Ready(Ev::Retry);
        }
        if req.stall_armed && poll_armed(t.stall.as_mut(), cx) {
            return Poll::Ready(Ev::Stalled);
        }
        if req.wants_data() {
            if let Poll::Ready(d) = body.poll_data(cx) {
                return Poll::Ready(Ev::Data(d));
            }
        }
        Poll::Pending
    }

    fn on_event<'f>(
        &mut self,
        ev: Ev,
        t: &mut Timers<'_, '_>,
        a: &mut Answer<'f>,
        req: &mut Inbound,
        body: &mut RecvStream,
        face: &'f Face,
    ) -> Flow {
        match ev {
            // The client cancelled (RST_STREAM): the guard cancels the handler.
            Ev::Reset => Flow::Over,
            Ev::Deadline => Flow::End(call::expired()),
            Ev::Abort => Flow::End(call::shut_down()),
            Ev::Done(d) => self.finished(d, a, face),
            Ev::Capacity(Some(Ok(n))) if n > 0 => {
                self.push(&mut a.pending);
                Flow::Go
            }
            Ev::Capacity(Some(Ok(_))) => Flow::Go,
            Ev::Capacity(_) => Flow::Over, // the stream is gone
            Ev::Cmd(None) => {
                a.rx = None;
                Flow::Go
            }
            Ev::Cmd(Some(cmd)) => {
                let mut out = H2::new(self, a, &face.unsent, &mut req.outstanding);
                call::command(cmd, &mut out);
                out.flow()
            }
            Ev::Retry => {
                req.on_retry(body, t.retry.as_mut(), t.stall.as_mut());
                Flow::Go
            }
            Ev::Stalled => match req.on_stalled(t.stall.as_mut()) {
                Ok(()) => Flow::Go,
                Err(st) => Flow::End(st),
            },
            Ev::Data(Some(Ok(chunk))) => {
                let (retry, stall) = (t.retry.as_mut(), t.stall.as_mut());
                match req.on_data(chunk, &mut self.state, body, retry, stall) {
                    Ok(()) => Flow::Go,
                    Err(st) => Flow::End(st),
                }
            }
            Ev::Data(Some(Err(_))) => Flow::Over, // reset or connection error
            Ev::Data(None) => match req.on_end(&mut self.state) {
                Ok(None) => Flow::Go,
                Ok(Some((w, m))) => {
                    let started = self.start(w, Input::One(m), None, a.io.as_ref());
                    self.started(started, a, face)
                }
                Err(st) => Flow::End(st),
            },
        }
    }

    /// Builds the handler's future and polls it once on this task (`server::call`); one that
    /// is not done goes on on a task of its own. `requests`: its request stream's sender.
    fn start(
        &mut self,
        w: call::Waiting,
        input: Input,
        requests: Option<mpsc::UnboundedSender<crate::streaming::Item>>,
        io: IoRef<'_>,
    ) -> Started {
        let (handler, md, ctx) = (w.handler, w.metadata, w.ctx);
        let mut running = match call::prepare(self.id, &handler, input, md, ctx, io, None) {
            Ok(r) => r,
            Err((st, _)) => {
                self.end(&st, &Metadata::new());
                return Started::Ended;
            }
        };
        let cancel = call::Cancel::running(running.cancel.clone());
        self.state = ServerCall::started(cancel, requests, ());
        match call::first_poll(&mut running, &handler) {
            Poll::Ready(done) => Started::Done(done),
            Poll::Pending => Started::Running(Spawned::spawn(running)),
        }
    }

    /// Gives h2 as much of the queued message as the stream's send capacity allows (h2 then
    /// holds at most its per-stream send buffer, whatever the message's size), in pieces that
    /// share the message's buffers; once all of it is taken, the handler is told.
    fn push(&mut self, pending: &mut Option<Queued<'_>>) {
        use bytes::Buf;
        let Out::Body(s) = &mut self.out else {
            *pending = None;
            return;
        };
        // h2 wakes the task its `poll_reset` holds when it assigns capacity, which it does at
        // once when the window has room: that task is this call's, which looks at the capacity
        // right here, so the wake would only cost the connection a turn for nothing. A no-op
        // waker takes its place meanwhile; the call's next poll registers it again (it polls
        // `poll_reset` and, with a message still pending, `poll_capacity` before it waits).
        let _ = s.poll_reset(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        while let Some(q) = pending.as_mut() {
            s.reserve_capacity(q.frame.remaining());
            let cap = s.capacity();
            if cap == 0 {
                return; // Ev::Capacity comes back here
            }
            let piece = q.frame.take_piece(cap);
            q.unsent.sub(piece.remaining());
            if s.send_data(piece, false).is_err() {
                *pending = None; // the stream is gone: the handler hears so
                return;
            }
            if !q.frame.has_remaining() {
                if let Some(mut q) = pending.take() {
                    if let Some(ack) = q.ack.take() {
                        let _ = ack.send(Ok(()));
                    }
                }
            }
        }
    }

    /// Sends the response headers if they have not gone yet; false if the stream is gone.
    fn headers(&mut self, md: &Metadata) -> bool {
        if matches!(self.out, Out::Head(_)) {
            self.choose_compression(md);
        }
        self.send_headers(md)
    }

    /// The handler's own compression choice (`Response::with_compression`), if it made one
    /// and the client accepts it.
    fn choose_compression(&mut self, md: &Metadata) {
        if let Some(choice) = wire::chosen_compression(md) {
            self.send = choice.filter(|c| self.accepts & c.encoding().bit() != 0);
        }
    }

    /// [`Call::headers`] with the compression already chosen.
    fn send_headers(&mut self, md: &Metadata) -> bool {
        match std::mem::replace(&mut self.out, Out::Closed) {
            Out::Head(mut respond) => {
                let mut resp = http::Response::new(());
                *resp.headers_mut() = wire::response_headers(md, self.send, self.negotiating);
                match respond.send_response(resp, false) {
                    Ok(s) => {
                        self.out = Out::Body(s);
                        true
                    }
                    Err(_) => false,
                }
            }
            out @ Out::Body(_) => {
                self.out = out;
                true
            }
            Out::Closed => false,
        }
    }

    /// Ends the call with `status`: trailers, or a trailers-only response if nothing was sent.
    /// A handler still running is cancelled (by the guard, when the call is dropped).
    fn end(&mut self, status: &Status, trailers: &Metadata) {
        if matches!(self.out, Out::Head(_)) && !status.headers().is_empty() {
            // A failing call's own headers (`Status::with_headers`) go before its trailers.
            self.send_headers(status.headers());
        }
        match std::mem::replace(&mut self.out, Out::Closed) {
            Out::Head(mut respond) => trailers_only(&mut respond, status, self.negotiating),
            Out::Body(mut s) => {
                let mut h = HeaderMap::new();
                wire::status_trailers(&mut h, status, trailers);
                let _ = s.send_trailers(h);
            }
            Out::Closed => {}
        }
    }
}

enum Started {
    Done(Done),
    Running(Spawned),
    /// Answered without running (its deadline had passed).
    Ended,
}

/// The gRPC face's response side of one call ([`Respond`]): its h2 stream, and the message
/// waiting there for send capacity.
struct H2<'c, 'f> {
    call: &'c mut Call,
    a: &'c mut Answer<'f>,
    unsent: &'f Unsent,
    /// The call's request bytes handed to the handler and not consumed yet.
    outstanding: &'c mut usize,
    /// The call ended.
    ended: bool,
}

impl<'c, 'f> H2<'c, 'f> {
    fn new(
        call: &'c mut Call,
        a: &'c mut Answer<'f>,
        unsent: &'f Unsent,
        outstanding: &'c mut usize,
    ) -> H2<'c, 'f> {
        H2 {
            call,
            a,
            unsent,
            outstanding,
            ended: false,
        }
    }

    /// What the call does next.
    fn flow(&self) -> Flow {
        if self.ended {
            Flow::Over
        } else {
            Flow::Go
        }
    }
}

impl Respond for H2<'_, '_> {
    fn headers(&mut self, headers: Metadata) -> Result<(), Status> {
        if self.call.headers(&headers) {
            Ok(())
        } else {
            Err(crate::status::call_over())
        }
    }

    fn reply(&mut self, message: Payload, trailers: Metadata) -> Result<Option<Metadata>, Status> {
        // Compressed as the headers just sent announced.
        let frame = Frame::new(message, self.call.send)?;
        let mut q = Some(Queued::new(frame, None, self.unsent));
        self.call.push(&mut q);
        match q {
            None => Ok(Some(trailers)),
            Some(q) => {
                // The trailers go once h2 has taken all of it (`Call::run`).
                (self.a.pending, self.a.finish) = (Some(q), Some(trailers));
                Ok(None)
            }
        }
    }

    fn send(&mut self, message: Payload, compress: bool, ack: call::Ack) {
        if self.a.pending.is_some() || !self.call.headers(&Metadata::new()) {
            let _ = ack.send(Err(crate::status::call_over()));
            return;
        }
        match Frame::new(message, self.call.send.filter(|_| compress)) {
            Ok(frame) => {
                // The handler's next message waits until h2 has taken all of this one.
                self.a.pending = Some(Queued::new(frame, Some(ack), self.unsent));
                self.call.push(&mut self.a.pending);
            }
            Err(st) => {
                let _ = ack.send(Err(st.clone()));
                self.end(st, Metadata::new());
            }
        }
    }

    fn credit(&mut self, bytes: u32) {
        *self.outstanding = self.outstanding.saturating_sub(bytes as usize);
    }

    fn end(&mut self, status: Status, trailers: Metadata) {
        self.call.end(&status, &trailers);
        self.ended = true;
    }
}
