//! HEADERS and END (protocol.md §5.6, §5.8): what the server sends around its messages.

use super::text::{at_least, clip, no_trailing, put_clipped, text_u16, u16_at};
use super::{head, CallId, Frame, FrameType, Header};
use crate::error::ProtocolError;
use crate::metadata::Metadata;
use crate::status::Code;
use bytes::{BufMut, Bytes};
use bytestring::ByteString;

/// Fixed part of an END payload: code and message length.
pub const END_FIXED_LEN: usize = 4;

/// END: the call's status and trailers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndFrame {
    /// The call.
    pub call_id: CallId,
    /// Status code.
    pub code: Code,
    /// Status message.
    pub message: ByteString,
    /// Trailing metadata.
    pub trailers: Metadata,
}

/// Writes a HEADERS frame.
#[inline]
pub fn encode_headers(dst: &mut impl BufMut, call_id: CallId, metadata: &Metadata) {
    head(dst, metadata.encoded_len(), FrameType::HEADERS, 0, call_id);
    metadata.encode(dst);
}

/// Payload length of an END with this message (clipped to 65,535 bytes) and trailers.
#[inline]
pub fn end_len(message: &str, trailers: &Metadata) -> usize {
    END_FIXED_LEN + clip(message, usize::MAX).len() + trailers.encoded_len()
}

/// Writes an END frame; a message over 65,535 bytes is clipped at a character boundary.
#[inline]
pub fn encode_end(
    dst: &mut impl BufMut,
    call_id: CallId,
    code: Code,
    message: &str,
    trailers: &Metadata,
) {
    let message = clip(message, usize::MAX);
    head(dst, end_len(message, trailers), FrameType::END, 0, call_id);
    dst.put_u16_le(code.as_u16());
    put_clipped(dst, message);
    trailers.encode(dst);
}

#[inline]
pub(super) fn decode_headers(header: &Header, payload: Bytes) -> Result<Frame, ProtocolError> {
    let (metadata, used) = Metadata::decode(&payload)?;
    no_trailing(&payload, used, FrameType::HEADERS)?;
    Ok(Frame::Headers {
        call_id: header.call_id,
        metadata,
    })
}

#[inline]
pub(super) fn decode_end(header: &Header, payload: Bytes) -> Result<Frame, ProtocolError> {
    at_least(&payload, END_FIXED_LEN, FrameType::END)?;
    let code = Code::from_u16(u16_at(&payload, 0));
    let (message, at) = text_u16(&payload, 2, "END status message")?;
    let (trailers, used) = Metadata::decode(&payload.slice(at..))?;
    no_trailing(&payload, at + used, FrameType::END)?;
    Ok(Frame::End(EndFrame {
        call_id: header.call_id,
        code,
        message,
        trailers,
    }))
}
