//! Field helpers shared by the frame types: length-prefixed text (clipped at a character
//! boundary in exactly one place), little-endian reads, and layout checks.

use super::{FrameType, Sink};
use crate::error::ProtocolError;
use bytes::{BufMut, Bytes};
use bytestring::ByteString;

/// Longest text a u16 length field can carry.
pub const MAX_TEXT_LEN: usize = u16::MAX as usize;

/// `s` cut to at most `max` bytes (and never more than [`MAX_TEXT_LEN`]) at a character
/// boundary. Every text the crate encodes goes through here, so a frame's declared length and
/// its bytes always agree.
///
/// ```
/// use topspin_proto::frame::clip;
/// assert_eq!(clip("héllo", 2), "h"); // never half of 'é'
/// assert_eq!(clip(&"é".repeat(40_000), usize::MAX).len(), 65_534);
/// ```
#[inline]
pub fn clip(s: &str, max: usize) -> &str {
    let mut n = s.len().min(max).min(MAX_TEXT_LEN);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

/// Writes a u16-length-prefixed text that [`clip`] already cut.
#[inline]
pub(crate) fn put_clipped(dst: &mut impl BufMut, s: &str) {
    debug_assert!(s.len() <= MAX_TEXT_LEN);
    dst.put_u16_le(s.len() as u16);
    dst.put_slice(s.as_bytes());
}

/// [`put_clipped`] into a [`Sink`].
#[inline]
pub(crate) fn put_text(dst: &mut impl Sink, s: &str) {
    debug_assert!(s.len() <= MAX_TEXT_LEN);
    dst.put(&(s.len() as u16).to_le_bytes());
    dst.put(s.as_bytes());
}

#[inline]
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline]
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
fn text(payload: &Bytes, what: &'static str) -> Result<ByteString, ProtocolError> {
    ByteString::try_from(payload.clone())
        .map_err(|_| ProtocolError::malformed(format!("{what} is not valid UTF-8")))
}

/// A length-prefixed (u16) text at `at`; returns it and the offset after it.
#[inline]
pub(crate) fn text_u16(
    payload: &Bytes,
    at: usize,
    what: &'static str,
) -> Result<(ByteString, usize), ProtocolError> {
    if payload.len() < at + 2 {
        return Err(ProtocolError::malformed(format!(
            "{what} length is truncated"
        )));
    }
    let len = usize::from(u16_at(payload, at));
    let end = at + 2 + len;
    if payload.len() < end {
        return Err(ProtocolError::malformed(format!(
            "{what} of {len} bytes is truncated to {}",
            payload.len() - at - 2
        )));
    }
    Ok((text(&payload.slice(at + 2..end), what)?, end))
}

/// The payload is at least `n` bytes (the fixed part of `ty`).
#[inline]
pub(crate) fn at_least(payload: &Bytes, n: usize, ty: FrameType) -> Result<(), ProtocolError> {
    if payload.len() < n {
        return Err(ProtocolError::malformed(format!(
            "{} payload of {} bytes is shorter than its {n} fixed bytes",
            ty.name(),
            payload.len()
        )));
    }
    Ok(())
}

#[inline]
pub(crate) fn exact_len(payload: &[u8], n: usize, ty: FrameType) -> Result<(), ProtocolError> {
    if payload.len() != n {
        return Err(ProtocolError::malformed(format!(
            "{} payload must be {n} bytes, got {}",
            ty.name(),
            payload.len()
        )));
    }
    Ok(())
}

#[inline]
pub(crate) fn no_trailing(
    payload: &Bytes,
    used: usize,
    ty: FrameType,
) -> Result<(), ProtocolError> {
    if used != payload.len() {
        return Err(ProtocolError::malformed(format!(
            "{} payload has {} unexpected trailing bytes",
            ty.name(),
            payload.len() - used
        )));
    }
    Ok(())
}
