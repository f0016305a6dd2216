//! The gRPC-over-HTTP/2 wire details of the client mode (`client/grpc.rs`), free of I/O:
//! `grpc-timeout`, the 5-byte message prefix, metadata ↔ HTTP headers (`-bin` values in
//! base64), and a response's status from its `grpc-status` / `grpc-message` /
//! `grpc-status-details-bin` or, failing those, its HTTP status (gRPC's
//! `PROTOCOL-HTTP2.md` and `http-grpc-status-mapping.md`).

use crate::{Code, Metadata, Status};
use base64::Engine;
use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use std::time::Duration;

/// Bytes before each message: the compressed flag and the length (big-endian u32).
pub(crate) const PREFIX: usize = 5;

/// Metadata keys a caller cannot set on a gRPC call: HTTP/2 and gRPC set these themselves
/// (`topspin-*-encoding` are the native protocol's names, translated to `grpc-*`).
const RESERVED: &[&str] = &[
    "content-type",
    "te",
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "grpc-timeout",
    "grpc-encoding",
    "grpc-accept-encoding",
    crate::compression::ENCODING_KEY,
    crate::compression::ACCEPT_ENCODING_KEY,
];

/// Headers and trailers that are gRPC's own, not metadata for the application.
const NOT_METADATA: &[&str] = &[
    "content-type",
    "grpc-status",
    "grpc-message",
    "grpc-status-details-bin",
    "grpc-encoding",
    "grpc-accept-encoding",
    "content-length",
];

/// `grpc-timeout` for a duration: at most 8 digits and a unit, rounded up so the server never
/// gives up before the client does.
pub(crate) fn timeout_header(d: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
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
        if n <= MAX {
            return HeaderValue::try_from(format!("{n}{unit}"))
                .unwrap_or(HeaderValue::from_static("99999999H"));
        }
    }
    HeaderValue::from_static("99999999H")
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

/// Request headers from a call's metadata: text values as they are, `-bin` values in base64
/// (no padding, as gRPC sends them). Keys HTTP/2 or gRPC reserve are refused, as are text
/// values gRPC cannot carry (it allows printable ASCII only: send others under a `-bin` key).
pub(crate) fn metadata_to_headers(md: &Metadata, headers: &mut HeaderMap) -> Result<(), Status> {
    for (key, value) in md.iter() {
        if RESERVED.contains(&key) {
            continue;
        }
        let name = HeaderName::from_bytes(key.as_bytes()).map_err(|_| {
            Status::invalid_argument(format!("metadata key {key:?} is not an HTTP/2 header name"))
        })?;
        let value = if key.ends_with("-bin") {
            HeaderValue::try_from(base64::engine::general_purpose::STANDARD_NO_PAD.encode(value))
                .map_err(|_| Status::internal("base64 is a valid header value"))?
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

/// Decodes a `-bin` value: gRPC senders may pad the base64 or not.
pub(crate) fn decode_bin(v: &[u8]) -> Option<Vec<u8>> {
    let v = v.strip_suffix(b"==").or(v.strip_suffix(b"=")).unwrap_or(v);
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(v)
        .ok()
}

/// The application's metadata in response headers or trailers: gRPC's own entries left out,
/// `-bin` values decoded; entries topspin metadata cannot hold (a key with characters outside
/// `0-9 a-z - _ .`, bad base64, text that is not UTF-8, a value over 64 KiB) are dropped.
pub(crate) fn headers_to_metadata(headers: &HeaderMap) -> Metadata {
    let mut b = Metadata::builder();
    for (name, value) in headers.iter().take(usize::from(u16::MAX)) {
        let key = name.as_str();
        if NOT_METADATA.contains(&key) || !topspin_proto::is_valid_key(key.as_bytes()) {
            continue;
        }
        let next = if key.ends_with("-bin") {
            match decode_bin(value.as_bytes()) {
                Some(v) if v.len() <= usize::from(u16::MAX) => b.binary(key, &v),
                _ => continue,
            }
        } else if value.len() <= usize::from(u16::MAX)
            && std::str::from_utf8(value.as_bytes()).is_ok()
        {
            b.entry(key, value.as_bytes())
        } else {
            continue;
        };
        // Checked above: a push cannot fail.
        b = match next {
            Ok(b) => b,
            Err(_) => return Metadata::new(),
        };
    }
    b.build()
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
    let md = headers_to_metadata(map);
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

/// The status of a stream the server reset (gRPC's RST_STREAM mapping).
pub(crate) fn reset_code(reason: h2::Reason) -> Code {
    match reason {
        h2::Reason::REFUSED_STREAM => Code::Unavailable,
        h2::Reason::CANCEL => Code::Cancelled,
        h2::Reason::ENHANCE_YOUR_CALM => Code::ResourceExhausted,
        h2::Reason::INADEQUATE_SECURITY => Code::PermissionDenied,
        _ => Code::Internal,
    }
}

/// One message out of a response's DATA: its compressed flag and bytes, and how many of the
/// DATA bytes of the chunk that completed it belong to it (the credit it holds).
pub(crate) struct Framed {
    pub(crate) compressed: bool,
    pub(crate) message: Bytes,
    pub(crate) credit: usize,
}

/// Cuts messages out of DATA chunks. A message inside one chunk is a slice of it (no copy);
/// one split over chunks is gathered, its buffer growing as bytes arrive (a length prefix
/// alone never makes it allocate), and never past `limit`.
#[derive(Default)]
pub(crate) struct Deframer {
    head: [u8; PREFIX],
    head_len: usize,
    /// Body bytes still wanted by the message being read (after its prefix).
    want: usize,
    /// The part of a split message gathered so far.
    body: BytesMut,
    in_body: bool,
}

impl Deframer {
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
                let flag = self.head[0];
                if flag > 1 {
                    return Err(Status::internal(format!(
                        "the server sent a message with compressed flag {flag} (gRPC allows 0 or 1)"
                    )));
                }
                let len =
                    u32::from_be_bytes([self.head[1], self.head[2], self.head[3], self.head[4]])
                        as usize;
                if len > limit {
                    return Err(Status::resource_exhausted(format!(
                        "the server sent a message of {len} bytes, more than this channel's max_message_size of {limit} bytes"
                    )));
                }
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
            let compressed = self.head[0] == 1;
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
mod tests {
    use super::*;

    #[test]
    fn timeouts() {
        let t = |d| timeout_header(d).to_str().unwrap().to_owned();
        assert_eq!(t(Duration::from_nanos(5)), "5n");
        assert_eq!(t(Duration::from_millis(250)), "250000u");
        assert_eq!(t(Duration::from_secs(5)), "5000000u");
        assert_eq!(t(Duration::from_secs(500)), "500000m");
        assert_eq!(t(Duration::from_secs(200_000)), "200000S");
        assert_eq!(t(Duration::from_secs(u64::MAX / 4)), "99999999H");
    }

    #[test]
    fn statuses() {
        let mut m = HeaderMap::new();
        assert_eq!(status_of(&m, "/a").code(), Code::Internal);
        m.insert("grpc-status", HeaderValue::from_static("x1"));
        assert_eq!(status_of(&m, "/a").code(), Code::Internal);
        m.insert("grpc-status", HeaderValue::from_static("99"));
        assert_eq!(status_of(&m, "/a").code(), Code::Unknown);
        m.insert("grpc-status", HeaderValue::from_static("5"));
        m.insert(
            "grpc-message",
            HeaderValue::from_static("no%20key%20%F0%9F%8D%8E"),
        );
        m.insert("grpc-status-details-bin", HeaderValue::from_static("AQID"));
        m.insert("x-retry-bin", HeaderValue::from_static("AAE="));
        let s = status_of(&m, "/a");
        assert_eq!(s.code(), Code::NotFound);
        assert_eq!(s.message(), "no key 🍎");
        assert_eq!(s.details().as_ref(), &[1, 2, 3]);
        assert_eq!(s.metadata().get("x-retry-bin"), Some(&[0u8, 1][..]));
        assert_eq!(s.metadata().get("grpc-message"), None);
        assert_eq!(
            http_status_code(http::StatusCode::NOT_FOUND),
            Code::Unimplemented
        );
        assert_eq!(
            http_status_code(http::StatusCode::IM_A_TEAPOT),
            Code::Unknown
        );
    }

    #[test]
    fn metadata_both_ways() {
        let md = Metadata::builder()
            .text("x-user", "ann")
            .unwrap()
            .binary("x-raw-bin", &[0, 255, 7])
            .unwrap()
            .text("topspin-encoding", "gzip")
            .unwrap()
            .build();
        let mut h = HeaderMap::new();
        metadata_to_headers(&md, &mut h).unwrap();
        assert_eq!(h.get("x-raw-bin").unwrap(), "AP8H");
        assert!(h.get("topspin-encoding").is_none());
        let back = headers_to_metadata(&h);
        assert_eq!(back.get_str("x-user"), Some("ann"));
        assert_eq!(back.get("x-raw-bin"), Some(&[0u8, 255, 7][..]));
        let bad = Metadata::builder().text("x", "grüße").unwrap().build();
        let e = metadata_to_headers(&bad, &mut HeaderMap::new()).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
    }

    #[test]
    fn deframes_across_chunks_with_credit() {
        let mut wire = Vec::new();
        for m in [&b"hello"[..], b"", b"0123456789"] {
            wire.extend_from_slice(&prefix(false, m.len()).unwrap());
            wire.extend_from_slice(m);
        }
        for cut in 0..wire.len() {
            let mut d = Deframer::default();
            let mut got = Vec::new();
            let mut credit = 0;
            for part in [&wire[..cut], &wire[cut..]] {
                let rest = d
                    .push(Bytes::copy_from_slice(part), 64, |f| {
                        credit += f.credit;
                        got.push(f.message);
                        Ok(())
                    })
                    .unwrap();
                credit += rest;
            }
            assert!(!d.partial());
            assert_eq!(credit, wire.len(), "cut {cut}");
            assert_eq!(got, [&b"hello"[..], b"", b"0123456789"], "cut {cut}");
        }
        let mut d = Deframer::default();
        let e = d
            .push(Bytes::from_static(&[0, 0, 0, 1, 0]), 64, |_| Ok(()))
            .unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted);
        let e = Deframer::default()
            .push(Bytes::from_static(&[7, 0, 0, 0, 0]), 64, |_| Ok(()))
            .unwrap_err();
        assert_eq!(e.code(), Code::Internal);
    }
}
