//! SETTINGS, PING, GOAWAY and ERROR (protocol.md §4, §5.11–§5.13): the connection's frames
//! (call id 0).

use super::text::{at_least, clip, exact_len, no_trailing, put_clipped, text_u16, u16_at, u32_at};
use super::{head, CallId, Frame, FrameType, Header, FLAG_ACK};
use crate::error::{ErrorCode, ProtocolError};
use crate::settings::Settings;
use bytes::{BufMut, Bytes};

/// Fixed part of a GOAWAY payload: last call id, code and reason length.
pub const GOAWAY_FIXED_LEN: usize = 8;
/// Fixed part of an ERROR payload: code and reason length.
pub const ERROR_FIXED_LEN: usize = 4;

/// Writes a SETTINGS frame with all five settings.
#[inline]
pub fn encode_settings(dst: &mut impl BufMut, settings: &Settings) {
    head(
        dst,
        Settings::PAYLOAD_LEN,
        FrameType::SETTINGS,
        0,
        CallId::CONNECTION,
    );
    settings.encode_payload(dst);
}

/// Writes a PING frame (its answer when `ack`).
#[inline]
pub fn encode_ping(dst: &mut impl BufMut, ack: bool, data: &[u8; 8]) {
    let flags = if ack { FLAG_ACK } else { 0 };
    head(dst, 8, FrameType::PING, flags, CallId::CONNECTION);
    dst.put_slice(data);
}

/// Writes a GOAWAY frame; `reason` is clipped at a character boundary so the payload is at
/// most `max_payload` bytes (the peer's `MAX_FRAME_SIZE`) and the text at most 65,535.
#[inline]
pub fn encode_go_away(
    dst: &mut impl BufMut,
    last_call_id: CallId,
    code: ErrorCode,
    reason: &str,
    max_payload: usize,
) {
    let reason = clip(reason, max_payload.saturating_sub(GOAWAY_FIXED_LEN));
    let len = GOAWAY_FIXED_LEN + reason.len();
    head(dst, len, FrameType::GOAWAY, 0, CallId::CONNECTION);
    dst.put_u32_le(last_call_id.0);
    dst.put_u16_le(code.as_u16());
    put_clipped(dst, reason);
}

/// Writes an ERROR frame; `reason` is clipped like [`encode_go_away`]'s.
#[inline]
pub fn encode_error(dst: &mut impl BufMut, code: ErrorCode, reason: &str, max_payload: usize) {
    let reason = clip(reason, max_payload.saturating_sub(ERROR_FIXED_LEN));
    head(
        dst,
        ERROR_FIXED_LEN + reason.len(),
        FrameType::ERROR,
        0,
        CallId::CONNECTION,
    );
    dst.put_u16_le(code.as_u16());
    put_clipped(dst, reason);
}

#[inline]
pub(super) fn decode_ping(header: &Header, payload: &[u8]) -> Result<Frame, ProtocolError> {
    exact_len(payload, 8, FrameType::PING)?;
    let mut data = [0u8; 8];
    data.copy_from_slice(payload);
    Ok(Frame::Ping {
        ack: header.flags & FLAG_ACK != 0,
        data,
    })
}

#[inline]
pub(super) fn decode_go_away(payload: &Bytes) -> Result<Frame, ProtocolError> {
    at_least(payload, GOAWAY_FIXED_LEN, FrameType::GOAWAY)?;
    let last_call_id = CallId(u32_at(payload, 0));
    let code = ErrorCode::from_u16(u16_at(payload, 4));
    let (reason, used) = text_u16(payload, 6, "GOAWAY reason")?;
    no_trailing(payload, used, FrameType::GOAWAY)?;
    Ok(Frame::GoAway {
        last_call_id,
        code,
        reason,
    })
}

#[inline]
pub(super) fn decode_error(payload: &Bytes) -> Result<Frame, ProtocolError> {
    at_least(payload, ERROR_FIXED_LEN, FrameType::ERROR)?;
    let code = ErrorCode::from_u16(u16_at(payload, 0));
    let (reason, used) = text_u16(payload, 2, "ERROR reason")?;
    no_trailing(payload, used, FrameType::ERROR)?;
    Ok(Frame::Error { code, reason })
}
