//! HEADERS and END (protocol.md §5.6, §5.8): what the server sends around its messages.

use super::text::{at_least, clip, no_trailing, text_u16, u16_at};
use super::{head_into, AnyBuf, CallId, Frame, FrameType, Header, Sink, HEADER_LEN};
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
    write_headers(&mut AnyBuf(dst), call_id, metadata);
}

/// [`encode_headers`] into a [`Sink`].
#[inline]
pub(crate) fn write_headers(dst: &mut impl Sink, call_id: CallId, metadata: &Metadata) {
    let mut b = [0u8; HEADER_LEN];
    head_into(
        &mut b,
        metadata.encoded_len(),
        FrameType::HEADERS,
        0,
        call_id,
    );
    dst.put(&b);
    dst.put(metadata.as_bytes());
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
    write_end(&mut AnyBuf(dst), call_id, code, message, trailers);
}

/// [`encode_end`] into a [`Sink`]: header, code and message length in one write (and the
/// empty trailers with them when there is no message, the usual OK).
#[inline]
pub(crate) fn write_end(
    dst: &mut impl Sink,
    call_id: CallId,
    code: Code,
    message: &str,
    trailers: &Metadata,
) {
    const FIXED: usize = HEADER_LEN + END_FIXED_LEN;
    let message = clip(message, usize::MAX);
    let t = trailers.as_bytes();
    let mut b = [0u8; FIXED + 2];
    let len = END_FIXED_LEN + message.len() + t.len();
    head_into(&mut b, len, FrameType::END, 0, call_id);
    b[12..14].copy_from_slice(&code.as_u16().to_le_bytes());
    b[14..16].copy_from_slice(&(message.len() as u16).to_le_bytes());
    if message.is_empty() && t.len() == 2 {
        b[FIXED..].copy_from_slice(&t[..2]);
        dst.put(&b);
    } else {
        dst.put(&b[..FIXED]);
        dst.put(message.as_bytes());
        dst.put(t);
    }
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

/// An END with no message and no trailers (the usual OK), decoded from the receive buffer in
/// place; `None` for any other shape, which [`decode_end`] handles. Same checks, same frame.
#[inline]
pub(super) fn decode_bare_end(header: &Header, payload: &[u8]) -> Option<EndFrame> {
    let [c0, c1, 0, 0, 0, 0] = *<&[u8; END_FIXED_LEN + 2]>::try_from(payload).ok()? else {
        return None;
    };
    Some(EndFrame {
        call_id: header.call_id,
        code: Code::from_u16(u16::from_le_bytes([c0, c1])),
        message: ByteString::new(),
        trailers: Metadata::new(),
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
