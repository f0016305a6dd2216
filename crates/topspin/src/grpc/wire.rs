//! gRPC over HTTP/2 on the wire (PROTOCOL-HTTP2.md and http-grpc-status-mapping.md of
//! grpc/grpc), free of I/O and shared by both sides — the server's gRPC face (`server.rs`,
//! feature `grpc`) and the client's gRPC mode (`client/grpc.rs`, always built): the 5-byte
//! message prefix and the deframers, `grpc-timeout` both ways, metadata to and from HTTP/2
//! headers (`-bin` values in base64, reserved headers left out), the status both ways
//! (`grpc-status`, `grpc-message` percent-encoded, `grpc-status-details-bin`) and the encoding
//! headers. Items only the server uses are compiled with its feature.

#[cfg(feature = "grpc")]
use crate::compression::Compression;
use crate::compression::{self, Encoding};
use crate::{Code, Status};
use base64::Engine as _;
use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use std::time::Duration;
use topspin_proto::Metadata;

/// Bytes before each message: the compressed flag and the length (big-endian u32).
pub(crate) const PREFIX: usize = 5;

/// Request and response content type.
#[cfg(feature = "grpc")]
pub(crate) const CONTENT_TYPE: &str = "application/grpc";
/// What this side can decode, as sent in `grpc-accept-encoding`.
pub(crate) const ACCEPT: &str = "gzip,zstd";

/// The largest number `grpc-timeout` may carry (8 digits).
const TIMEOUT_MAX: u128 = 99_999_999;

/// base64 as gRPC writes it (standard alphabet, no padding) and reads it (padded or not).
const B64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// Bytes of `grpc-message` written as they are: printable ASCII but `%` (gRPC's rule).
#[cfg(feature = "grpc")]
const MESSAGE_ESCAPES: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');

/// `grpc-timeout`: up to 8 digits and a unit (`H M S m u n`). `Err` (INTERNAL) if malformed.
///
/// ```ignore
/// assert_eq!(parse_timeout(b"100m"), Ok(Duration::from_millis(100)));
/// ```
#[cfg_attr(not(feature = "grpc"), allow(dead_code))] // the server's; tests use it too
pub(crate) fn parse_timeout(v: &[u8]) -> Result<Duration, Status> {
    let bad = || {
        Status::internal(format!(
            "malformed grpc-timeout {:?}",
            String::from_utf8_lossy(v)
        ))
    };
    let (&unit, digits) = v.split_last().ok_or_else(bad)?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    let n: u64 = digits.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0'));
    Ok(match unit {
        b'H' => Duration::from_secs(n.saturating_mul(3600)),
        b'M' => Duration::from_secs(n.saturating_mul(60)),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return Err(bad()),
    })
}

/// `grpc-timeout` for a duration: at most 8 digits and the finest unit that holds it,
/// rounded up so the server never gives up before the client does.
pub(crate) fn timeout_header(d: Duration) -> HeaderValue {
    let nanos = d.as_nanos();
    let units: [(u128, &str); 6] = [
        (1, "n"),
        (1_000, "u"),
        (1_000_000, "m"),
        (1_000_000_000, "S"),
        (60_000_000_000, "M"),
        (3_600_000_000_000, "H"),
    ];
    for (per, unit) in units {
        let n = nanos.div_ceil(per);
        if n <= TIMEOUT_MAX {
            return HeaderValue::try_from(format!("{n}{unit}"))
                .unwrap_or(HeaderValue::from_static("99999999H"));
        }
    }
    HeaderValue::from_static("99999999H")
}

/// gRPC's request headers, named once (a `&str` name is parsed at every lookup).
pub(crate) const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
/// `grpc-accept-encoding`.
#[cfg(feature = "grpc")]
pub(crate) const GRPC_ACCEPT_ENCODING: HeaderName = HeaderName::from_static("grpc-accept-encoding");
/// `grpc-timeout`.
#[cfg(feature = "grpc")]
pub(crate) const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The message encoding in `grpc-encoding`: `Ok(None)` for none or `identity`, `Err(name)`
/// for one this side does not have.
pub(crate) fn header_encoding(headers: &HeaderMap) -> Result<Option<Encoding>, String> {
    let Some(v) = headers.get(GRPC_ENCODING) else {
        return Ok(None);
    };
    let name = v.to_str().unwrap_or("").trim();
    if name.is_empty() || name == "identity" {
        return Ok(None);
    }
    Encoding::from_name(name)
        .map(Some)
        .ok_or_else(|| name.to_owned())
}

/// The message encoding of a request (`grpc-encoding`): `Ok(None)` for none or `identity`,
/// `Err` (UNIMPLEMENTED) for one this side does not have.
#[cfg(feature = "grpc")]
pub(crate) fn request_encoding(headers: &HeaderMap) -> Result<Option<Encoding>, Status> {
    header_encoding(headers).map_err(|name| {
        Status::unimplemented(format!(
            "message encoding {name:?} is not supported; this server accepts {ACCEPT}"
        ))
    })
}

/// The encodings a client's `grpc-accept-encoding` names (a bit per [`Encoding`]); `None`
/// when it sent no such header.
#[cfg(feature = "grpc")]
pub(crate) fn accepted_encodings(headers: &HeaderMap) -> Option<u8> {
    let mut values = headers.get_all(GRPC_ACCEPT_ENCODING).iter().peekable();
    values.peek()?;
    Some(
        values
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|n| Encoding::from_name(n.trim()))
            .fold(0, |bits, e| bits | e.bit()),
    )
}

/// The response compression a handler chose ([`crate::Response::with_compression`]), from
/// the marker its codec put in the response headers (`topspin-encoding: NAME:THRESHOLD`, never
/// sent on this face): `None` when it did not choose; `Some(None)` for none.
#[cfg(feature = "grpc")]
pub(crate) fn chosen_compression(md: &topspin_proto::Metadata) -> Option<Option<Compression>> {
    let marker = md.get_str(compression::ENCODING_KEY)?;
    let (name, threshold) = marker.split_once(':').unwrap_or((marker, ""));
    Some(Encoding::from_name(name.trim()).map(|e| {
        let c = Compression::new(e);
        match threshold.trim().parse::<u32>() {
            Ok(t) => c.with_threshold(t),
            Err(_) => c,
        }
    }))
}

/// Headers that are HTTP's or gRPC's, not the application's metadata: left out of the
/// metadata read from headers, and never written from metadata (HTTP/2 and gRPC set them).
fn reserved(key: &str) -> bool {
    key.starts_with("grpc-")
        || key.starts_with(':')
        || matches!(
            key,
            "content-type" | "te" | "host" | "connection" | "content-length" | "keep-alive"
                | "transfer-encoding" | "upgrade" | "proxy-connection"
                // topspin's own negotiation must not be smuggled in: gRPC's is in the frames.
                | compression::ENCODING_KEY | compression::ACCEPT_ENCODING_KEY
        )
}

/// Decodes a `-bin` value: gRPC senders may pad the base64 or not.
pub(crate) fn decode_bin(v: &[u8]) -> Option<Vec<u8>> {
    B64.decode(v.trim_ascii()).ok()
}

/// The application's metadata in request or response headers or trailers: every header that is not HTTP's or gRPC's, `-bin` values decoded
/// from base64 (each comma-separated part on its own). Entries topspin cannot hold (a key
/// with characters outside `0-9 a-z - _ .`, a value over 64 KiB, invalid base64) are left
/// out. The header list itself is bounded by the connection's `max_header_list_size`.
pub(crate) fn metadata_from_headers(headers: &HeaderMap) -> Metadata {
    use topspin_proto::{is_binary_key, is_valid_key};
    let mut b = Metadata::builder();
    let mut n = 0usize;
    // Checked before each push (a failed push would consume the builder): key, value length
    // and count, the builder's only errors for a text (UTF-8) or `-bin` value.
    let fits = |key: &str, v: &[u8], n: usize| {
        is_valid_key(key.as_bytes())
            && v.len() <= usize::from(u16::MAX)
            && n < usize::from(u16::MAX)
    };
    for (name, value) in headers {
        let key = name.as_str();
        if reserved(key) {
            continue;
        }
        if is_binary_key(key.as_bytes()) {
            for part in value.as_bytes().split(|&c| c == b',') {
                match decode_bin(part) {
                    Some(v) if fits(key, &v, n) => {
                        if let Ok(next) = b.binary(key, &v) {
                            b = next;
                            n += 1;
                        } else {
                            return Metadata::new(); // unreachable: checked above
                        }
                    }
                    _ => tracing::debug!("metadata {key}: invalid base64 or too long, left out"),
                }
            }
        } else if let Ok(text) = std::str::from_utf8(value.as_bytes()) {
            if fits(key, text.as_bytes(), n) {
                if let Ok(next) = b.text(key, text) {
                    b = next;
                    n += 1;
                } else {
                    return Metadata::new(); // unreachable: checked above
                }
            } else {
                tracing::debug!("metadata {key}: not a topspin key or too long, left out");
            }
        }
    }
    if n == 0 {
        Metadata::new()
    } else {
        b.build()
    }
}

/// Whether a metadata entry is HTTP's, gRPC's or topspin's own, never sent as a header.
fn not_sent(key: &str) -> bool {
    reserved(key) || key == topspin_proto::DETAILS_KEY
}

/// A `-bin` value as a header: base64 without padding, as gRPC sends it.
fn bin_value(value: &[u8]) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(Bytes::from(B64.encode(value))).ok()
}

/// Appends topspin metadata to HTTP/2 headers (the server's response headers and trailers):
/// `-bin` values in base64, text as is. Keys gRPC reserves and entries HTTP cannot carry are
/// left out.
#[cfg(feature = "grpc")]
pub(crate) fn append_metadata(headers: &mut HeaderMap, md: &Metadata) {
    for (key, value) in md.iter() {
        if not_sent(key) {
            continue;
        }
        let Ok(name) = HeaderName::from_bytes(key.as_bytes()) else {
            continue;
        };
        let value = if topspin_proto::is_binary_key(key.as_bytes()) {
            bin_value(value)
        } else {
            HeaderValue::from_bytes(value).ok()
        };
        if let Some(v) = value {
            headers.append(name, v);
        }
    }
}

/// Request headers from a call's metadata (the client's): text values as they are, `-bin`
/// values in base64. Keys HTTP/2 or gRPC reserve are left out; a key that is no header name
/// or a text value gRPC cannot carry (it allows printable ASCII only: send others under a
/// `-bin` key) is INVALID_ARGUMENT.
pub(crate) fn metadata_to_headers(md: &Metadata, headers: &mut HeaderMap) -> Result<(), Status> {
    for (key, value) in md.iter() {
        if not_sent(key) {
            continue;
        }
        let name = HeaderName::from_bytes(key.as_bytes()).map_err(|_| {
            Status::invalid_argument(format!("metadata key {key:?} is not an HTTP/2 header name"))
        })?;
        let value = if topspin_proto::is_binary_key(key.as_bytes()) {
            bin_value(value).ok_or_else(|| Status::internal("base64 is a valid header value"))?
        } else {
            if !value.iter().all(|b| matches!(b, 0x20..=0x7e)) {
                return Err(Status::invalid_argument(format!(
                    "metadata {key:?}: gRPC carries printable ASCII text values only; use a key ending in -bin for other bytes"
                )));
            }
            HeaderValue::from_bytes(value).map_err(|_| {
                Status::invalid_argument(format!("metadata {key:?}: not a valid header value"))
            })?
        };
        headers.append(name, value);
    }
    Ok(())
}

/// Response headers: content type, the response encoding if any, and the handler's metadata.
#[cfg(feature = "grpc")]
pub(crate) fn response_headers(
    md: &Metadata,
    send: Option<Compression>,
    negotiating: bool,
) -> HeaderMap {
    // Sized by the handler's own response metadata (local, bounded by max_metadata_size).
    let mut h = HeaderMap::with_capacity(2 + md.len());
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(CONTENT_TYPE),
    );
    if let Some(c) = send {
        h.insert(
            "grpc-encoding",
            HeaderValue::from_static(c.encoding().name()),
        );
    }
    if negotiating {
        h.insert("grpc-accept-encoding", HeaderValue::from_static(ACCEPT));
    }
    append_metadata(&mut h, md);
    h
}

/// The status trailers: `grpc-status`, `grpc-message` (percent-encoded), the details as
/// `grpc-status-details-bin`, then the trailing metadata (`trailers`, and the status's own).
/// [`status_of`] reads them back.
#[cfg(feature = "grpc")]
pub(crate) fn status_trailers(h: &mut HeaderMap, status: &Status, trailers: &Metadata) {
    h.insert("grpc-status", code_value(status.code()));
    if !status.message().is_empty() {
        let m: String =
            percent_encoding::utf8_percent_encode(status.message(), MESSAGE_ESCAPES).collect();
        if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(m)) {
            h.insert("grpc-message", v);
        }
    }
    if !status.details().is_empty() {
        if let Some(v) = bin_value(status.details()) {
            h.insert("grpc-status-details-bin", v);
        }
    }
    append_metadata(h, trailers);
    if !std::ptr::eq(trailers, status.metadata()) {
        append_metadata(h, status.metadata());
    }
}

#[cfg(feature = "grpc")]
fn code_value(code: Code) -> HeaderValue {
    const CODES: [&str; 17] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    ];
    match CODES.get(usize::from(code.as_u16())) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(code.as_u16()),
    }
}

/// The status an HTTP status stands for when a response has no `grpc-status`
/// (`http-grpc-status-mapping.md`).
pub(crate) fn http_status_code(status: http::StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// The status in a response's trailers (or the headers of a trailers-only response):
/// `grpc-status` (a missing or malformed one is `INTERNAL`, an unknown number `UNKNOWN`),
/// `grpc-message` percent-decoded, `grpc-status-details-bin` as the details, the rest as
/// metadata.
pub(crate) fn status_of(map: &HeaderMap, method: &str) -> Status {
    let Some(raw) = map.get("grpc-status") else {
        return Status::internal(format!("the server ended {method} without a grpc-status"));
    };
    let code = match std::str::from_utf8(raw.as_bytes())
        .ok()
        .filter(|s| !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u16>().ok())
    {
        Some(n) => Code::from_u16(n),
        None => {
            return Status::internal(format!(
                "the server ended {method} with a malformed grpc-status {:?}",
                String::from_utf8_lossy(raw.as_bytes())
            ))
        }
    };
    let message = map
        .get("grpc-message")
        .map(|m| {
            percent_encoding::percent_decode(m.as_bytes())
                .decode_utf8_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    let mut status = Status::new(code, message);
    let md = metadata_from_headers(map);
    if !md.is_empty() {
        status = status.with_metadata(md);
    }
    if let Some(d) = map
        .get("grpc-status-details-bin")
        .and_then(|v| decode_bin(v.as_bytes()))
    {
        status = status.with_details(d);
    }
    status
}

/// The status of a stream the server reset (gRPC's RST_STREAM mapping). The client reads a
/// CANCEL that comes once the call's deadline has passed as DEADLINE_EXCEEDED, as grpc-go does.
pub(crate) fn reset_code(reason: h2::Reason) -> Code {
    match reason {
        h2::Reason::REFUSED_STREAM => Code::Unavailable,
        h2::Reason::CANCEL => Code::Cancelled,
        h2::Reason::ENHANCE_YOUR_CALM => Code::ResourceExhausted,
        h2::Reason::INADEQUATE_SECURITY => Code::PermissionDenied,
        _ => Code::Internal,
    }
}

/// The 5-byte prefix of a message of `len` bytes.
pub(crate) fn prefix(compressed: bool, len: usize) -> Result<[u8; PREFIX], Status> {
    let len = u32::try_from(len).map_err(|_| {
        Status::resource_exhausted(format!(
            "a message of {len} bytes is larger than gRPC's 4 GiB message limit"
        ))
    })?;
    let l = len.to_be_bytes();
    Ok([u8::from(compressed), l[0], l[1], l[2], l[3]])
}

/// A message's prefix read (`head` holds at least its 5 bytes): whether it is compressed and
/// its length. `Err`: a flag other than 0 or 1 (INTERNAL) or a length over `limit`
/// (RESOURCE_EXHAUSTED), found before any of the message is buffered.
fn parse_prefix(head: &[u8], limit: usize) -> Result<(bool, usize), Status> {
    let (&flag, rest) = head
        .split_first()
        .ok_or_else(|| Status::internal("a gRPC message prefix is 5 bytes"))?;
    let len = match rest {
        [a, b, c, d, ..] => u32::from_be_bytes([*a, *b, *c, *d]) as usize,
        _ => return Err(Status::internal("a gRPC message prefix is 5 bytes")),
    };
    if flag > 1 {
        return Err(Status::internal(format!(
            "invalid compressed flag {flag} (gRPC allows 0 or 1)"
        )));
    }
    if len > limit {
        return Err(Status::resource_exhausted(format!(
            "a message of {len} bytes is over the max_message_size of {limit} bytes"
        )));
    }
    Ok((flag == 1, len))
}

/// A received message's bytes: decompressed with the call's `grpc-encoding` if its flag says
/// so (to at most `limit` bytes, charged to `budget` while the message lives). `Err` (INTERNAL): a compressed message without an encoding.
pub(crate) fn unframe(
    compressed: bool,
    body: Bytes,
    encoding: Option<Encoding>,
    limit: usize,
    budget: Option<&std::sync::Arc<topspin_proto::MemoryBudget>>,
) -> Result<Bytes, Status> {
    match (compressed, encoding) {
        (false, _) => Ok(body),
        (true, Some(e)) => {
            let room = compression::Room::new(limit, budget.cloned());
            compression::inflate(e, &body, &room)
        }
        (true, None) => Err(Status::internal(
            "a compressed message on a call without grpc-encoding",
        )),
    }
}

/// The segments of `message` after its first `skip` bytes (none empty).
pub(crate) fn segments_after(
    message: &crate::codec::Payload,
    mut skip: usize,
) -> impl Iterator<Item = Bytes> + '_ {
    message.segments().iter().filter_map(move |s| {
        let k = skip.min(s.len());
        skip -= k;
        (k < s.len()).then(|| if k == 0 { s.clone() } else { s.slice(k..) })
    })
}

/// One outgoing gRPC message (the server's): the 5-byte prefix and the message, sent from the
/// message's own segments without a copy (h2 writes them as successive DATA).
#[cfg(feature = "grpc")]
#[derive(Debug)]
pub(crate) struct Frame {
    head: [u8; 5],
    /// Where the prefix left to send ends (5 but in a piece that ends inside it).
    head_end: usize,
    pos: usize,
    body: crate::codec::Payload,
    /// Where the rest of `body` starts: a segment and an offset in it.
    seg: usize,
    off: usize,
    /// Bytes of `body` not yet taken.
    left: usize,
}

#[cfg(feature = "grpc")]
impl Frame {
    /// The frame of `message`, compressed with `c` when given (and worth it).
    pub(crate) fn new(
        message: crate::codec::Payload,
        c: Option<Compression>,
    ) -> Result<Frame, Status> {
        let (flag, body) = match c {
            // `encode_payload` writes topspin's flag byte first: gRPC's flag has the same
            // meaning.
            Some(c) => {
                let e = c.encode_payload(message)?;
                let flag = e.segments().iter().find_map(|s| s.first()).copied();
                (flag.unwrap_or(0), e)
            }
            None => (0, message),
        };
        let skip = usize::from(c.is_some()).min(body.len());
        let mut f = Frame {
            head: prefix(flag == 1, body.len() - skip)?,
            head_end: 5,
            pos: 0,
            left: body.len(),
            body,
            seg: 0,
            off: 0,
        };
        f.skip_body(skip);
        Ok(f)
    }

    /// The next `n` bytes (at most what is left) as a frame of their own, sharing the
    /// message's buffers (no copy); this frame goes on after them. How a large message goes to
    /// HTTP/2 a stream's send capacity at a time.
    pub(crate) fn take_piece(&mut self, n: usize) -> Frame {
        if n >= self.remaining() {
            // All of it (the usual case): moved, not shared.
            let empty = Frame {
                head: [0; 5],
                head_end: 0,
                pos: 0,
                body: crate::codec::Payload::default(),
                seg: 0,
                off: 0,
                left: 0,
            };
            return std::mem::replace(self, empty);
        }
        let head_end = self.head_end.min(self.pos + n);
        let body = n - (head_end - self.pos);
        let piece = Frame {
            head: self.head,
            head_end,
            pos: self.pos,
            body: self.body.clone(),
            seg: self.seg,
            off: self.off,
            left: body,
        };
        self.advance(n);
        piece
    }

    /// Moves past `n` bytes of the body.
    fn skip_body(&mut self, mut n: usize) {
        let segs = self.body.segments();
        self.left -= n;
        while n > 0 {
            let k = (segs[self.seg].len() - self.off).min(n);
            n -= k;
            self.off += k;
            if self.off == segs[self.seg].len() {
                self.seg += 1;
                self.off = 0;
            }
        }
        // Past empty segments, so `chunk` is never empty while bytes are left.
        while self.left > 0 && self.off == segs[self.seg].len() {
            self.seg += 1;
            self.off = 0;
        }
    }
}

#[cfg(feature = "grpc")]
impl Buf for Frame {
    fn remaining(&self) -> usize {
        (self.head_end - self.pos) + self.left
    }

    fn chunk(&self) -> &[u8] {
        if self.pos < self.head_end {
            &self.head[self.pos..self.head_end]
        } else if self.left > 0 {
            let s = &self.body.segments()[self.seg][self.off..];
            &s[..s.len().min(self.left)]
        } else {
            &[]
        }
    }

    fn advance(&mut self, mut n: usize) {
        let h = n.min(self.head_end - self.pos);
        self.pos += h;
        n -= h;
        assert!(n <= self.left, "advance past the end of a gRPC frame");
        self.skip_body(n);
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        let mut i = 0;
        if self.pos < self.head_end {
            if let Some(d) = dst.get_mut(i) {
                *d = std::io::IoSlice::new(&self.head[self.pos..self.head_end]);
                i += 1;
            }
        }
        if self.left > 0 {
            let segs = &self.body.segments()[self.seg..];
            let mut left = self.left;
            for (k, s) in segs.iter().enumerate() {
                let s = if k == 0 { &s[self.off..] } else { &s[..] };
                let s = &s[..s.len().min(left)];
                left -= s.len();
                if s.is_empty() {
                    if left == 0 {
                        break;
                    }
                    continue;
                }
                let Some(d) = dst.get_mut(i) else { break };
                *d = std::io::IoSlice::new(s);
                i += 1;
            }
        }
        i
    }
}

/// One received message: its bytes (decompressed) and the bytes it took on the wire.
#[cfg(feature = "grpc")]
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) message: Bytes,
    pub(crate) wire_len: usize,
}

/// Cuts gRPC messages out of a request body's DATA chunks (the server's; the client's is
/// [`CreditDeframer`], which also accounts each message's flow-control credit). A message inside one chunk is a
/// slice of it (no copy); the rest is copied into a buffer as it arrives, so that h2's receive
/// buffer is never held and is reused in place (holding its chunks until a large message is
/// complete made h2 allocate afresh for every 16 KiB frame). A message is at most `limit`
/// bytes (checked on its prefix, before any of it is buffered); the buffer is reserved for it
/// whole if the process's memory budget (`Config::memory_budget`, as for native calls) has
/// room, else up to `reserve` bytes (the stream window), then grows as bytes come.
#[cfg(feature = "grpc")]
pub(crate) struct Deframer {
    buf: BytesMut,
    fresh: Option<Bytes>,
    reserve: usize,
    budget: Option<std::sync::Arc<topspin_proto::MemoryBudget>>,
    /// Bytes of the budget held for the message being gathered.
    held: usize,
    /// The buffer grew past what the budget had room for.
    over: bool,
}

#[cfg(feature = "grpc")]
impl Drop for Deframer {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(feature = "grpc")]
impl Deframer {
    /// A deframer that reserves a message whole if `budget` has room for it, else at most
    /// `reserve` bytes ahead of what arrived.
    pub(crate) fn new(
        reserve: usize,
        budget: Option<std::sync::Arc<topspin_proto::MemoryBudget>>,
    ) -> Deframer {
        Deframer {
            buf: BytesMut::new(),
            fresh: None,
            reserve,
            budget,
            held: 0,
            over: false,
        }
    }

    fn release(&mut self) {
        if self.held > 0 {
            if let Some(b) = &self.budget {
                b.release(self.held);
            }
            self.held = 0;
        }
    }

    /// Adds a received chunk (call [`Deframer::next`] until `None` before the next one).
    pub(crate) fn push(&mut self, b: Bytes) {
        if let Some(old) = self.fresh.replace(b) {
            // Not drained: keep the order.
            self.buf.extend_from_slice(&old);
            if let Some(b) = self.fresh.take() {
                self.buf.extend_from_slice(&b);
            }
        }
    }

    /// Whether bytes of an unfinished message are left.
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty() && self.fresh.as_ref().is_none_or(|f| f.is_empty())
    }

    /// The next whole message, if it has arrived. `Err`: over `limit` (RESOURCE_EXHAUSTED), an
    /// invalid flag or a compressed message without an encoding (INTERNAL), or one that does
    /// not decompress.
    pub(crate) fn next(
        &mut self,
        limit: u32,
        encoding: Option<Encoding>,
    ) -> Result<Option<Received>, Status> {
        if self.buf.is_empty() {
            if let Some(f) = self.fresh.as_mut() {
                if f.len() >= 5 {
                    let n = Self::length(f, limit)?;
                    if f.len() >= 5 + n {
                        // The whole message is in this chunk: a slice of it.
                        let flag = f[0];
                        f.advance(5);
                        let body = f.split_to(n);
                        if f.is_empty() {
                            self.fresh = None;
                        }
                        return self.finish(flag, body, n, limit, encoding).map(Some);
                    }
                    let whole = 5 + n;
                    let want = if whole > self.reserve
                        && self.budget.as_ref().is_some_and(|b| b.try_reserve(whole))
                    {
                        self.held = whole;
                        whole
                    } else {
                        whole.min(self.reserve.max(5))
                    };
                    self.buf.reserve(want);
                }
            }
        }
        if let Some(f) = self.fresh.take() {
            self.buf.extend_from_slice(&f);
            self.charge_growth();
        }
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let n = Self::length(&self.buf, limit)?;
        if self.buf.len() < 5 + n {
            return Ok(None);
        }
        let flag = self.buf[0];
        self.buf.advance(5);
        let body = self.buf.split_to(n).freeze();
        // The message is the handler's now, still charged until the handler drops it.
        // Complete, it is no longer the connection's incomplete data: the charge moves from
        // the connection's share to the process budget, until the handler drops it.
        let body = match (&self.budget, std::mem::take(&mut self.held)) {
            (Some(b), held) if held > 0 => {
                b.hand_to_whole(held);
                let whole = b.whole().unwrap_or(b).clone();
                crate::compression::charged_bytes(body, whole, held)
            }
            _ => body,
        };
        self.finish(flag, body, n, limit, encoding).map(Some)
    }

    /// Charges the buffer's growth past what is held to the budget, if it has room; else
    /// marks the deframer as over it (the bytes already here arrived within the stream's
    /// window and are kept, uncharged: at most a window per stream).
    fn charge_growth(&mut self) {
        let cap = self.buf.capacity();
        self.over = false;
        if let (Some(b), true) = (&self.budget, cap > self.held) {
            if b.try_reserve(cap - self.held) {
                self.held = cap;
            } else {
                self.over = true;
            }
        }
    }

    /// Whether an unfinished message is held that the memory budget has no room for: the
    /// stream's window is then not given back until there is room (as native chunk credit is
    /// withheld), so a peer cannot make the server hold more than its budget plus a window per
    /// stream. Looks for room again.
    pub(crate) fn must_wait(&mut self) -> bool {
        if self.buf.is_empty() {
            return false;
        }
        if self.over {
            self.charge_growth();
        }
        self.over
    }

    fn length(b: &[u8], limit: u32) -> Result<usize, Status> {
        parse_prefix(b, limit as usize).map(|(_, n)| n)
    }

    fn finish(
        &self,
        flag: u8,
        body: Bytes,
        n: usize,
        limit: u32,
        encoding: Option<Encoding>,
    ) -> Result<Received, Status> {
        // Decompressed bytes are charged to the process budget, as on the native face.
        let budget = self.budget.as_ref().map(|b| b.whole().unwrap_or(b));
        let message = unframe(flag == 1, body, encoding, limit as usize, budget)?;
        Ok(Received {
            message,
            wire_len: PREFIX + n,
        })
    }
}

/// One message out of a response's DATA: its compressed flag and bytes, and how many of the
/// DATA bytes of the chunk that completed it belong to it (the credit it holds).
pub(crate) struct Framed {
    pub(crate) compressed: bool,
    pub(crate) message: Bytes,
    pub(crate) credit: usize,
}

/// Cuts messages out of a response's DATA chunks (the client's). A message inside one chunk is a slice of it (no copy);
/// one split over chunks is gathered, its buffer growing as bytes arrive (a length prefix
/// alone never makes it allocate), and never past `limit`.
#[derive(Default)]
pub(crate) struct CreditDeframer {
    head: [u8; PREFIX],
    head_len: usize,
    /// Body bytes still wanted by the message being read (after its prefix).
    want: usize,
    /// The part of a split message gathered so far.
    body: BytesMut,
    in_body: bool,
    /// The compressed flag of the message being read.
    compressed: bool,
}

impl CreditDeframer {
    /// Feeds one DATA chunk; `out` gets every message it completes. Returns the chunk's bytes
    /// that belong to a message not yet complete (their credit is released at once: without
    /// that a message larger than the window could never arrive).
    pub(crate) fn push(
        &mut self,
        mut chunk: Bytes,
        limit: usize,
        mut out: impl FnMut(Framed) -> Result<(), Status>,
    ) -> Result<usize, Status> {
        let total = chunk.len();
        // Where in the chunk the last completed message ended.
        let mut done_at = 0;
        while !chunk.is_empty() || (self.in_body && self.want == 0) {
            if !self.in_body {
                let n = (PREFIX - self.head_len).min(chunk.len());
                self.head[self.head_len..self.head_len + n].copy_from_slice(&chunk[..n]);
                self.head_len += n;
                chunk.advance(n);
                if self.head_len < PREFIX {
                    break;
                }
                let (compressed, len) = parse_prefix(&self.head, limit)?;
                self.compressed = compressed;
                self.want = len;
                self.in_body = true;
            }
            let message = if self.body.is_empty() && chunk.len() >= self.want {
                chunk.split_to(self.want)
            } else {
                let n = self.want.min(chunk.len());
                self.body.extend_from_slice(&chunk[..n]);
                chunk.advance(n);
                self.want -= n;
                if self.want > 0 {
                    break;
                }
                self.body.split().freeze()
            };
            let end = total - chunk.len();
            let compressed = self.compressed;
            self.head_len = 0;
            self.want = 0;
            self.in_body = false;
            out(Framed {
                compressed,
                message,
                credit: end - done_at,
            })?;
            done_at = end;
        }
        Ok(total - done_at)
    }

    /// Whether a message was cut off by the end of the stream.
    pub(crate) fn partial(&self) -> bool {
        self.head_len > 0 || self.in_body
    }
}

#[cfg(test)]
mod tests;
