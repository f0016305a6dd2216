//! One call of the client's gRPC mode on its h2 stream: the request headers, the request
//! messages written within the stream's capacity, the response headers, messages (the gRPC
//! `Deframer`, credit given back as the consumer takes them) and trailers, mapped to
//! the same call events a native call gives.

use super::*;

/// One call on its h2 stream.
pub(super) struct GrpcCall {
    base: Arc<Base>,
    method: bytestring::ByteString,
    /// Where its answer goes, by the delivery rules both client modes share.
    outcome: Outcome,
    /// Whether request messages carry topspin's flag byte (the call compresses).
    compressed: bool,
    /// The response's message encoding (`grpc-encoding`).
    encoding: Option<Encoding>,
    /// Gathers response messages; a split one's buffer is charged to the memory budget.
    deframer: Deframer,
    /// Credit of response messages handed to the stream's consumer and not given back yet.
    unconsumed: usize,
    /// Credit of parts of a message not yet complete, kept back while the consumer still has
    /// messages to take (released once it has taken them all): a reader that stops reading
    /// holds the server at the window, not the window plus the message under way.
    deferred: usize,
    /// Credit of parts of a message not yet complete, kept back while the memory budget has no
    /// room for what is gathered (a server then holds this side to its budget plus a window
    /// per stream); given back once there is room, looked for every `RETRY_WINDOW`.
    withheld: usize,
    /// Rings while credit is withheld: time to look for room again.
    retry: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// The pump's ack for the message queued last, sent once h2 has window for it.
    unacked: Option<Ack>,
    half_close_after: bool,
    half_closed: bool,
    /// The call's deadline, if it has one.
    deadline: Option<Instant>,
}

/// The encoding of a call's request messages: topspin's compression names it in the call's
/// metadata (and puts its flag byte before each message).
pub(super) fn request_encoding(md: &Metadata) -> Option<Encoding> {
    md.get(compression::ENCODING_KEY)
        .and_then(|e| std::str::from_utf8(e).ok())
        .and_then(Encoding::from_name)
}

/// What a response body gave.
pub(super) enum BodyEvent {
    Data(Option<Result<Bytes, h2::Error>>),
    Trailers(Result<Option<http::HeaderMap>, h2::Error>),
}

/// What a stream call sent while it waited for the server's concurrent-stream limit.
#[derive(Default)]
struct Early {
    message: Option<(crate::codec::Payload, Ack)>,
    half_close: bool,
}

/// How a call's loop goes on after a step.
pub(super) enum Step {
    Go,
    Done,
}

impl GrpcCall {
    pub(super) fn new(base: Arc<Base>, method: bytestring::ByteString, sink: Sink) -> GrpcCall {
        GrpcCall {
            deframer: Deframer::new(base.window, Some(base.budget.clone()))
                .with_spare(base.spare.clone()),
            base,
            method,
            outcome: Outcome::new(sink),
            compressed: false,
            encoding: None,
            unconsumed: 0,
            deferred: 0,
            withheld: 0,
            retry: None,
            unacked: None,
            half_close_after: false,
            half_closed: false,
            deadline: None,
        }
    }

    fn fail(&mut self, status: Status) {
        self.outcome.fail(status);
        self.over();
    }

    /// The call is over: a request message still waiting for room is told so.
    fn over(&mut self) {
        if let Some(ack) = self.unacked.take() {
            let _ = ack.send(Err(call_over()));
        }
    }

    fn h2_error(&self, e: &h2::Error) -> Status {
        let method = &*self.method;
        let address = &self.base.address;
        if let Some(why) = self.base.closed.get() {
            return Status::unavailable(format!("connection to {address} closed: {why}"));
        }
        match (e.is_remote(), e.is_go_away(), e.is_reset(), e.reason()) {
            // The server's graceful GOAWAY: streams past its last one were never processed.
            (true, true, _, Some(h2::Reason::NO_ERROR)) => Status::unavailable(format!(
                "{address} is going away ({e}); {method} was not processed and is safe to retry"
            )),
            // A server whose copy of the deadline (`grpc-timeout`) ran out first cancels the
            // stream; past the deadline that cancellation is the deadline's (as grpc-go reads it).
            (true, _, true, Some(h2::Reason::CANCEL))
                if self.deadline.is_some_and(|d| d <= Instant::now()) =>
            {
                Status::deadline_exceeded(format!(
                    "deadline exceeded: the server cancelled {method} when its deadline passed"
                ))
            }
            (true, _, true, Some(reason)) => Status::new(
                wire::reset_code(reason),
                format!("the server reset {method} ({reason})"),
            ),
            // h2 closed the connection over what the server sent.
            (false, true, _, Some(h2::Reason::ENHANCE_YOUR_CALM)) => Status::resource_exhausted(
                format!(
                    "{method}: the server's response headers are far over this channel's max_metadata_size; the connection to {address} was closed ({e})"
                ),
            ),
            // h2 refused one response (the connection goes on).
            (false, false, true, _) => Status::internal(format!(
                "{method}: the response was rejected ({e}): malformed, or its headers are over this channel's max_metadata_size of {} bytes",
                self.base.max_metadata
            )),
            _ if e.is_io() => {
                Status::unavailable(format!("connection to {address} lost: {e}"))
            }
            (true, ..) => Status::unavailable(format!("connection to {address} failed: {e}")),
            _ => Status::internal(format!("{method} on {address}: HTTP/2 error: {e}")),
        }
    }

    /// The request's head: `:path` = the method, gRPC's headers, the call's metadata.
    fn request(&self, call: &CallStart) -> Result<http::Request<()>, Status> {
        let path =
            PathAndQuery::from_maybe_shared(call.method.as_bytes().clone()).map_err(|_| {
                Status::invalid_argument(format!(
                    "{:?} is not a valid gRPC method path",
                    &*call.method
                ))
            })?;
        let uri = http::Uri::builder()
            .scheme(self.base.scheme.clone())
            .authority(self.base.authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|e| Status::invalid_argument(format!("{}: {e}", &*call.method)))?;
        let mut req = http::Request::new(());
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = uri;
        *req.version_mut() = http::Version::HTTP_2;
        let h = req.headers_mut();
        // The message format as gRPC names it: protobuf (and raw bytes, which are protobuf
        // to the server) is plain `application/grpc`.
        let content_type = match call.codec {
            crate::codec::CODEC_JSON => "application/grpc+json",
            _ => "application/grpc",
        };
        h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        h.insert(TE, HeaderValue::from_static("trailers"));
        if let Some(d) = call.deadline {
            h.insert(
                "grpc-timeout",
                wire::timeout_header(d.saturating_duration_since(Instant::now())),
            );
        }
        if let Some(e) = request_encoding(&call.metadata) {
            h.insert("grpc-encoding", HeaderValue::from_static(e.name()));
        }
        h.insert("grpc-accept-encoding", ACCEPT_ENCODING);
        wire::metadata_to_headers(&call.metadata, h)?;
        if !h.contains_key(USER_AGENT) {
            h.insert(
                USER_AGENT,
                HeaderValue::from_static(concat!("topspin/", env!("CARGO_PKG_VERSION"))),
            );
        }
        Ok(req)
    }

    /// Queues one request message on the stream, framed (`wire::Frame`: its prefix, then its
    /// segments as they are, no copy).
    fn write(
        &self,
        stream: &mut SendStream<Frame>,
        message: crate::codec::Payload,
        end: bool,
    ) -> Result<(), Status> {
        let frame = Frame::encoded(message, self.compressed)?;
        stream.send_data(frame, end).map_err(|e| self.h2_error(&e))
    }

    pub(super) async fn run(
        mut self,
        send: SendRequest<Frame>,
        mut call: CallStart,
        mut rx: mpsc::UnboundedReceiver<CallCmd>,
    ) {
        let deadline = call.deadline;
        self.deadline = deadline;
        // No deadline: a timer that never fires (the branch that polls it is off).
        let sleep = tokio::time::sleep_until(
            deadline
                .unwrap_or_else(crate::connection::far_future)
                .into(),
        );
        tokio::pin!(sleep);
        if deadline.is_some_and(|d| d <= Instant::now()) {
            return self.fail(expired_before_sent(&self.method));
        }
        self.compressed = request_encoding(&call.metadata).is_some();
        let req = match self.request(&call) {
            Ok(r) => r,
            Err(s) => return self.fail(s),
        };
        let mut early = Early::default();
        let mut send = match self.ready(send, &mut rx, sleep.as_mut(), &mut early).await {
            Ok(send) => send,
            Err(Some(st)) => return self.fail(st),
            Err(None) => return,
        };
        let one = call.message.take();
        let (response, mut stream) = match send.send_request(req, false) {
            Ok(r) => r,
            Err(e) => {
                if e.is_go_away() || e.is_io() {
                    self.base.shared.unusable.store(true, Ordering::Release);
                }
                // Nothing of the call was written.
                let st = refused_unsent(self.h2_error(&e));
                return self.fail(st);
            }
        };
        drop(send);
        if let Err(s) = self.first_write(&mut stream, one, early) {
            stream.send_reset(h2::Reason::CANCEL);
            return self.fail(s);
        }
        self.exchange(response, stream, rx, sleep, deadline.is_some())
            .await;
    }

    /// Waits for the server's concurrent-stream limit; a stream message or half-close of the
    /// call may arrive meanwhile (kept in `early`). `Err(None)`: the caller cancelled.
    async fn ready(
        &mut self,
        send: SendRequest<Frame>,
        rx: &mut mpsc::UnboundedReceiver<CallCmd>,
        mut sleep: std::pin::Pin<&mut tokio::time::Sleep>,
        early: &mut Early,
    ) -> Result<SendRequest<Frame>, Option<Status>> {
        let ready = send.ready();
        tokio::pin!(ready);
        loop {
            tokio::select! {
                r = &mut ready => return match r {
                    Ok(s) => Ok(s),
                    Err(e) => {
                        self.base.shared.unusable.store(true, Ordering::Release);
                        let st = self.h2_error(&e);
                        Err(Some(not_sent(st.message())))
                    }
                },
                () = &mut sleep, if self.deadline.is_some() => {
                    let what = "for the server's concurrent-stream limit";
                    return Err(Some(expired_while_waiting(&self.method, what)));
                }
                cmd = rx.recv() => match cmd {
                    Some(CallCmd::Send(m, ack)) => early.message = Some((m, ack)),
                    Some(CallCmd::HalfClose) => early.half_close = true,
                    Some(CallCmd::Credit(_)) => {}
                    Some(CallCmd::Cancel) | None => return Err(None),
                },
            }
        }
    }

    /// Queues the call's first data: its one request message (with END_STREAM), or what a
    /// stream sent while it waited to open.
    fn first_write(
        &mut self,
        stream: &mut SendStream<Frame>,
        one: Option<crate::codec::Payload>,
        early: Early,
    ) -> Result<(), Status> {
        if let Some(m) = one {
            self.half_closed = true;
            return self.write(stream, m, true);
        }
        let mut r = Ok(());
        if let Some((m, ack)) = early.message {
            r = self.write(stream, m, false);
            self.unacked = Some(ack);
            stream.reserve_capacity(1);
        }
        if early.half_close {
            self.half_close(stream);
        }
        r
    }

    fn half_close(&mut self, stream: &mut SendStream<Frame>) {
        if self.half_closed {
            return;
        }
        if self.unacked.is_some() {
            self.half_close_after = true;
            return;
        }
        self.half_closed = true;
        let _ = stream.send_data(Frame::empty(), true);
    }

    /// The call's life once its stream is open.
    async fn exchange(
        mut self,
        response: ResponseFuture,
        mut stream: SendStream<Frame>,
        mut rx: mpsc::UnboundedReceiver<CallCmd>,
        mut sleep: std::pin::Pin<&mut tokio::time::Sleep>,
        has_deadline: bool,
    ) {
        let mut response = Some(response);
        let mut body: Option<RecvStream> = None;
        let mut data_done = false;
        loop {
            let step = tokio::select! {
                r = async { response.as_mut().expect("guarded").await }, if response.is_some() => {
                    response = None;
                    match r {
                        Ok(r) => self.on_response(r, &mut body),
                        Err(e) => self.failed(&e),
                    }
                }
                ev = async {
                    let b = body.as_mut().expect("guarded");
                    if data_done {
                        BodyEvent::Trailers(b.trailers().await)
                    } else {
                        BodyEvent::Data(b.data().await)
                    }
                }, if body.is_some() => self.on_body(ev, &mut body, &mut data_done),
                cap = std::future::poll_fn(|cx| {
                    if stream.capacity() > 0 {
                        return std::task::Poll::Ready(Some(Ok(0)));
                    }
                    stream.poll_capacity(cx)
                }), if self.unacked.is_some() => self.on_capacity(cap, &mut stream),
                cmd = rx.recv() => match self.on_cmd(cmd, &mut stream, body.as_mut()) {
                    Some(step) => step,
                    None => return, // cancelled: the stream is reset
                },
                () = async { self.retry.as_mut().expect("guarded").await }, if self.retry.is_some() => {
                    self.on_retry(body.as_mut());
                    Step::Go
                }
                () = &mut sleep, if has_deadline => {
                    stream.send_reset(h2::Reason::CANCEL);
                    let m = format!("deadline exceeded waiting for {}", &*self.method);
                    self.fail(Status::deadline_exceeded(m));
                    Step::Done
                }
            };
            if let Step::Done = step {
                if self.outcome.is_over() && !data_done {
                    // Ended early (an error on this side): the server is told.
                    stream.send_reset(h2::Reason::CANCEL);
                }
                return;
            }
        }
    }

    /// The call fails with h2's error `e`; one the server never processed is marked so.
    fn failed(&mut self, e: &h2::Error) -> Step {
        let st = self.h2_error(e);
        if not_processed(e) {
            self.outcome.unprocessed(st);
            self.over();
        } else {
            self.fail(st);
        }
        Step::Done
    }

    /// Response data or trailers arrived.
    fn on_body(
        &mut self,
        ev: BodyEvent,
        body: &mut Option<RecvStream>,
        data_done: &mut bool,
    ) -> Step {
        match ev {
            BodyEvent::Data(Some(Ok(chunk))) => match body.as_mut() {
                Some(b) => self.on_data(chunk, b),
                None => Step::Done,
            },
            BodyEvent::Data(Some(Err(e))) | BodyEvent::Trailers(Err(e)) => self.failed(&e),
            BodyEvent::Data(None) => {
                *data_done = true;
                Step::Go
            }
            BodyEvent::Trailers(Ok(t)) => {
                self.on_trailers(t.as_ref());
                *data_done = true;
                Step::Done
            }
        }
    }

    /// The stream has room again: the message it waited for is taken (its sender told).
    fn on_capacity(
        &mut self,
        cap: Option<Result<usize, h2::Error>>,
        stream: &mut SendStream<Frame>,
    ) -> Step {
        if let Some(ack) = self.unacked.take() {
            let _ = ack.send(match cap {
                Some(Ok(_)) => Ok(()),
                Some(Err(e)) => Err(self.h2_error(&e)),
                None => Err(call_over()),
            });
        }
        if std::mem::take(&mut self.half_close_after) {
            self.half_close(stream);
        }
        Step::Go
    }

    /// A command from the caller; `None` once it cancelled (the stream reset).
    fn on_cmd(
        &mut self,
        cmd: Option<CallCmd>,
        stream: &mut SendStream<Frame>,
        body: Option<&mut RecvStream>,
    ) -> Option<Step> {
        match cmd {
            Some(CallCmd::Send(m, ack)) => {
                if self.half_closed || self.outcome.is_over() {
                    let _ = ack.send(Err(call_over()));
                    return Some(Step::Go);
                }
                match self.write(stream, m, false) {
                    Ok(()) => {
                        self.unacked = Some(ack);
                        stream.reserve_capacity(1);
                        Some(Step::Go)
                    }
                    Err(s) => {
                        let _ = ack.send(Err(s.clone()));
                        stream.send_reset(h2::Reason::CANCEL);
                        self.fail(s);
                        Some(Step::Done)
                    }
                }
            }
            Some(CallCmd::HalfClose) => {
                self.half_close(stream);
                Some(Step::Go)
            }
            Some(CallCmd::Credit(n)) => {
                self.consumed(n as usize, body);
                Some(Step::Go)
            }
            Some(CallCmd::Cancel) | None => {
                // RST_STREAM(CANCEL): the server's handler sees the call cancelled.
                stream.send_reset(h2::Reason::CANCEL);
                None
            }
        }
    }

    /// The response's head: a trailers-only response ends the call here.
    fn on_response(
        &mut self,
        r: http::Response<RecvStream>,
        body: &mut Option<RecvStream>,
    ) -> Step {
        let (head, recv) = r.into_parts();
        if head.headers.contains_key("grpc-status") {
            // Trailers-only: the whole answer is in these headers.
            self.on_trailers(Some(&head.headers));
            return Step::Done;
        }
        if head.status != http::StatusCode::OK {
            let code = wire::http_status_code(head.status);
            self.fail(Status::new(
                code,
                format!(
                    "{} answered {} with HTTP status {} and no grpc-status (is it a gRPC server?)",
                    self.base.address, &*self.method, head.status
                ),
            ));
            return Step::Done;
        }
        let grpc = head
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
        if !grpc {
            self.fail(Status::internal(format!(
                "{} answered {} with content-type {:?}, not application/grpc",
                self.base.address,
                &*self.method,
                head.headers.get(CONTENT_TYPE)
            )));
            return Step::Done;
        }
        match wire::header_encoding(&head.headers) {
            Ok(e) => self.encoding = e,
            Err(name) => {
                self.fail(Status::internal(format!(
                    "the server compresses {} with {name:?}, which this client does not decode (it accepts {})",
                    &*self.method,
                    wire::ACCEPT
                )));
                return Step::Done;
            }
        }
        self.outcome
            .on_headers(wire::metadata_from_headers(&head.headers));
        *body = Some(recv);
        Step::Go
    }

    /// The stream's consumer took messages worth `n` bytes of credit: given back, and the
    /// parts of a message under way kept back meanwhile once it has taken them all.
    fn consumed(&mut self, n: usize, body: Option<&mut RecvStream>) {
        self.unconsumed = self.unconsumed.saturating_sub(n);
        let mut release = n;
        if self.unconsumed == 0 {
            release += std::mem::take(&mut self.deferred);
        }
        if let Some(b) = body {
            let _ = b.flow_control().release_capacity(release);
        }
    }

    /// One DATA chunk: the messages it completes go to the sink.
    fn on_data(&mut self, chunk: Bytes, body: &mut RecvStream) -> Step {
        let n = chunk.len();
        self.deframer.push(chunk);
        let mut held = 0usize;
        // `Err(None)`: the outcome ended the call itself (a rule broken, its caller told).
        let r = loop {
            match self.deframer.next(self.base.limit, self.encoding) {
                Ok(Some(m)) => {
                    match self.outcome.on_message(
                        m.message,
                        m.credit as u32,
                        m.compressed,
                        &self.method,
                    ) {
                        Ok(h) => held += h as usize,
                        Err(Broken) => break Err(None),
                    }
                }
                Ok(None) => break Ok(()),
                Err(s) => break Err(Some(s)),
            }
        };
        // What no stream consumer holds is released now: parts of messages not yet complete
        // (a message larger than the window could otherwise never arrive) — unless the
        // memory budget has no room for what is gathered (then once it has), or the consumer
        // has messages still to take (then once it has taken them) — and the one response of
        // a unary-response call (bounded by max_message_size).
        self.unconsumed += held;
        self.free(n - held, body);
        match r {
            Ok(()) => Step::Go,
            Err(s) => {
                match s {
                    Some(s) => self.fail(s),
                    None => self.over(),
                }
                Step::Done
            }
        }
    }

    /// Gives back `free` bytes of credit no consumer holds, or keeps them back (see
    /// `withheld` and `deferred`).
    fn free(&mut self, free: usize, body: &mut RecvStream) {
        if self.deframer.must_wait() {
            self.withheld += free;
            if self.retry.is_none() {
                let at = tokio::time::Instant::now() + RETRY_WINDOW;
                self.retry = Some(Box::pin(tokio::time::sleep_until(at)));
            }
        } else if self.unconsumed == 0 {
            let _ = body.flow_control().release_capacity(free);
        } else {
            self.deferred += free;
        }
    }

    /// Time to look again whether the withheld credit can be given back.
    fn on_retry(&mut self, body: Option<&mut RecvStream>) {
        self.retry = None;
        let withheld = std::mem::take(&mut self.withheld);
        match body {
            Some(b) => self.free(withheld, b),
            None => self.withheld = withheld,
        }
    }

    /// The end of the call: its status from the trailers.
    fn on_trailers(&mut self, trailers: Option<&http::HeaderMap>) {
        let status = match trailers {
            Some(t) => wire::status_of(t, &self.method),
            None => Status::internal(format!(
                "the server ended {} without trailers (no grpc-status)",
                &*self.method
            )),
        };
        if status.is_ok() && !self.deframer.is_empty() {
            return self.fail(Status::internal(format!(
                "the response stream of {} ended in the middle of a message",
                &*self.method
            )));
        }
        self.over();
        // An error's trailers are in its status already (`status_of`).
        let md = match trailers {
            Some(t) if status.is_ok() => wire::metadata_from_headers(t),
            _ => Metadata::new(),
        };
        self.outcome.on_end(status, md, &self.method);
    }
}

/// Whether h2's error `e` says the server never processed the call: a stream it refused
/// (RST_STREAM REFUSED_STREAM, RFC 9113 §8.7), or one past the last stream id of its graceful
/// GOAWAY (h2 ends those at once with the GOAWAY's NO_ERROR). After a GOAWAY with an error code
/// the streams past its last id and those the closing connection then ends get the same error,
/// processed or not: none of them is marked.
fn not_processed(e: &h2::Error) -> bool {
    let refused = e.is_reset() && e.reason() == Some(h2::Reason::REFUSED_STREAM);
    let gone = e.is_go_away() && e.reason() == Some(h2::Reason::NO_ERROR);
    e.is_remote() && (refused || gone)
}
