//! HALF_CLOSE, CANCEL and CREDIT (protocol.md §5.7, §5.9, §5.10): a call's small control
//! frames.

use super::text::{exact_len, u16_at, u32_at};
use super::{head, CallId, Frame, FrameType, Header};
use crate::error::ProtocolError;
use crate::settings::MAX_WINDOW;
use crate::status::Code;
use bytes::{BufMut, Bytes};

/// Writes a HALF_CLOSE frame.
#[inline]
pub fn encode_half_close(dst: &mut impl BufMut, call_id: CallId) {
    head(dst, 0, FrameType::HALF_CLOSE, 0, call_id);
}

/// Writes a CANCEL frame.
#[inline]
pub fn encode_cancel(dst: &mut impl BufMut, call_id: CallId, code: Code) {
    head(dst, 2, FrameType::CANCEL, 0, call_id);
    dst.put_u16_le(code.as_u16());
}

/// Writes a CREDIT frame (`increment` must be 1 ..= 2³¹−1).
#[inline]
pub fn encode_credit(dst: &mut impl BufMut, call_id: CallId, increment: u32) {
    head(dst, 4, FrameType::CREDIT, 0, call_id);
    dst.put_u32_le(increment);
}

#[inline]
pub(super) fn decode_half_close(header: &Header, payload: &Bytes) -> Result<Frame, ProtocolError> {
    exact_len(payload, 0, FrameType::HALF_CLOSE)?;
    Ok(Frame::HalfClose {
        call_id: header.call_id,
    })
}

#[inline]
pub(super) fn decode_cancel(header: &Header, payload: &Bytes) -> Result<Frame, ProtocolError> {
    exact_len(payload, 2, FrameType::CANCEL)?;
    Ok(Frame::Cancel {
        call_id: header.call_id,
        code: Code::from_u16(u16_at(payload, 0)),
    })
}

#[inline]
pub(super) fn decode_credit(header: &Header, payload: &Bytes) -> Result<Frame, ProtocolError> {
    exact_len(payload, 4, FrameType::CREDIT)?;
    let increment = u32_at(payload, 0);
    if increment == 0 || increment > MAX_WINDOW {
        return Err(ProtocolError::malformed(format!(
            "CREDIT increment must be 1..=2147483647, got {increment}"
        )));
    }
    Ok(Frame::Credit {
        call_id: header.call_id,
        increment,
    })
}
