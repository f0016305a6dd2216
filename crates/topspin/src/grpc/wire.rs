//! gRPC over HTTP/2 on the wire (PROTOCOL-HTTP2.md and http-grpc-status-mapping.md of
//! grpc/grpc), free of I/O and shared by both sides — the server's gRPC face (`server.rs`,
//! feature `grpc`) and the client's gRPC mode (`client/grpc.rs`, always built): the 5-byte
//! message codec (the framer and the deframer, in `framing.rs`, re-exported here), `grpc-timeout` both ways, metadata to and from HTTP/2
//! headers (`-bin` values in base64, reserved headers left out), the status both ways
//! (`grpc-status`, `grpc-message` percent-encoded, `grpc-status-details-bin`) and the encoding
//! headers. Items only the server uses are compiled with its feature.

#[cfg(feature = "grpc")]
use crate::compression::Compression;
use crate::compression::{self, Encoding};
use crate::{Code, Status};
use base64::Engine as _;
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use std::time::Duration;
use topspin_proto::Metadata;

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

// The message codec (prefix, `Frame`, `Deframer`) is in `framing.rs`; the same names here.
pub(crate) use super::framing::*;

#[cfg(test)]
mod tests;
