//! CALL (protocol.md §5.3): starts a call.

use super::text::{at_least, clip, no_trailing, put_text, text_u16, u16_at};
use super::{
    head_into, AnyBuf, CallId, Frame, FrameType, Header, Sink, FLAG_NAMED, HEADER_LEN,
    MAX_METHOD_NAME_LEN,
};
use crate::error::ProtocolError;
use crate::metadata::Metadata;
use bytes::{BufMut, Bytes};
use bytestring::ByteString;

/// Fixed part of a CALL payload.
pub const CALL_FIXED_LEN: usize = 12;

/// CALL: starts a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallFrame {
    /// The new call's id.
    pub call_id: CallId,
    /// Interned method id (0: not interned).
    pub method_id: u16,
    /// The method name, when the NAMED flag is set.
    pub method_name: Option<ByteString>,
    /// Payload codec of the call's messages.
    pub codec: u8,
    /// Relative deadline in microseconds; 0 for none.
    pub timeout_us: u64,
    /// Request headers.
    pub metadata: Metadata,
}

/// Payload length of a CALL with this method name (if NAMED) and metadata.
#[inline]
pub fn call_len(method_name: Option<&str>, metadata: &Metadata) -> usize {
    CALL_FIXED_LEN
        + method_name.map_or(0, |n| 2 + clip(n, MAX_METHOD_NAME_LEN).len())
        + metadata.encoded_len()
}

/// Writes a CALL frame. A name longer than [`MAX_METHOD_NAME_LEN`] is clipped (the connection
/// refuses such names before they get here).
#[inline]
pub fn encode_call(
    dst: &mut impl BufMut,
    call_id: CallId,
    method_id: u16,
    method_name: Option<&str>,
    codec: u8,
    timeout_us: u64,
    metadata: &Metadata,
) {
    write_call(
        &mut AnyBuf(dst),
        call_id,
        method_id,
        method_name,
        codec,
        timeout_us,
        metadata,
    );
}

/// [`encode_call`] into a [`Sink`]: header and fixed fields in one write (and an empty
/// metadata block with them when no name follows).
#[inline]
pub(crate) fn write_call(
    dst: &mut impl Sink,
    call_id: CallId,
    method_id: u16,
    method_name: Option<&str>,
    codec: u8,
    timeout_us: u64,
    metadata: &Metadata,
) {
    const FIXED: usize = HEADER_LEN + CALL_FIXED_LEN;
    let flags = if method_name.is_some() { FLAG_NAMED } else { 0 };
    let md = metadata.as_bytes();
    let mut b = [0u8; FIXED + 2];
    head_into(
        &mut b,
        call_len(method_name, metadata),
        FrameType::CALL,
        flags,
        call_id,
    );
    b[12..14].copy_from_slice(&method_id.to_le_bytes());
    b[14] = codec;
    b[16..24].copy_from_slice(&timeout_us.to_le_bytes());
    match method_name {
        None if md.len() == 2 => {
            b[FIXED..].copy_from_slice(&md[..2]);
            dst.put(&b);
        }
        _ => {
            dst.put(&b[..FIXED]);
            if let Some(name) = method_name {
                put_text(dst, clip(name, MAX_METHOD_NAME_LEN));
            }
            dst.put(md);
        }
    }
}

/// A CALL whose payload is its fixed fields and an empty metadata block (no name: the method
/// is interned), decoded from the receive buffer in place; `None` for any other shape, which
/// [`decode`] handles. Same checks, same frame.
#[inline]
pub(super) fn decode_bare(header: &Header, payload: &[u8]) -> Option<CallFrame> {
    if header.flags & FLAG_NAMED != 0 {
        return None;
    }
    let b: &[u8; CALL_FIXED_LEN + 2] = payload.try_into().ok()?;
    if b[CALL_FIXED_LEN..] != [0, 0] {
        return None;
    }
    let [f0, f1, codec, _, t @ ..] = *b.first_chunk::<CALL_FIXED_LEN>()?;
    Some(CallFrame {
        call_id: header.call_id,
        method_id: u16::from_le_bytes([f0, f1]),
        method_name: None,
        codec,
        timeout_us: u64::from_le_bytes(t),
        metadata: Metadata::new(),
    })
}

#[inline]
pub(super) fn decode(header: &Header, payload: Bytes) -> Result<Frame, ProtocolError> {
    at_least(&payload, CALL_FIXED_LEN, FrameType::CALL)?;
    let method_id = u16_at(&payload, 0);
    let codec = payload[2];
    let timeout_us = u64::from_le_bytes(payload[4..12].try_into().unwrap_or_default());
    let (method_name, at) = if header.flags & FLAG_NAMED != 0 {
        let (name, end) = text_u16(&payload, CALL_FIXED_LEN, "CALL method name")?;
        if name.is_empty() || name.len() > MAX_METHOD_NAME_LEN {
            return Err(ProtocolError::malformed(format!(
                "CALL method name must be 1..={MAX_METHOD_NAME_LEN} bytes, got {}",
                name.len()
            )));
        }
        (Some(name), end)
    } else {
        (None, CALL_FIXED_LEN)
    };
    let (metadata, used) = Metadata::decode(&payload.slice(at..))?;
    no_trailing(&payload, at + used, FrameType::CALL)?;
    Ok(Frame::Call(CallFrame {
        call_id: header.call_id,
        method_id,
        method_name,
        codec,
        timeout_us,
        metadata,
    }))
}
