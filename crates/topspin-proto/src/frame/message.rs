//! MESSAGE and CONTINUATION (protocol.md §5.4, §5.5): a message, whole or split.

use super::text::u32_at;
use super::{
    head_into, AnyBuf, CallId, Frame, FrameType, Header, Sink, FLAG_END_STREAM, FLAG_SPLIT,
    HEADER_LEN,
};
use crate::error::ProtocolError;
use bytes::{BufMut, Bytes};

/// MESSAGE: a whole message, or the first chunk of a split one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageFrame {
    /// The call.
    pub call_id: CallId,
    /// The client's last message.
    pub end_stream: bool,
    /// For a split message, its total length (the SPLIT flag).
    pub total_len: Option<u32>,
    /// The message (or its first chunk).
    pub chunk: Bytes,
}

/// Writes a MESSAGE frame's header (and, for the first chunk of a split message, its total
/// length); the `chunk_len` bytes of the chunk follow, written by the caller — by reference
/// in a vectored write, or copied.
#[inline]
pub fn encode_message_head(
    dst: &mut impl BufMut,
    call_id: CallId,
    end_stream: bool,
    total_len: Option<u32>,
    chunk_len: usize,
) {
    write_message_head(&mut AnyBuf(dst), call_id, end_stream, total_len, chunk_len);
}

/// [`encode_message_head`] into a [`Sink`], in one write.
#[inline]
pub(crate) fn write_message_head(
    dst: &mut impl Sink,
    call_id: CallId,
    end_stream: bool,
    total_len: Option<u32>,
    chunk_len: usize,
) {
    let end = if end_stream { FLAG_END_STREAM } else { 0 };
    let mut b = [0u8; HEADER_LEN + 4];
    match total_len {
        None => {
            head_into(&mut b, chunk_len, FrameType::MESSAGE, end, call_id);
            dst.put(&b[..HEADER_LEN]);
        }
        Some(t) => {
            head_into(
                &mut b,
                4 + chunk_len,
                FrameType::MESSAGE,
                end | FLAG_SPLIT,
                call_id,
            );
            b[HEADER_LEN..].copy_from_slice(&t.to_le_bytes());
            dst.put(&b);
        }
    }
}

/// Writes a CONTINUATION frame's header; the `chunk_len` bytes follow, written by the caller.
#[inline]
pub fn encode_continuation_head(dst: &mut impl BufMut, call_id: CallId, chunk_len: usize) {
    write_continuation_head(&mut AnyBuf(dst), call_id, chunk_len);
}

/// [`encode_continuation_head`] into a [`Sink`].
#[inline]
pub(crate) fn write_continuation_head(dst: &mut impl Sink, call_id: CallId, chunk_len: usize) {
    let mut b = [0u8; HEADER_LEN];
    head_into(&mut b, chunk_len, FrameType::CONTINUATION, 0, call_id);
    dst.put(&b);
}

#[inline]
pub(super) fn decode_message(header: &Header, payload: Bytes) -> Result<Frame, ProtocolError> {
    let end_stream = header.flags & FLAG_END_STREAM != 0;
    if header.flags & FLAG_SPLIT == 0 {
        return Ok(Frame::Message(MessageFrame {
            call_id: header.call_id,
            end_stream,
            total_len: None,
            chunk: payload,
        }));
    }
    if payload.len() < 4 {
        return Err(ProtocolError::malformed(
            "split MESSAGE payload is shorter than its 4-byte total length",
        ));
    }
    Ok(Frame::Message(MessageFrame {
        call_id: header.call_id,
        end_stream,
        total_len: Some(u32_at(&payload, 0)),
        chunk: payload.slice(4..),
    }))
}

#[inline]
pub(super) fn decode_continuation(header: &Header, payload: Bytes) -> Frame {
    Frame::Continuation {
        call_id: header.call_id,
        chunk: payload,
    }
}
