//! CALL (protocol.md §5.3): starts a call.

use super::text::{at_least, clip, no_trailing, put_clipped, text_u16, u16_at};
use super::{head, CallId, Frame, FrameType, Header, FLAG_NAMED, MAX_METHOD_NAME_LEN};
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
    let flags = if method_name.is_some() { FLAG_NAMED } else { 0 };
    head(
        dst,
        call_len(method_name, metadata),
        FrameType::CALL,
        flags,
        call_id,
    );
    dst.put_u16_le(method_id);
    dst.put_u8(codec);
    dst.put_u8(0);
    dst.put_u64_le(timeout_us);
    if let Some(name) = method_name {
        put_clipped(dst, clip(name, MAX_METHOD_NAME_LEN));
    }
    metadata.encode(dst);
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
