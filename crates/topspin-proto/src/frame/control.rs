//! HALF_CLOSE, CANCEL and CREDIT (protocol.md §5.7, §5.9, §5.10): a call's small control
//! frames.

use super::text::{exact_len, u16_at, u32_at};
use super::{head_into, AnyBuf, CallId, Frame, FrameType, Header, Sink, HEADER_LEN};
use crate::error::ProtocolError;
use crate::settings::MAX_WINDOW;
use crate::status::Code;
use bytes::BufMut;

/// Writes a HALF_CLOSE frame.
#[inline]
pub fn encode_half_close(dst: &mut impl BufMut, call_id: CallId) {
    write_half_close(&mut AnyBuf(dst), call_id);
}

/// [`encode_half_close`] into a [`Sink`].
#[inline]
pub(crate) fn write_half_close(dst: &mut impl Sink, call_id: CallId) {
    let mut b = [0u8; HEADER_LEN];
    head_into(&mut b, 0, FrameType::HALF_CLOSE, 0, call_id);
    dst.put(&b);
}

/// Writes a CANCEL frame.
#[inline]
pub fn encode_cancel(dst: &mut impl BufMut, call_id: CallId, code: Code) {
    write_cancel(&mut AnyBuf(dst), call_id, code);
}

/// [`encode_cancel`] into a [`Sink`], in one write.
#[inline]
pub(crate) fn write_cancel(dst: &mut impl Sink, call_id: CallId, code: Code) {
    let mut b = [0u8; HEADER_LEN + 2];
    head_into(&mut b, 2, FrameType::CANCEL, 0, call_id);
    b[12..].copy_from_slice(&code.as_u16().to_le_bytes());
    dst.put(&b);
}

/// Writes a CREDIT frame (`increment` must be 1 ..= 2³¹−1).
#[inline]
pub fn encode_credit(dst: &mut impl BufMut, call_id: CallId, increment: u32) {
    write_credit(&mut AnyBuf(dst), call_id, increment);
}

/// [`encode_credit`] into a [`Sink`], in one write.
#[inline]
pub(crate) fn write_credit(dst: &mut impl Sink, call_id: CallId, increment: u32) {
    let mut b = [0u8; HEADER_LEN + 4];
    head_into(&mut b, 4, FrameType::CREDIT, 0, call_id);
    b[12..].copy_from_slice(&increment.to_le_bytes());
    dst.put(&b);
}

#[inline]
pub(super) fn decode_half_close(header: &Header, payload: &[u8]) -> Result<Frame, ProtocolError> {
    exact_len(payload, 0, FrameType::HALF_CLOSE)?;
    Ok(Frame::HalfClose {
        call_id: header.call_id,
    })
}

#[inline]
pub(super) fn decode_cancel(header: &Header, payload: &[u8]) -> Result<Frame, ProtocolError> {
    exact_len(payload, 2, FrameType::CANCEL)?;
    Ok(Frame::Cancel {
        call_id: header.call_id,
        code: Code::from_u16(u16_at(payload, 0)),
    })
}

#[inline]
pub(super) fn decode_credit(header: &Header, payload: &[u8]) -> Result<Frame, ProtocolError> {
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
