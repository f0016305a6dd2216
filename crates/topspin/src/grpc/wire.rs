//! gRPC over HTTP/2 on the wire (PROTOCOL-HTTP2.md of grpc/grpc): the length-prefixed message
//! framing, `grpc-timeout`, metadata to and from HTTP/2 headers (`-bin` values in base64), the
//! status trailers (`grpc-message` percent-encoded) and the encoding headers.

use crate::compression::{self, Compression, Encoding};
use crate::{Code, Status};
use base64::Engine as _;
use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use std::time::Duration;
use topspin_proto::Metadata;

/// Request and response content type.
pub(crate) const CONTENT_TYPE: &str = "application/grpc";
/// What this side can decode, as sent in `grpc-accept-encoding`.
pub(crate) const ACCEPT: &str = "gzip,zstd";

/// base64 as gRPC writes it (standard alphabet, no padding) and reads it (padded or not).
const B64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// Bytes of `grpc-message` written as they are: printable ASCII but `%` (gRPC's rule).
const MESSAGE_ESCAPES: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');

/// `grpc-timeout`: up to 8 digits and a unit (`H M S m u n`). `Err` (INTERNAL) if malformed.
///
/// ```ignore
/// assert_eq!(parse_timeout(b"100m"), Ok(Duration::from_millis(100)));
/// ```
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

/// The message encoding of a request (`grpc-encoding`): `Ok(None)` for none or `identity`,
/// `Err` (UNIMPLEMENTED) for one this side does not have.
pub(crate) fn request_encoding(headers: &HeaderMap) -> Result<Option<Encoding>, Status> {
    let Some(v) = headers.get("grpc-encoding") else {
        return Ok(None);
    };
    let name = v.to_str().unwrap_or("").trim();
    if name.is_empty() || name == "identity" {
        return Ok(None);
    }
    Encoding::from_name(name).map(Some).ok_or_else(|| {
        Status::unimplemented(format!(
            "message encoding {name:?} is not supported; this server accepts {ACCEPT}"
        ))
    })
}

/// The server's compression for a call, if the client listed its encoding in
/// `grpc-accept-encoding`.
pub(crate) fn response_compression(
    headers: &HeaderMap,
    ours: Option<Compression>,
) -> Option<Compression> {
    let c = ours?;
    let accepted = headers
        .get_all("grpc-accept-encoding")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|n| n.trim() == c.encoding().name());
    accepted.then_some(c)
}

/// Headers that are HTTP's or gRPC's, not the application's metadata.
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

/// A request's metadata: every header that is not HTTP's or gRPC's, `-bin` values decoded
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
                match B64.decode(part.trim_ascii()) {
                    Ok(v) if fits(key, &v, n) => {
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

/// Appends topspin metadata to HTTP/2 headers: `-bin` values in base64, text as is. Keys
/// gRPC reserves and entries HTTP cannot carry are left out.
pub(crate) fn append_metadata(headers: &mut HeaderMap, md: &Metadata) {
    for (key, value) in md.iter() {
        if reserved(key) || key == topspin_proto::DETAILS_KEY {
            continue;
        }
        let Ok(name) = HeaderName::from_bytes(key.as_bytes()) else {
            continue;
        };
        let value = if topspin_proto::is_binary_key(key.as_bytes()) {
            HeaderValue::from_maybe_shared(Bytes::from(B64.encode(value)))
        } else {
            HeaderValue::from_bytes(value)
        };
        if let Ok(v) = value {
            headers.append(name, v);
        }
    }
}

/// Response headers: content type, the response encoding if any, and the handler's metadata.
pub(crate) fn response_headers(
    md: &Metadata,
    send: Option<Compression>,
    negotiating: bool,
) -> HeaderMap {
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
        if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(B64.encode(status.details()))) {
            h.insert("grpc-status-details-bin", v);
        }
    }
    append_metadata(h, trailers);
    if !std::ptr::eq(trailers, status.metadata()) {
        append_metadata(h, status.metadata());
    }
}

fn code_value(code: Code) -> HeaderValue {
    const CODES: [&str; 17] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    ];
    match CODES.get(usize::from(code.as_u16())) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(code.as_u16()),
    }
}

/// One outgoing gRPC message: the 5-byte prefix (compressed flag, big-endian length) and the
/// message, sent from the message's own `Bytes` without a copy.
#[derive(Debug)]
pub(crate) struct Frame {
    head: [u8; 5],
    pos: usize,
    body: Bytes,
}

impl Frame {
    /// The frame of `message`, compressed with `c` when given (and worth it).
    pub(crate) fn new(message: Bytes, c: Option<Compression>) -> Result<Frame, Status> {
        let (flag, body) = match c {
            // `encode` writes topspin's flag byte first: gRPC's flag has the same meaning.
            Some(c) => {
                let mut e = c.encode(&message)?;
                let flag = e.first().copied().unwrap_or(0);
                e.advance(1);
                (flag, e)
            }
            None => (0, message),
        };
        let len = u32::try_from(body.len())
            .map_err(|_| Status::resource_exhausted("a message over 4 GiB cannot be framed"))?;
        let l = len.to_be_bytes();
        Ok(Frame {
            head: [flag, l[0], l[1], l[2], l[3]],
            pos: 0,
            body,
        })
    }
}

impl Buf for Frame {
    fn remaining(&self) -> usize {
        (5 - self.pos) + self.body.len()
    }

    fn chunk(&self) -> &[u8] {
        if self.pos < 5 {
            &self.head[self.pos..]
        } else {
            &self.body
        }
    }

    fn advance(&mut self, mut n: usize) {
        let h = n.min(5 - self.pos);
        self.pos += h;
        n -= h;
        self.body.advance(n);
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        let mut i = 0;
        if self.pos < 5 {
            if let Some(d) = dst.get_mut(i) {
                *d = std::io::IoSlice::new(&self.head[self.pos..]);
                i += 1;
            }
        }
        if !self.body.is_empty() {
            if let Some(d) = dst.get_mut(i) {
                *d = std::io::IoSlice::new(&self.body);
                i += 1;
            }
        }
        i
    }
}

/// One received message: its bytes (decompressed) and the bytes it took on the wire.
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) message: Bytes,
    pub(crate) wire_len: usize,
}

/// Cuts gRPC messages out of a request body's DATA chunks. A message inside one chunk is a
/// slice of it (no copy); the rest is copied into a buffer as it arrives, so that h2's receive
/// buffer is never held and is reused in place (holding its chunks until a large message is
/// complete made h2 allocate afresh for every 16 KiB frame). A message is at most `limit`
/// bytes (checked on its prefix, before any of it is buffered); the buffer is reserved for it
/// whole if the process's memory budget (`Config::memory_budget`, as for native calls) has
/// room, else up to `reserve` bytes (the stream window), then grows as bytes come.
pub(crate) struct Deframer {
    buf: BytesMut,
    fresh: Option<Bytes>,
    reserve: usize,
    budget: Option<std::sync::Arc<topspin_proto::MemoryBudget>>,
    /// Bytes of the budget held for the message being gathered.
    held: usize,
}

impl Drop for Deframer {
    fn drop(&mut self) {
        self.release();
    }
}

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
                        return Self::finish(flag, body, n, limit, encoding).map(Some);
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
        self.release(); // the message is the handler's now
        Self::finish(flag, body, n, limit, encoding).map(Some)
    }

    fn length(b: &[u8], limit: u32) -> Result<usize, Status> {
        let n = u32::from_be_bytes([b[1], b[2], b[3], b[4]]);
        if n > limit {
            return Err(Status::resource_exhausted(format!(
                "a request message of {n} bytes is over this server's max_message_size of {limit} bytes"
            )));
        }
        Ok(n as usize)
    }

    fn finish(
        flag: u8,
        body: Bytes,
        n: usize,
        limit: u32,
        encoding: Option<Encoding>,
    ) -> Result<Received, Status> {
        let message = match (flag, encoding) {
            (0, _) => body,
            (1, Some(e)) => compression::inflate(e, &body, limit as usize)?,
            (1, None) => {
                return Err(Status::internal(
                    "a compressed message on a call without grpc-encoding",
                ))
            }
            (f, _) => {
                return Err(Status::internal(format!(
                    "invalid compressed flag {f} (expected 0 or 1)"
                )))
            }
        };
        Ok(Received {
            message,
            wire_len: 5 + n,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout(b"100m").unwrap(), Duration::from_millis(100));
        assert_eq!(parse_timeout(b"2S").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_timeout(b"1H").unwrap(), Duration::from_secs(3600));
        assert_eq!(
            parse_timeout(b"99999999n").unwrap(),
            Duration::from_nanos(99_999_999)
        );
        for bad in [&b""[..], b"m", b"123456789m", b"10x", b"-1S", b"1 S"] {
            assert!(parse_timeout(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn metadata_both_ways() {
        let md = Metadata::builder()
            .text("user", "ann")
            .unwrap()
            .binary("trace-bin", &[0, 1, 0xff])
            .unwrap()
            .build();
        let mut h = HeaderMap::new();
        append_metadata(&mut h, &md);
        assert_eq!(h.get("trace-bin").unwrap(), "AAH/");
        h.insert("grpc-timeout", HeaderValue::from_static("1S"));
        h.insert("content-type", HeaderValue::from_static(CONTENT_TYPE));
        h.append("trace-bin", HeaderValue::from_static("AQ=="));
        let back = metadata_from_headers(&h);
        assert_eq!(back.get_str("user"), Some("ann"));
        let bins: Vec<&[u8]> = back.get_all("trace-bin").collect();
        assert_eq!(bins, vec![&[0, 1, 0xff][..], &[1][..]]);
        assert!(back.get("grpc-timeout").is_none() && back.get("content-type").is_none());
    }

    #[test]
    fn status_message_is_percent_encoded() {
        let mut h = HeaderMap::new();
        let st = Status::not_found("no 100% grüße\n").with_details(vec![1, 2]);
        status_trailers(&mut h, &st, &Metadata::new());
        assert_eq!(h.get("grpc-status").unwrap(), "5");
        assert_eq!(
            h.get("grpc-message").unwrap(),
            "no 100%25 gr%C3%BC%C3%9Fe%0A"
        );
        assert_eq!(h.get("grpc-status-details-bin").unwrap(), "AQI");
    }

    #[test]
    fn frames_cut_across_chunks() {
        let mut out = Vec::new();
        for m in [&b"hello"[..], b"", b"a longer message"] {
            let mut f = Frame::new(Bytes::copy_from_slice(m), None).unwrap();
            while f.has_remaining() {
                let c = f.chunk().to_vec();
                f.advance(c.len());
                out.extend_from_slice(&c);
            }
        }
        let mut d = Deframer::new(1 << 20, None);
        let mut got = Vec::new();
        for b in out.chunks(3) {
            d.push(Bytes::copy_from_slice(b));
            while let Some(r) = d.next(1024, None).unwrap() {
                got.push(r.message);
            }
        }
        assert_eq!(got, vec![&b"hello"[..], b"", b"a longer message"]);
        assert!(d.is_empty());
        let mut d = Deframer::new(1 << 20, None);
        d.push(Bytes::from_static(&[0, 0, 0, 4, 1]));
        assert_eq!(
            d.next(1000, None).unwrap_err().code(),
            Code::ResourceExhausted
        );
    }

    #[test]
    fn compressed_frames() {
        let c = Compression::new(Encoding::Gzip).with_threshold(0);
        let msg = Bytes::from(vec![7u8; 4000]);
        let mut f = Frame::new(msg.clone(), Some(c)).unwrap();
        assert_eq!(f.head[0], 1);
        let wire = f.copy_to_bytes(f.remaining());
        let mut d = Deframer::new(1 << 20, None);
        d.push(wire.clone());
        assert_eq!(
            d.next(1 << 20, Some(Encoding::Gzip))
                .unwrap()
                .unwrap()
                .message,
            msg
        );
        d.push(wire);
        assert_eq!(
            d.next(100, Some(Encoding::Gzip)).unwrap_err().code(),
            Code::ResourceExhausted
        );
    }
}
