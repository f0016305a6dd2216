//! WebSocket (RFC 6455, feature `websocket`): `ws://host:port/path` and, with `tls`,
//! `wss://host:port/path`. The topspin byte stream travels in binary messages whose boundaries
//! carry no meaning (protocol.md, "Transports"); the subprotocol is `topspin.v1`
//! ([`SUBPROTOCOL`]). Framing and the handshake are tokio-tungstenite's.
//!
//! A server bound to a `ws://` address accepts upgrades on that path only, requires the
//! `topspin.v1` subprotocol and refuses (403) an upgrade whose `Origin` is neither the server's
//! own (same scheme-less host and port as `Host`) nor listed with
//! [`WebSocketSettings::allow_origins`]: a web page from another site cannot call a server on
//! localhost or an intranet (cross-site WebSocket hijacking). Requests without `Origin` (not
//! from a browser) are accepted; [`WebSocketSettings::allow_any_origin`] opts out. Bad input ends that one
//! connection, with the close code RFC 6455 names: a text message 1003, a protocol violation
//! (an unmasked client frame, a bad opcode) 1002, a message over the size bound 1009, invalid
//! UTF-8 in a close reason 1007.

use bytes::{Buf, Bytes, BytesMut};
use futures_sink::Sink;
use futures_util::Stream;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;
use topspin_proto::MemoryBudget;

mod handshake;
pub(crate) use handshake::{accept, dial};

/// The WebSocket subprotocol of topspin (`Sec-WebSocket-Protocol`); a server requires it.
pub const SUBPROTOCOL: &str = "topspin.v1";

/// The most bytes one outgoing message carries: larger writes go out as several messages.
const MAX_OUT_MESSAGE: usize = 256 * 1024;

/// The largest incoming WebSocket message by default: four times what senders keep to
/// (protocol.md §14.2). A message being reassembled is held by the WebSocket library, outside
/// the memory budget past [`FREE_HELD`], so this is kept small.
const DEFAULT_MAX_MESSAGE: usize = 1024 * 1024;

/// Bytes of a message being received that a connection holds without charge (as a socket's
/// own buffer would); every byte held past it is charged to the memory budget, and while less
/// than a quarter of the budget is left the connection reads no further: that last quarter is
/// kept for the messages of calls, which handlers consume and give back, so connections
/// that never finish a message cannot starve the others' calls.
const FREE_HELD: usize = 64 * 1024;

/// How often a connection that waits for the memory budget looks again.
const BUDGET_RETRY: Duration = Duration::from_millis(20);

/// What a connection's received messages may cost: bytes past [`FREE_HELD`] charged to
/// `budget`; a message that stops arriving is cut after `frame_timeout`.
#[derive(Clone, Debug)]
struct Bounds {
    budget: Arc<MemoryBudget>,
    frame_timeout: Duration,
}

/// WebSocket settings of a server or client.
///
/// ```
/// use topspin::ws::WebSocketSettings;
/// let s = WebSocketSettings::default()
///     .allow_origins(["https://app.example.com"])
///     .max_message_size(1 << 20);
/// assert_eq!(s.get_max_message_size(), 1 << 20);
/// ```
#[derive(Clone, Debug)]
pub struct WebSocketSettings {
    /// Origins accepted besides the server's own.
    origins: Arc<[String]>,
    any_origin: bool,
    max_message_size: usize,
    path: String,
    /// Set by the server or endpoint from its [`Config`](crate::Config).
    bounds: Option<Bounds>,
}

impl Default for WebSocketSettings {
    fn default() -> WebSocketSettings {
        WebSocketSettings {
            origins: Arc::from([]),
            any_origin: false,
            max_message_size: DEFAULT_MAX_MESSAGE,
            path: "/".to_owned(),
            bounds: None,
        }
    }
}

impl WebSocketSettings {
    /// Servers: accept upgrades from pages of these origins too (exactly as browsers send
    /// them, e.g. `https://app.example.com`; `http://localhost:*` for any port of one scheme and
    /// host), besides the server's own origin (whose host and port are the `Host` header's).
    /// Requests without `Origin` (not from a browser) are always accepted. Default: only the
    /// server's own origin.
    pub fn allow_origins<I, S>(mut self, origins: I) -> WebSocketSettings
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.origins = origins.into_iter().map(Into::into).collect();
        self
    }

    /// Servers: accept upgrades whatever their `Origin` — any web page a browser shows may then
    /// call this server with the browser's network position and cookies. Only for servers whose
    /// calls carry their own credentials (tokens in metadata) and that no intranet trust covers.
    pub fn allow_any_origin(mut self) -> WebSocketSettings {
        self.any_origin = true;
        self
    }

    /// Whether an upgrade with this `Origin` (and `Host`) may go on.
    fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        if self.any_origin {
            return true;
        }
        let listed = self.origins.iter().any(|a| match a.strip_suffix('*') {
            Some(prefix) if prefix.ends_with(':') => origin
                .strip_prefix(prefix)
                .is_some_and(|port| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())),
            _ => a == origin,
        });
        listed || host.is_some_and(|h| same_origin(origin, h))
    }

    /// The largest WebSocket message (and frame) accepted; a larger one closes the connection
    /// with 1009 (default 1 MiB; at least 256 KiB). Senders keep messages to 256 KiB.
    pub fn max_message_size(mut self, bytes: usize) -> WebSocketSettings {
        self.max_message_size = bytes.max(MAX_OUT_MESSAGE);
        self
    }

    /// The path a sniffing server ([`ServerBuilder::sniff_transports`]) accepts WebSocket
    /// upgrades on (default `/`); a `ws://` address names its own.
    ///
    /// [`ServerBuilder::sniff_transports`]: crate::ServerBuilder::sniff_transports
    pub fn path(mut self, path: &str) -> WebSocketSettings {
        self.path = path.to_owned();
        self
    }

    pub(crate) fn get_path(&self) -> &str {
        &self.path
    }

    /// These settings with the memory budget and frame timeout of `config` applied to every
    /// message being received.
    pub(crate) fn bounded_by(&self, config: &crate::Config) -> WebSocketSettings {
        WebSocketSettings {
            bounds: Some(Bounds {
                budget: config.memory_budget(),
                frame_timeout: config.frame_timeout(),
            }),
            ..self.clone()
        }
    }

    /// The bound set by [`WebSocketSettings::max_message_size`].
    pub fn get_max_message_size(&self) -> usize {
        self.max_message_size
    }

    fn config(&self) -> WebSocketConfig {
        WebSocketConfig::default()
            .max_message_size(Some(self.max_message_size))
            .max_frame_size(Some(self.max_message_size))
            .accept_unmasked_frames(false)
    }

    /// Checks an upgrade request (path, subprotocol, origin) and answers it.
    #[allow(clippy::result_large_err)] // tungstenite's callback type
    fn check(
        &self,
        path: &str,
        req: &Request,
        mut resp: Response,
    ) -> Result<Response, ErrorResponse> {
        let refuse = |status: StatusCode, why: &str| {
            let mut r = ErrorResponse::new(Some(why.to_owned()));
            *r.status_mut() = status;
            r
        };
        if req.uri().path() != path {
            return Err(refuse(
                StatusCode::NOT_FOUND,
                "no topspin endpoint at this path",
            ));
        }
        let offered = req
            .headers()
            .get_all("sec-websocket-protocol")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|p| p.trim() == SUBPROTOCOL);
        if !offered {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "Sec-WebSocket-Protocol must offer topspin.v1",
            ));
        }
        if let Some(origin) = req.headers().get("origin") {
            let host = req.headers().get("host").and_then(|h| h.to_str().ok());
            let ok = origin.to_str().is_ok_and(|o| self.origin_allowed(o, host));
            if !ok {
                return Err(refuse(
                    StatusCode::FORBIDDEN,
                    "origin not allowed (WebSocketSettings::allow_origins)",
                ));
            }
        }
        resp.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_static(SUBPROTOCOL),
        );
        Ok(resp)
    }
}

/// Whether `origin` (`scheme://host[:port]`, as browsers send it) names the host and port of
/// `host` (the request's `Host` header): the page comes from the server itself. Ports left out
/// are the scheme's default; hosts compare without case.
fn same_origin(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false; // "null" and the like
    };
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" | "ws" => "80",
        "https" | "wss" => "443",
        _ => return false,
    };
    let with_port = |a: &str| -> String {
        let a = a.to_ascii_lowercase();
        // A port follows the last ':' unless it is inside an IPv6 literal.
        if a.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']')) {
            a
        } else {
            format!("{a}:{default}")
        }
    };
    !authority.is_empty() && with_port(authority) == with_port(host)
}

/// The most bytes of an HTTP request head a server reads before the upgrade (tungstenite's
/// own bound is larger; an upgrade request is a few hundred bytes).
const MAX_HEAD: usize = 16 * 1024;

/// The answer to an HTTP request that is not a WebSocket upgrade (RFC 9110 §15.5.22).
const UPGRADE_REQUIRED: &[u8] = b"HTTP/1.1 426 Upgrade Required\r\n\
Upgrade: websocket\r\n\
Connection: Upgrade, close\r\n\
Sec-WebSocket-Version: 13\r\n\
Sec-WebSocket-Protocol: topspin.v1\r\n\
Content-Type: text/plain; charset=utf-8\r\n\
Content-Length: 76\r\n\
\r\n\
a topspin endpoint: connect with a WebSocket client, subprotocol topspin.v1\n";

/// Reads a request head (through its blank line), at most [`MAX_HEAD`] bytes; what the client
/// sent after it stays in the returned bytes.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Bytes, String> {
    use bytes::BufMut;
    use tokio::io::AsyncReadExt;
    let mut buf = BytesMut::with_capacity(1024);
    loop {
        let from = buf.len().saturating_sub(3);
        if buf.len() >= MAX_HEAD {
            return Err(format!(
                "WebSocket handshake failed: the request head passed {MAX_HEAD} bytes"
            ));
        }
        let room = MAX_HEAD - buf.len();
        let n = stream
            .read_buf(&mut (&mut buf).limit(room))
            .await
            .map_err(|e| format!("WebSocket handshake failed: {e}"))?;
        if n == 0 {
            return Err("WebSocket handshake failed: the client closed during the request".into());
        }
        if buf[from..].windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(buf.freeze());
        }
    }
}

/// Whether a request head starts with an HTTP/1 request line (`GET /path HTTP/1.1`).
fn is_http(head: &[u8]) -> bool {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    line.first().is_some_and(u8::is_ascii_uppercase)
        && (line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0"))
}

/// Whether a request head asks for a WebSocket (`Upgrade: websocket`); anything else, even
/// unparsable, goes on to tungstenite only if it does.
fn is_upgrade(head: &[u8]) -> bool {
    head.split(|&b| b == b'\n').skip(1).any(|line| {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return false;
        };
        line[..colon].trim_ascii().eq_ignore_ascii_case(b"upgrade")
            && line[colon + 1..]
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"websocket"))
    })
}

/// A server's stream whose request head was read ahead: reads give the head again first.
#[derive(Debug)]
pub(crate) struct Replay<S> {
    head: Bytes,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Replay<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.head.is_empty() {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let n = self.head.len().min(buf.remaining());
        buf.put_slice(&self.head[..n]);
        self.head.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replay<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A byte stream that counts the bytes read from it since the count was last reset: what the
/// WebSocket library holds of a message not yet complete.
#[derive(Debug)]
pub(crate) struct Metered<S> {
    inner: S,
    read: usize,
}

impl<S> Metered<S> {
    fn new(inner: S) -> Metered<S> {
        Metered { inner, read: 0 }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    #[inline]
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.read += buf.filled().len() - before;
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    #[inline]
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    #[inline]
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    #[inline]
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What a connection holds of received messages, and its charge to the memory budget.
#[derive(Debug)]
struct Held {
    bounds: Option<Bounds>,
    /// Bytes charged to `bounds.budget` now.
    charged: usize,
    /// When the message being received must be complete.
    deadline: Option<Instant>,
    /// Wakes the reader at `deadline`, or to look at the budget again.
    timer: Option<Pin<Box<Sleep>>>,
}

/// A WebSocket as a byte stream: binary messages in, binary messages out.
#[derive(Debug)]
pub(crate) struct WsStream<S> {
    ws: WebSocketStream<Metered<S>>,
    /// The rest of the last message received.
    pending: Bytes,
    /// Outgoing bytes, reclaimed in place once the socket layer has copied a message out.
    out: BytesMut,
    eof: bool,
    held: Held,
}

/// The close code for a receive error (RFC 6455 §7.4.1).
fn close_code(e: &WsError) -> Option<CloseCode> {
    match e {
        WsError::Capacity(_) => Some(CloseCode::Size),
        WsError::Protocol(_) => Some(CloseCode::Protocol),
        WsError::Utf8(_) => Some(CloseCode::Invalid),
        _ => None,
    }
}

fn io_error(e: WsError) -> io::Error {
    match e {
        WsError::Io(e) => e,
        WsError::ConnectionClosed | WsError::AlreadyClosed => {
            io::Error::new(io::ErrorKind::BrokenPipe, "the WebSocket is closed")
        }
        // The peer's socket closed without a close frame (a process that died, a server task
        // dropped): the connection ended, not a protocol error of the peer's.
        WsError::Protocol(
            tokio_tungstenite::tungstenite::error::ProtocolError::ResetWithoutClosingHandshake,
        ) => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the WebSocket peer closed the connection without a closing handshake",
        ),
        other => io::Error::new(io::ErrorKind::InvalidData, format!("WebSocket: {other}")),
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsStream<S> {
    fn new(mut ws: WebSocketStream<Metered<S>>, bounds: Option<Bounds>) -> WsStream<S> {
        // The upgrade's HTTP bytes were read through the meter; they are no message. (What
        // the handshake read past its blank line, the start of a first frame, goes uncounted
        // until that message's end: at most one handshake read, far under FREE_HELD.)
        ws.get_mut().read = 0;
        WsStream {
            ws,
            pending: Bytes::new(),
            out: BytesMut::new(),
            eof: false,
            held: Held {
                bounds,
                charged: 0,
                deadline: None,
                timer: None,
            },
        }
    }

    /// The stream under the WebSocket.
    pub(crate) fn get_ref(&self) -> &S {
        &self.ws.get_ref().inner
    }

    /// Brings the budget charge to what is held past [`FREE_HELD`]: the bytes read of a message
    /// not yet complete and the undelivered rest of the last one.
    #[inline]
    fn settle(&mut self) {
        let Some(b) = &self.held.bounds else { return };
        let held = self.ws.get_ref().read + self.pending.len();
        let due = held.saturating_sub(FREE_HELD);
        if due == self.held.charged {
            return; // the common case: a message under FREE_HELD, nothing charged
        }
        if due > self.held.charged {
            b.budget.charge(due - self.held.charged);
        } else {
            b.budget.release(self.held.charged - due);
        }
        self.held.charged = due;
    }

    /// A whole message (or control frame) came out: what was read for it is now `pending`.
    fn at_boundary(&mut self) {
        self.ws.get_mut().read = 0;
        self.held.deadline = None;
    }

    /// Whether the connection must not read on: past [`FREE_HELD`] of a message, with less
    /// than a quarter of the memory budget left.
    fn must_wait(&self) -> bool {
        self.held.bounds.as_ref().is_some_and(|b| {
            self.ws.get_ref().read > FREE_HELD && b.budget.is_short_of(b.budget.limit() / 4)
        })
    }

    /// No message is ready. With part of one held, the frame deadline runs (from when the
    /// message was first seen incomplete) and the reader is woken at it — or in
    /// [`BUDGET_RETRY`] when `waiting` for the budget. Past the deadline the connection fails.
    fn poll_stalled(&mut self, cx: &mut Context<'_>, waiting: bool) -> Poll<io::Result<()>> {
        let Some(b) = &self.held.bounds else {
            return Poll::Pending;
        };
        if self.ws.get_ref().read == 0 {
            return Poll::Pending;
        }
        let now = Instant::now();
        let deadline = *self.held.deadline.get_or_insert(now + b.frame_timeout);
        if now >= deadline {
            self.fail(cx, CloseCode::Policy, "a message stopped arriving");
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "WebSocket: a message stopped arriving (frame_timeout)",
            )));
        }
        let wake = if waiting {
            deadline.min(now + BUDGET_RETRY)
        } else {
            deadline
        };
        let timer = self
            .held
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(wake)));
        if timer.deadline() != wake {
            timer.as_mut().reset(wake);
        }
        if std::future::Future::poll(timer.as_mut(), cx).is_ready() {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    /// Starts a close handshake with `code` without waiting (the connection is failing).
    fn fail(&mut self, cx: &mut Context<'_>, code: CloseCode, why: &'static str) {
        let frame = CloseFrame {
            code,
            reason: why.into(),
        };
        let mut ws = Pin::new(&mut self.ws);
        if let Poll::Ready(Ok(())) = ws.as_mut().poll_ready(cx) {
            if ws.as_mut().start_send(Message::Close(Some(frame))).is_ok() {
                let _ = ws.poll_flush(cx);
            }
        }
    }

    /// Runs a WebSocket server over an already connected stream (the handshake was done by
    /// someone else): for tests and benchmarks.
    #[allow(dead_code)]
    pub(crate) async fn from_raw(stream: S, role: Role, settings: &WebSocketSettings) -> Self {
        let ws =
            WebSocketStream::from_raw_socket(Metered::new(stream), role, Some(settings.config()))
                .await;
        WsStream::new(ws, settings.bounds.clone())
    }
}

impl<S> Drop for WsStream<S> {
    fn drop(&mut self) {
        if let Some(b) = &self.held.bounds {
            b.budget.release(self.held.charged);
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.pending.is_empty() {
                let n = this.pending.len().min(buf.remaining());
                buf.put_slice(&this.pending[..n]);
                this.pending.advance(n);
                if this.held.charged > 0 {
                    this.settle();
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            if this.must_wait() {
                ready!(this.poll_stalled(cx, true))?;
                continue;
            }
            let next = Pin::new(&mut this.ws).poll_next(cx);
            if next.is_ready() {
                this.at_boundary();
            }
            this.settle();
            let Poll::Ready(next) = next else {
                if this.ws.get_ref().read == 0 {
                    return Poll::Pending; // no message begun: no frame deadline to run
                }
                ready!(this.poll_stalled(cx, false))?;
                continue;
            };
            match next {
                Some(Ok(Message::Binary(b))) => {
                    this.pending = b;
                    this.settle();
                }
                Some(Ok(Message::Text(_))) => {
                    this.fail(
                        cx,
                        CloseCode::Unsupported,
                        "topspin.v1 carries binary messages only",
                    );
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "WebSocket: a text message (topspin.v1 is binary only); closed with 1003",
                    )));
                }
                // The close reply is queued by tungstenite and sent on the next write or read.
                Some(Ok(Message::Close(_))) | None => this.eof = true,
                Some(Ok(_)) => {} // ping (answered by tungstenite), pong
                Some(Err(e)) => {
                    if let Some(code) = close_code(&e) {
                        this.fail(cx, code, "protocol violation");
                    }
                    return Poll::Ready(Err(io_error(e)));
                }
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let mut ws = Pin::new(&mut this.ws);
        ready!(ws.as_mut().poll_ready(cx)).map_err(io_error)?;
        // One message for as much of the slices as fits (a copy, into a reclaimed buffer).
        let mut taken = 0;
        for b in bufs {
            let n = b.len().min(MAX_OUT_MESSAGE - taken);
            this.out.extend_from_slice(&b[..n]);
            taken += n;
            if taken == MAX_OUT_MESSAGE {
                break;
            }
        }
        if taken == 0 {
            return Poll::Ready(Ok(0));
        }
        let msg = this.out.split().freeze();
        ws.start_send(Message::Binary(msg)).map_err(io_error)?;
        Poll::Ready(Ok(taken))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().ws)
            .poll_flush(cx)
            .map_err(io_error)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match ready!(Pin::new(&mut self.get_mut().ws).poll_close(cx)) {
            Ok(()) | Err(WsError::ConnectionClosed | WsError::AlreadyClosed) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }
}

#[cfg(test)]
mod origin_tests;
#[cfg(test)]
mod tests;
