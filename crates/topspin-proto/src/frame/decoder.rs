//! Splits frames off a receive buffer, by reference.

use super::{
    CallFrame, CallId, EndFrame, Frame, FrameType, Header, MessageFrame, FLAG_END_STREAM,
    FLAG_SPLIT, HEADER_LEN,
};
use crate::error::{ErrorCode, ProtocolError};
use bytes::{Buf, BytesMut};

/// Cuts complete frames off the front of a receive buffer without copying their payloads.
///
/// The length check happens on the header alone, so a hostile length never causes a large
/// allocation: [`FrameDecoder::bytes_needed`] tells the caller how much to read next.
///
/// ```
/// use bytes::BytesMut;
/// use topspin_proto::frame::{Frame, FrameDecoder};
/// use topspin_proto::CallId;
///
/// let mut wire = BytesMut::new();
/// Frame::Credit { call_id: CallId(3), increment: 4096 }.encode(&mut wire);
/// let mut dec = FrameDecoder::new(16 * 1024 * 1024);
/// let frame = dec.decode(&mut wire).unwrap().unwrap();
/// assert_eq!(frame, Frame::Credit { call_id: CallId(3), increment: 4096 });
/// assert!(wire.is_empty());
/// ```
#[derive(Clone, Debug)]
pub struct FrameDecoder {
    max_frame_size: u32,
}

impl FrameDecoder {
    /// A decoder that refuses frames with payloads above `max_frame_size`.
    pub fn new(max_frame_size: u32) -> FrameDecoder {
        FrameDecoder { max_frame_size }
    }

    /// The payload limit in force.
    pub fn max_frame_size(&self) -> u32 {
        self.max_frame_size
    }

    /// Parses and checks the header at the front of `src`, if 12 bytes are there.
    #[inline]
    pub fn peek_header(&self, src: &[u8]) -> Result<Option<Header>, ProtocolError> {
        let Some(h) = src.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let header = Header::parse(h);
        if header.length > self.max_frame_size {
            return Err(ProtocolError::new(
                ErrorCode::FRAME_TOO_LARGE,
                format!(
                    "frame of type 0x{:02x} declares a {}-byte payload, above this side's MAX_FRAME_SIZE of {}",
                    header.ty, header.length, self.max_frame_size
                ),
            ));
        }
        Ok(Some(header))
    }

    /// How many bytes `src` must hold before the next [`FrameDecoder::decode`] can return a
    /// frame (0 if one is complete already). A reader uses it to read a large frame into one
    /// exactly sized buffer.
    pub fn bytes_needed(&self, src: &[u8]) -> Result<usize, ProtocolError> {
        match self.peek_header(src)? {
            None => Ok(HEADER_LEN - src.len()),
            Some(h) => Ok((HEADER_LEN + h.length as usize).saturating_sub(src.len())),
        }
    }

    /// The commonest frames of a call, when one is complete at the front of `src`: a whole
    /// MESSAGE (its body split off by reference), and — on the side that receives them
    /// (`server`: CALL, else END) — a CALL of an interned method or an END with no texts and
    /// no metadata, parsed in place; each taken off `src` without being built as a [`Frame`].
    /// `None` for anything else (another frame, too few bytes, a header or call id
    /// [`FrameDecoder::decode`] refuses), which `decode` then takes: same checks, same fields.
    #[inline(always)]
    pub(crate) fn decode_hot(&self, src: &mut BytesMut, server: bool) -> Option<Hot> {
        let header = Header::parse(src.first_chunk::<HEADER_LEN>()?);
        let total = HEADER_LEN + header.length as usize;
        if header.length > self.max_frame_size || src.len() < total {
            return None;
        }
        if is_whole_message(&header) {
            return Some(Hot::Message(split_message(&header, src, total)));
        }
        if header.call_id == CallId::CONNECTION {
            return None;
        }
        let payload = &src[HEADER_LEN..total];
        let hot = match FrameType(header.ty) {
            FrameType::CALL if server => Hot::Call(super::call::decode_bare(&header, payload)?),
            FrameType::END if !server => {
                Hot::End(super::response::decode_bare_end(&header, payload)?)
            }
            _ => return None,
        };
        src.advance(total);
        Some(hot)
    }

    /// Removes one complete frame from the front of `src` and decodes it; `Ok(None)` when more
    /// bytes are needed. Payload slices share `src`'s memory.
    #[inline]
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, ProtocolError> {
        let Some(header) = self.peek_header(src)? else {
            return Ok(None);
        };
        let total = HEADER_LEN + header.length as usize;
        if src.len() < total {
            return Ok(None);
        }
        // A whole message on a call, the commonest frame: its body is the payload.
        if is_whole_message(&header) {
            return Ok(Some(Frame::Message(split_message(&header, src, total))));
        }
        // Frames without a body are parsed where they lie and skipped; only a frame with a
        // body (a message, a text, metadata) is split off, its header then dropped from the
        // shared slice.
        if let Some(frame) = Frame::decode_in_place(&header, &src[HEADER_LEN..total]) {
            src.advance(total);
            return frame.map(Some);
        }
        let mut payload = src.split_to(total).freeze();
        payload.advance(HEADER_LEN);
        Frame::decode(&header, payload).map(Some)
    }
}

/// A frame [`FrameDecoder::decode_hot`] takes off the receive buffer.
pub(crate) enum Hot {
    /// A whole MESSAGE on a call.
    Message(MessageFrame),
    /// A CALL of an interned method, with no metadata.
    Call(CallFrame),
    /// An END with no status message and no trailers.
    End(EndFrame),
}

/// Whether a header is a whole (not split) MESSAGE's on a call.
#[inline(always)]
fn is_whole_message(header: &Header) -> bool {
    header.ty == FrameType::MESSAGE.0
        && header.flags & FLAG_SPLIT == 0
        && header.call_id != CallId::CONNECTION
}

/// Splits a whole MESSAGE of `total` bytes (header included) off the front of `src`.
#[inline(always)]
fn split_message(header: &Header, src: &mut BytesMut, total: usize) -> MessageFrame {
    let mut chunk = src.split_to(total).freeze();
    chunk.advance(HEADER_LEN);
    MessageFrame {
        call_id: header.call_id,
        end_stream: header.flags & FLAG_END_STREAM != 0,
        total_len: None,
        chunk,
    }
}
