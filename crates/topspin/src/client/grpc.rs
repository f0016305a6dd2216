//! gRPC client mode: a connection task that takes the same [`Cmd`]s as the topspin
//! connection (`conn.rs`) and feeds the same [`Sink`]s, but speaks gRPC over HTTP/2 (the `h2`
//! crate's client) to an existing gRPC server — tonic, grpc-go, grpcio, … — for the channels of
//! `grpc://host:port` (h2c, prior knowledge) and `grpcs://host:port` (TLS, ALPN `h2`)
//! addresses. The generated clients and every `Channel` call kind work unchanged.
//!
//! One router task keeps the calls of the connection by token and forwards their commands;
//! each call runs as a task of its own around its h2 stream: request headers (`:path` = the
//! method, `grpc-timeout` from the deadline, metadata), 5-byte-prefixed messages, response
//! headers, messages and trailers into the call's sink. Flow control stays bounded as on the
//! native protocol: a response stream's DATA is released to the server as the application
//! consumes its messages (`Cmd::Credit`), and a request stream's next message is taken only
//! once h2 has window for what was queued before it.

use super::conn::{CallStart, Cmd, ConnHandle, ConnShared, Sink, COMMAND_QUEUE};
use crate::compression::{self, Encoding};
use crate::connection::Ack;
use crate::grpc::wire::{self, CreditDeframer, Framed};
use crate::streaming::Item;
use crate::{Address, Config, Metadata, Response, Status};
use bytes::{BufMut, Bytes, BytesMut};
use h2::client::{ResponseFuture, SendRequest};
use h2::{RecvStream, SendStream};
use http::header::{HeaderValue, CONTENT_TYPE, TE, USER_AGENT};
use http::uri::{Authority, PathAndQuery, Scheme};
use rustc_hash::FxHashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};

/// Messages up to this size go out in one DATA frame with their prefix (copied behind it);
/// larger ones go as the prefix and the message as it is (no copy).
const COPY_BELOW: usize = 16 * 1024;

/// The encodings this client decodes, as announced in `grpc-accept-encoding`.
const ACCEPT_ENCODING: HeaderValue = HeaderValue::from_static(wire::ACCEPT);

/// What a call's task is told by the router.
#[derive(Debug)]
enum CallCmd {
    Send(crate::codec::Payload, Ack),
    HalfClose,
    Credit(u32),
    Cancel,
}

/// What every call of a connection shares.
#[derive(Debug)]
struct Base {
    address: Address,
    scheme: Scheme,
    authority: Authority,
    /// Largest response message accepted (also after decompression).
    limit: usize,
    /// What decompressed responses are charged to (`Config::memory_budget`).
    budget: Arc<topspin_proto::MemoryBudget>,
    shared: Arc<ConnShared>,
    /// Largest response header (and trailer) list accepted.
    max_metadata: u32,
    /// Why this side closed the connection (keep-alive), for the errors of its calls.
    closed: Arc<std::sync::OnceLock<String>>,
}

/// Runs a gRPC client connection over a connected byte stream (TCP, or TLS that negotiated
/// `h2`): the HTTP/2 handshake, then the connection's tasks.
pub(crate) async fn start<T>(
    io: T,
    address: &Address,
    config: &Config,
    scheme: Scheme,
) -> Result<ConnHandle, Status>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let what = |e: &dyn std::fmt::Display| {
        Status::unavailable(format!("could not connect to {address}: {e}"))
    };
    let authority = address
        .host_port()
        .and_then(|hp| Authority::try_from(hp).ok())
        .ok_or_else(|| what(&"the address has no host:port"))?;
    // Windows and header sizes bound what the server can make this side hold: per stream
    // `initial_call_window` of DATA not yet consumed, per connection eight of those, response
    // headers and trailers `max_metadata_size` (at least 8 KiB, what gRPC servers assume).
    let max_metadata = config.max_metadata_size().max(8 * 1024);
    let window = config
        .initial_call_window()
        .clamp(65_535, topspin_proto::MAX_WINDOW);
    let mut builder = h2::client::Builder::new();
    builder
        .initial_window_size(window)
        .initial_connection_window_size(window.saturating_mul(8).min(topspin_proto::MAX_WINDOW))
        .max_header_list_size(max_metadata)
        .max_frame_size(config.max_frame_size().clamp(16_384, 16_777_215))
        .enable_push(false);
    let (send, mut connection) = builder
        .handshake::<T, Bytes>(io)
        .await
        .map_err(|e| what(&format!("HTTP/2 handshake failed: {e}")))?;
    let shared = Arc::new(ConnShared::default());
    let mut pings = connection.ping_pong();
    let (stop, stopped) = oneshot::channel();
    let closed = Arc::new(std::sync::OnceLock::new());
    tokio::spawn(drive(
        connection,
        stopped,
        shared.clone(),
        closed.clone(),
        address.clone(),
    ));
    // One PING answered: the peer speaks HTTP/2 (a port that does not fails here, not at the
    // first call). The caller bounds the wait with the handshake timeout.
    if let Some(p) = pings.as_mut() {
        if let Err(e) = p.ping(h2::Ping::opaque()).await {
            let _ = stop.send(String::new());
            return Err(what(&format!(
                "no HTTP/2 answer ({e}): is it a gRPC server, and does its port use TLS (grpcs://)?"
            )));
        }
    }
    if let (Some(p), Some(every)) = (pings, config.keepalive_interval()) {
        tokio::spawn(keep_alive(p, every, config.keepalive_timeout(), stop));
    }
    let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
    // One message per ending call; the calls of a connection are bounded (the server's
    // concurrent-stream limit plus `Config::max_pending_calls`), so is this queue.
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let router = Router {
        send,
        base: Arc::new(Base {
            address: address.clone(),
            scheme,
            authority,
            limit: config.max_message_size() as usize,
            budget: config.memory_budget(),
            shared: shared.clone(),
            max_metadata,
            closed,
        }),
        calls: FxHashMap::default(),
        max_calls: config.max_pending_calls(),
        done_tx,
    };
    tokio::spawn(router.run(rx, done_rx, config.idle_timeout()));
    Ok(ConnHandle::new(tx, shared, None))
}

/// Drives the HTTP/2 connection until it ends or `stop` says why it must.
async fn drive<T>(
    mut connection: h2::client::Connection<T, Bytes>,
    mut stop: oneshot::Receiver<String>,
    shared: Arc<ConnShared>,
    closed: Arc<std::sync::OnceLock<String>>,
    address: Address,
) where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let why = tokio::select! {
        r = &mut connection => r.err().map(|e| e.to_string()),
        // (a dropped sender disables this branch: no keep-alive)
        Ok(why) = &mut stop => {
            let _ = closed.set(why.clone());
            Some(why)
        }
    };
    // Dropping the connection fails its open streams (UNAVAILABLE in their calls).
    shared.unusable.store(true, Ordering::Release);
    drop(connection);
    if let Some(why) = why {
        tracing::debug!("gRPC connection to {address} ended: {why}");
    }
}

/// Sends a PING every `every`; tells `stop` why the connection must close once one is not
/// answered within `timeout`.
async fn keep_alive(
    mut pings: h2::PingPong,
    every: Duration,
    timeout: Duration,
    mut stop: oneshot::Sender<String>,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.closed() => return,
        }
        let why = match tokio::time::timeout(timeout, pings.ping(h2::Ping::opaque())).await {
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => format!("keep-alive PING failed: {e}"),
            Err(_) => format!("keep-alive PING not answered within {timeout:?}"),
        };
        let _ = stop.send(why);
        return;
    }
}

/// Routes the channel's commands to the calls of one connection.
struct Router {
    send: SendRequest<Bytes>,
    base: Arc<Base>,
    /// The calls by token: at most `max_calls` plus the server's concurrent-stream limit.
    calls: FxHashMap<u64, mpsc::UnboundedSender<CallCmd>>,
    max_calls: usize,
    /// Each call's task sends its token here when it ends (at most one per call in `calls`).
    done_tx: mpsc::UnboundedSender<u64>,
}

impl Router {
    /// Runs until every handle is gone, or the connection has had no call for `idle`
    /// (`Config::idle_timeout`): then it is marked unusable (new calls go to a new connection)
    /// and closed.
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Cmd>,
        mut done_rx: mpsc::UnboundedReceiver<u64>,
        idle: Option<Duration>,
    ) {
        let idle_for = idle.unwrap_or(Duration::from_secs(86_400 * 365));
        let idle_timer = tokio::time::sleep(idle_for);
        tokio::pin!(idle_timer);
        let mut busy = false;
        loop {
            tokio::select! {
                biased;
                Some(token) = done_rx.recv() => {
                    self.calls.remove(&token);
                }
                cmd = rx.recv() => match cmd {
                    Some(cmd) => self.apply(cmd),
                    // Every handle is gone: nobody waits for an answer any more.
                    None => break,
                },
                () = &mut idle_timer, if idle.is_some() && self.calls.is_empty() => {
                    self.base.shared.unusable.store(true, Ordering::Release);
                    // What raced in is refused as not sent (safe to retry).
                    rx.close();
                    while let Ok(cmd) = rx.try_recv() {
                        self.apply(cmd);
                    }
                    tracing::debug!("gRPC connection to {} idle for {idle_for:?}: closing", self.base.address);
                    break;
                }
            }
            if !self.calls.is_empty() {
                busy = true;
            } else if std::mem::take(&mut busy) {
                idle_timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + idle_for);
            }
        }
    }

    fn forward(&mut self, token: u64, cmd: CallCmd) {
        let Some(tx) = self.calls.get(&token) else {
            if let CallCmd::Send(_, ack) = cmd {
                let _ = ack.send(Err(Status::cancelled("the call is over")));
            }
            return;
        };
        if let Err(mpsc::error::SendError(cmd)) = tx.send(cmd) {
            self.calls.remove(&token);
            if let CallCmd::Send(_, ack) = cmd {
                let _ = ack.send(Err(Status::cancelled("the call is over")));
            }
        }
    }

    fn apply(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Start(s) => self.start(s.into_parts()),
            Cmd::Batch(v) => v.into_iter().for_each(|s| self.start(s.into_parts())),
            Cmd::Send {
                token,
                message,
                ack,
            } => self.forward(token, CallCmd::Send(message, ack)),
            Cmd::HalfClose { token } => self.forward(token, CallCmd::HalfClose),
            Cmd::Credit { token, bytes } => self.forward(token, CallCmd::Credit(bytes)),
            Cmd::Cancel { token, .. } => {
                self.forward(token, CallCmd::Cancel);
                self.calls.remove(&token);
            }
        }
    }

    fn start(&mut self, (call, sink): (CallStart, Sink)) {
        if sink.abandoned() {
            return;
        }
        if self.base.shared.unusable.load(Ordering::Acquire) {
            sink.fail(Status::unavailable(format!(
                "the connection to {} closed; the call was not sent and is safe to retry",
                self.base.address
            )));
            return;
        }
        let room = self
            .max_calls
            .saturating_add(self.send.current_max_send_streams());
        if self.calls.len() >= room {
            sink.fail(Status::resource_exhausted(format!(
                "{}: {} calls are open or wait on this connection to {} (the server's concurrent-stream limit plus Config::max_pending_calls)",
                &*call.method,
                self.calls.len(),
                self.base.address
            )));
            return;
        }
        // Commands of one call: at most one request message in flight (its pump waits for the
        // ack), one half-close, a cancel, and credit for messages delivered (each message holds
        // at least 5 bytes of the stream's window, so at most window/5 of them).
        let (tx, rx) = mpsc::unbounded_channel();
        self.calls.insert(call.token, tx);
        let done = self.done_tx.clone();
        let (send, base) = (self.send.clone(), self.base.clone());
        tokio::spawn(async move {
            let token = call.token;
            GrpcCall::new(base, call.method.clone(), sink)
                .run(send, call, rx)
                .await;
            let _ = done.send(token);
        });
    }
}

/// One call on its h2 stream.
struct GrpcCall {
    base: Arc<Base>,
    method: bytestring::ByteString,
    /// `None` once the call's result went out.
    sink: Option<Sink>,
    /// Whether request messages carry topspin's flag byte (the call compresses).
    compressed: bool,
    /// Response headers (unary-response calls keep them for the `Response`).
    headers: Metadata,
    /// The one response message of a unary-response call.
    message: Option<Bytes>,
    /// The response's message encoding (`grpc-encoding`).
    encoding: Option<Encoding>,
    deframer: CreditDeframer,
    /// Credit of response messages handed to the stream's consumer and not given back yet.
    unconsumed: usize,
    /// Credit of parts of a message not yet complete, kept back while the consumer still has
    /// messages to take (released once it has taken them all): a reader that stops reading
    /// holds the server at the window, not the window plus the message under way.
    deferred: usize,
    /// The pump's ack for the message queued last, sent once h2 has window for it.
    unacked: Option<Ack>,
    half_close_after: bool,
    half_closed: bool,
    /// The call's deadline, if it has one.
    deadline: Option<Instant>,
}

/// Whether a topspin handshake failure's reason shows the peer's first bytes to be an HTTP/2
/// SETTINGS frame (`… (got [0, 0, 18, 4, 0, 0, 0, 0, …])`): a gRPC server, reached with a
/// `tcp://` address instead of `grpc://`.
pub(crate) fn answered_as_http2(reason: &str) -> bool {
    let Some(start) = reason.find("(got [").map(|i| i + "(got [".len()) else {
        return false;
    };
    let Some(len) = reason[start..].find(']') else {
        return false;
    };
    let bytes: Vec<u8> = reason[start..start + len]
        .split(", ")
        .filter_map(|b| u8::from_str_radix(b.trim(), 16).ok())
        .collect();
    // A frame header: 24-bit length, type 4 (SETTINGS), flags 0, stream 0.
    matches!(bytes.as_slice(), [_, _, _, 4, 0, 0, 0, 0, ..])
}

/// The encoding of a call's request messages: topspin's compression names it in the call's
/// metadata (and puts its flag byte before each message).
fn request_encoding(md: &Metadata) -> Option<Encoding> {
    md.get(compression::ENCODING_KEY)
        .and_then(|e| std::str::from_utf8(e).ok())
        .and_then(Encoding::from_name)
}

/// What a response body gave.
enum BodyEvent {
    Data(Option<Result<Bytes, h2::Error>>),
    Trailers(Result<Option<http::HeaderMap>, h2::Error>),
}

/// How a call's loop goes on after a step.
enum Step {
    Go,
    Done,
}

impl GrpcCall {
    fn new(base: Arc<Base>, method: bytestring::ByteString, sink: Sink) -> GrpcCall {
        GrpcCall {
            base,
            method,
            sink: Some(sink),
            compressed: false,
            headers: Metadata::new(),
            message: None,
            encoding: None,
            deframer: CreditDeframer::default(),
            unconsumed: 0,
            deferred: 0,
            unacked: None,
            half_close_after: false,
            half_closed: false,
            deadline: None,
        }
    }

    fn fail(&mut self, status: Status) {
        if let Some(sink) = self.sink.take() {
            sink.fail(status);
        }
        if let Some(ack) = self.unacked.take() {
            let _ = ack.send(Err(Status::cancelled("the call is over")));
        }
    }

    fn h2_error(&self, e: &h2::Error) -> Status {
        let method = &*self.method;
        let address = &self.base.address;
        if let Some(why) = self.base.closed.get() {
            return Status::unavailable(format!("connection to {address} closed: {why}"));
        }
        match (e.is_remote(), e.is_go_away(), e.is_reset(), e.reason()) {
            // The server's GOAWAY: streams past its last one were never processed.
            (true, true, _, _) => Status::unavailable(format!(
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

    /// Queues one request message (prefixed) on the stream: a small one copied behind its
    /// prefix as one DATA chunk, a large one as the prefix and then each of its segments as
    /// they are (no copy).
    fn write(
        &self,
        stream: &mut SendStream<Bytes>,
        message: crate::codec::Payload,
        end: bool,
    ) -> Result<(), Status> {
        let (flag, skip) = if self.compressed {
            // topspin's compression put its flag byte first: 0 as is, 1 compressed — gRPC's
            // compressed flag has the same meaning.
            let Some(&f) = message.segments().iter().find_map(|s| s.first()) else {
                return Err(Status::internal(
                    "a compressed call's message lacks its flag byte",
                ));
            };
            (f == 1, 1)
        } else {
            (false, 0)
        };
        let len = message.len() - skip;
        let prefix = wire::prefix(flag, len)?;
        let sent = if len < COPY_BELOW {
            // Our own request message, below COPY_BELOW: small and not peer-sized.
            let mut b = BytesMut::with_capacity(wire::PREFIX + len);
            b.put_slice(&prefix);
            for s in wire::segments_after(&message, skip) {
                b.put_slice(&s);
            }
            stream.send_data(b.freeze(), end)
        } else {
            let mut r = stream.send_data(Bytes::copy_from_slice(&prefix), false);
            let mut left = len;
            for s in wire::segments_after(&message, skip) {
                left -= s.len();
                r = r.and_then(|()| stream.send_data(s, end && left == 0));
            }
            r
        };
        sent.map_err(|e| self.h2_error(&e))
    }

    async fn run(
        mut self,
        send: SendRequest<Bytes>,
        mut call: CallStart,
        mut rx: mpsc::UnboundedReceiver<CallCmd>,
    ) {
        let deadline = call.deadline;
        self.deadline = deadline;
        let sleep = tokio::time::sleep_until(
            deadline
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365))
                .into(),
        );
        tokio::pin!(sleep);
        if deadline.is_some_and(|d| d <= Instant::now()) {
            let m = format!(
                "the deadline of {} passed before it was sent",
                &*self.method
            );
            return self.fail(Status::deadline_exceeded(m));
        }
        self.compressed = request_encoding(&call.metadata).is_some();
        let req = match self.request(&call) {
            Ok(r) => r,
            Err(s) => return self.fail(s),
        };
        // Wait for the server's concurrent-stream limit; a stream message or half-close of
        // the call may arrive meanwhile.
        let mut early: Option<(crate::codec::Payload, Ack)> = None;
        let mut early_half_close = false;
        let ready = send.ready();
        tokio::pin!(ready);
        let mut send = loop {
            tokio::select! {
                r = &mut ready => match r {
                    Ok(s) => break s,
                    Err(e) => {
                        self.base.shared.unusable.store(true, Ordering::Release);
                        let st = self.h2_error(&e);
                        return self.fail(Status::unavailable(format!(
                            "{}; the call was not sent and is safe to retry", st.message()
                        )));
                    }
                },
                () = &mut sleep, if deadline.is_some() => {
                    let m = format!(
                        "deadline exceeded while {} waited for the server's concurrent-stream limit",
                        &*self.method
                    );
                    return self.fail(Status::deadline_exceeded(m));
                }
                cmd = rx.recv() => match cmd {
                    Some(CallCmd::Send(m, ack)) => early = Some((m, ack)),
                    Some(CallCmd::HalfClose) => early_half_close = true,
                    Some(CallCmd::Credit(_)) => {}
                    Some(CallCmd::Cancel) | None => return,
                },
            }
        };
        let one = call.message.take();
        let (response, mut stream) = match send.send_request(req, false) {
            Ok(r) => r,
            Err(e) => {
                if e.is_go_away() || e.is_io() {
                    self.base.shared.unusable.store(true, Ordering::Release);
                }
                let st = self.h2_error(&e);
                return self.fail(st);
            }
        };
        drop(send);
        let queued = match one {
            Some(m) => {
                self.half_closed = true;
                self.write(&mut stream, m, true)
            }
            None => {
                let mut r = Ok(());
                if let Some((m, ack)) = early {
                    r = self.write(&mut stream, m, false);
                    self.unacked = Some(ack);
                    stream.reserve_capacity(1);
                }
                if early_half_close {
                    self.half_close(&mut stream);
                }
                r
            }
        };
        if let Err(s) = queued {
            stream.send_reset(h2::Reason::CANCEL);
            return self.fail(s);
        }
        self.exchange(response, stream, rx, sleep, deadline.is_some())
            .await;
    }

    fn half_close(&mut self, stream: &mut SendStream<Bytes>) {
        if self.half_closed {
            return;
        }
        if self.unacked.is_some() {
            self.half_close_after = true;
            return;
        }
        self.half_closed = true;
        let _ = stream.send_data(Bytes::new(), true);
    }

    /// The call's life once its stream is open.
    async fn exchange(
        mut self,
        response: ResponseFuture,
        mut stream: SendStream<Bytes>,
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
                        Err(e) => {
                            let st = self.h2_error(&e);
                            self.fail(st);
                            Step::Done
                        }
                    }
                }
                ev = async {
                    let b = body.as_mut().expect("guarded");
                    if data_done {
                        BodyEvent::Trailers(b.trailers().await)
                    } else {
                        BodyEvent::Data(b.data().await)
                    }
                }, if body.is_some() => match ev {
                    BodyEvent::Data(Some(Ok(chunk))) => {
                        let b = body.as_mut().expect("guarded");
                        self.on_data(chunk, b)
                    }
                    BodyEvent::Data(Some(Err(e))) => {
                        let st = self.h2_error(&e);
                        self.fail(st);
                        Step::Done
                    }
                    BodyEvent::Data(None) => {
                        data_done = true;
                        Step::Go
                    }
                    BodyEvent::Trailers(Ok(t)) => {
                        self.on_trailers(t.as_ref());
                        data_done = true;
                        Step::Done
                    }
                    BodyEvent::Trailers(Err(e)) => {
                        let st = self.h2_error(&e);
                        self.fail(st);
                        Step::Done
                    }
                },
                cap = std::future::poll_fn(|cx| {
                    if stream.capacity() > 0 {
                        return std::task::Poll::Ready(Some(Ok(0)));
                    }
                    stream.poll_capacity(cx)
                }), if self.unacked.is_some() => {
                    if let Some(ack) = self.unacked.take() {
                        match cap {
                            Some(Ok(_)) => {
                                let _ = ack.send(Ok(()));
                            }
                            Some(Err(e)) => {
                                let _ = ack.send(Err(self.h2_error(&e)));
                            }
                            None => {
                                let _ = ack.send(Err(Status::cancelled("the call is over")));
                            }
                        }
                    }
                    if std::mem::take(&mut self.half_close_after) {
                        self.half_close(&mut stream);
                    }
                    Step::Go
                }
                cmd = rx.recv() => match cmd {
                    Some(CallCmd::Send(m, ack)) => {
                        if self.half_closed || self.sink.is_none() {
                            let _ = ack.send(Err(Status::cancelled("the call is over")));
                            Step::Go
                        } else {
                            match self.write(&mut stream, m, false) {
                                Ok(()) => {
                                    self.unacked = Some(ack);
                                    stream.reserve_capacity(1);
                                    Step::Go
                                }
                                Err(s) => {
                                    let _ = ack.send(Err(s.clone()));
                                    stream.send_reset(h2::Reason::CANCEL);
                                    self.fail(s);
                                    Step::Done
                                }
                            }
                        }
                    }
                    Some(CallCmd::HalfClose) => {
                        self.half_close(&mut stream);
                        Step::Go
                    }
                    Some(CallCmd::Credit(n)) => {
                        self.consumed(n as usize, body.as_mut());
                        Step::Go
                    }
                    Some(CallCmd::Cancel) | None => {
                        // RST_STREAM(CANCEL): the server's handler sees the call cancelled.
                        stream.send_reset(h2::Reason::CANCEL);
                        return;
                    }
                },
                () = &mut sleep, if has_deadline => {
                    stream.send_reset(h2::Reason::CANCEL);
                    let m = format!("deadline exceeded waiting for {}", &*self.method);
                    self.fail(Status::deadline_exceeded(m));
                    Step::Done
                }
            };
            if let Step::Done = step {
                if self.sink.is_none() && !data_done {
                    // Ended early (an error on this side): the server is told.
                    stream.send_reset(h2::Reason::CANCEL);
                }
                return;
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
        let md = wire::metadata_from_headers(&head.headers);
        match &mut self.sink {
            Some(Sink::Stream { headers, .. }) => {
                if let Some(h) = headers.take() {
                    let _ = h.send(Ok(md));
                }
            }
            _ => self.headers = md,
        }
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
        let (limit, budget) = (self.base.limit, &self.base.budget);
        let (encoding, method) = (self.encoding, self.method.clone());
        let sink = &mut self.sink;
        let message = &mut self.message;
        let mut held = 0usize;
        let r = self.deframer.push(chunk, limit, |f: Framed| {
            let m = wire::unframe(f.compressed, f.message, encoding, limit, Some(budget))?;
            match sink {
                Some(Sink::Stream { items, .. }) => {
                    held += f.credit;
                    // The consumer gives this credit back (Cmd::Credit) as it takes the message.
                    let _ = items.send(Item::Message(m, f.credit as u32));
                    Ok(())
                }
                Some(Sink::Unary(_)) if message.is_none() => {
                    *message = Some(m);
                    Ok(())
                }
                Some(Sink::Unary(_)) => Err(Status::internal(format!(
                    "the server sent more than one response message for {}, which expects one",
                    &*method
                ))),
                None => Ok(()),
            }
        });
        // What no stream consumer holds is released now: parts of messages not yet complete
        // (a message larger than the window could otherwise never arrive) — unless the
        // consumer has messages still to take: then once it has taken them — and the one
        // response of a unary-response call (bounded by max_message_size).
        self.unconsumed += held;
        let free = n - held;
        if self.unconsumed == 0 {
            let _ = body.flow_control().release_capacity(free);
        } else {
            self.deferred += free;
        }
        match r {
            Ok(_) => Step::Go,
            Err(s) => {
                self.fail(s);
                Step::Done
            }
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
        if status.is_ok() && self.deframer.partial() {
            return self.fail(Status::internal(format!(
                "the response stream of {} ended in the middle of a message",
                &*self.method
            )));
        }
        if let Some(ack) = self.unacked.take() {
            let _ = ack.send(Err(Status::cancelled("the call is over")));
        }
        let Some(sink) = self.sink.take() else {
            return;
        };
        if !status.is_ok() {
            return sink.fail(status);
        }
        let md = trailers
            .map(wire::metadata_from_headers)
            .unwrap_or_default();
        match sink {
            Sink::Unary(tx) => {
                let r = match self.message.take() {
                    Some(m) => Ok(Response::from_parts(
                        m,
                        std::mem::take(&mut self.headers),
                        md,
                    )),
                    None => Err(Status::internal(format!(
                        "the server ended {} with OK but sent no response message",
                        &*self.method
                    ))),
                };
                let _ = tx.send(r);
            }
            Sink::Stream { headers, items } => {
                if let Some(h) = headers {
                    let _ = h.send(Ok(Metadata::new()));
                }
                let _ = items.send(Item::End(Ok(md)));
            }
        }
    }
}
