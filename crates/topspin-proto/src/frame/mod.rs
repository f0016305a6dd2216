//! The frame codec: every frame type of protocol.md §5, encoded into a caller's buffer and
//! decoded by reference (payloads are slices of the received [`Bytes`], never copies).

//!
//! One file per frame family, each with the encoder and the decoder of its types: the engine,
//! the tests, the fuzz targets and the benches all write frames through these encoders (which
//! write into the caller's buffer and never allocate), and text is clipped at a character
//! boundary in one function, [`clip`].

mod call;
mod connection;
mod control;
mod decoder;
mod header;
mod message;
mod response;
mod text;

pub use call::{call_len, encode_call, CallFrame, CALL_FIXED_LEN};
pub use connection::{
    encode_error, encode_go_away, encode_ping, encode_settings, ERROR_FIXED_LEN, GOAWAY_FIXED_LEN,
};
pub use control::{encode_cancel, encode_credit, encode_half_close};
pub use decoder::FrameDecoder;
pub(crate) use decoder::Hot;
pub use header::{CallId, Header, HEADER_LEN};
pub use message::{encode_continuation_head, encode_message_head, MessageFrame};
pub use response::{encode_end, encode_headers, end_len, EndFrame, END_FIXED_LEN};
pub use text::{clip, MAX_TEXT_LEN};

pub(crate) use call::write_call;
pub(crate) use control::{write_cancel, write_credit, write_half_close};
pub(crate) use message::{write_continuation_head, write_message_head};
pub(crate) use response::{write_end, write_headers};

use crate::error::{ErrorCode, ProtocolError};
use crate::metadata::Metadata;
use crate::settings::Settings;
use crate::status::Code;
use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;

/// A frame type byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameType(pub u8);

impl FrameType {
    /// SETTINGS (connection).
    pub const SETTINGS: FrameType = FrameType(0x01);
    /// CALL: start a call (client → server).
    pub const CALL: FrameType = FrameType(0x02);
    /// MESSAGE: a message, or the first chunk of a split one.
    pub const MESSAGE: FrameType = FrameType(0x03);
    /// CONTINUATION: the next chunk of a split message.
    pub const CONTINUATION: FrameType = FrameType(0x04);
    /// HEADERS: response headers (server → client).
    pub const HEADERS: FrameType = FrameType(0x05);
    /// HALF_CLOSE: the client sends no more messages.
    pub const HALF_CLOSE: FrameType = FrameType(0x06);
    /// END: status and trailers (server → client).
    pub const END: FrameType = FrameType(0x07);
    /// CANCEL: the client abandons a call.
    pub const CANCEL: FrameType = FrameType(0x08);
    /// CREDIT: more send credit for one call.
    pub const CREDIT: FrameType = FrameType(0x09);
    /// PING (and its ACK).
    pub const PING: FrameType = FrameType(0x0A);
    /// GOAWAY: graceful shutdown.
    pub const GOAWAY: FrameType = FrameType(0x0B);
    /// ERROR: fatal protocol error.
    pub const ERROR: FrameType = FrameType(0x0C);

    /// The name used in protocol.md and the test vectors.
    pub fn name(self) -> &'static str {
        match self.0 {
            0x01 => "SETTINGS",
            0x02 => "CALL",
            0x03 => "MESSAGE",
            0x04 => "CONTINUATION",
            0x05 => "HEADERS",
            0x06 => "HALF_CLOSE",
            0x07 => "END",
            0x08 => "CANCEL",
            0x09 => "CREDIT",
            0x0A => "PING",
            0x0B => "GOAWAY",
            0x0C => "ERROR",
            0x80..=0xFF => "EXTENSION",
            _ => "UNKNOWN",
        }
    }
}

/// CALL flag: a method name follows the fixed fields.
pub const FLAG_NAMED: u8 = 0x01;
/// MESSAGE flag: the client's last message.
pub const FLAG_END_STREAM: u8 = 0x01;
/// MESSAGE flag: the payload starts with `total_len` and CONTINUATION frames follow.
pub const FLAG_SPLIT: u8 = 0x02;
/// PING flag: this is the answer.
pub const FLAG_ACK: u8 = 0x01;

/// Highest method id a CALL may bind.
pub const MAX_METHOD_ID: u16 = 1023;
/// Longest method name in bytes.
pub const MAX_METHOD_NAME_LEN: usize = 1024;

/// A decoded frame. Byte fields share the memory of the received buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Frame {
    /// The sender's receive limits.
    Settings(Settings),
    /// Start of a call.
    Call(CallFrame),
    /// A message or the first chunk of a split one.
    Message(MessageFrame),
    /// The next chunk of a split message.
    Continuation {
        /// The call.
        call_id: CallId,
        /// The chunk.
        chunk: Bytes,
    },
    /// Response headers.
    Headers {
        /// The call.
        call_id: CallId,
        /// The headers.
        metadata: Metadata,
    },
    /// The client sends no more messages.
    HalfClose {
        /// The call.
        call_id: CallId,
    },
    /// The call's end.
    End(EndFrame),
    /// The client abandons the call.
    Cancel {
        /// The call.
        call_id: CallId,
        /// Why (CANCELLED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED …).
        code: Code,
    },
    /// More send credit.
    Credit {
        /// The call.
        call_id: CallId,
        /// Bytes of credit added (1 ..= 2³¹−1).
        increment: u32,
    },
    /// Keep-alive / round-trip probe.
    Ping {
        /// Whether this is the answer.
        ack: bool,
        /// Opaque data echoed back.
        data: [u8; 8],
    },
    /// Graceful shutdown.
    GoAway {
        /// Highest call id that will be processed.
        last_call_id: CallId,
        /// `NO_ERROR` or why.
        code: ErrorCode,
        /// Text for people.
        reason: ByteString,
    },
    /// Fatal protocol error.
    Error {
        /// What kind.
        code: ErrorCode,
        /// What exactly.
        reason: ByteString,
    },
    /// An ignorable extension frame (type `0x80..=0xFF`).
    Extension {
        /// Its type.
        ty: u8,
        /// Its flags.
        flags: u8,
        /// Its call id.
        call_id: CallId,
        /// Its payload.
        payload: Bytes,
    },
}

/// Where the hot frame writers append: the engine's staging buffer (appends inlined, so a
/// frame's fixed bytes cost a few stores) or any [`BufMut`] (through [`AnyBuf`], for the
/// public `encode_*` functions). Each writer puts a frame's header and fixed fields as one
/// stack array, so both sinks see the same bytes.
pub(crate) trait Sink {
    /// Appends `b`.
    fn put(&mut self, b: &[u8]);
}

impl Sink for BytesMut {
    #[inline(always)]
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

/// Any [`BufMut`] as a [`Sink`].
pub(crate) struct AnyBuf<'a, B>(pub(crate) &'a mut B);

impl<B: BufMut> Sink for AnyBuf<'_, B> {
    #[inline(always)]
    fn put(&mut self, b: &[u8]) {
        self.0.put_slice(b);
    }
}

/// A frame header's 12 bytes, written at the front of a frame's first stack array.
#[inline(always)]
pub(crate) fn head_into(b: &mut [u8], length: usize, ty: FrameType, flags: u8, call_id: CallId) {
    b[0..4].copy_from_slice(&(length as u32).to_le_bytes());
    b[4] = ty.0;
    b[5] = flags;
    b[6] = 0;
    b[7] = 0;
    b[8..12].copy_from_slice(&call_id.0.to_le_bytes());
}

/// Writes a frame header.
#[inline]
pub(crate) fn head(
    dst: &mut impl BufMut,
    length: usize,
    ty: FrameType,
    flags: u8,
    call_id: CallId,
) {
    Header {
        length: length as u32,
        ty: ty.0,
        flags,
        call_id,
    }
    .encode(dst);
}

impl Frame {
    /// The frame's call id (`CallId(0)` for connection frames).
    pub fn call_id(&self) -> CallId {
        match self {
            Frame::Settings(_)
            | Frame::Ping { .. }
            | Frame::GoAway { .. }
            | Frame::Error { .. } => CallId::CONNECTION,
            Frame::Call(c) => c.call_id,
            Frame::Message(m) => m.call_id,
            Frame::End(e) => e.call_id,
            Frame::Continuation { call_id, .. }
            | Frame::Headers { call_id, .. }
            | Frame::HalfClose { call_id }
            | Frame::Cancel { call_id, .. }
            | Frame::Credit { call_id, .. }
            | Frame::Extension { call_id, .. } => *call_id,
        }
    }

    /// The frame's type.
    pub fn frame_type(&self) -> FrameType {
        match self {
            Frame::Settings(_) => FrameType::SETTINGS,
            Frame::Call(_) => FrameType::CALL,
            Frame::Message(_) => FrameType::MESSAGE,
            Frame::Continuation { .. } => FrameType::CONTINUATION,
            Frame::Headers { .. } => FrameType::HEADERS,
            Frame::HalfClose { .. } => FrameType::HALF_CLOSE,
            Frame::End(_) => FrameType::END,
            Frame::Cancel { .. } => FrameType::CANCEL,
            Frame::Credit { .. } => FrameType::CREDIT,
            Frame::Ping { .. } => FrameType::PING,
            Frame::GoAway { .. } => FrameType::GOAWAY,
            Frame::Error { .. } => FrameType::ERROR,
            Frame::Extension { ty, .. } => FrameType(*ty),
        }
    }

    /// Checks that the frame type may use the header's call id.
    #[inline]
    fn check_call_id(ty: FrameType, call_id: CallId) -> Result<(), ProtocolError> {
        // Bit t set: frame type t is a connection frame (SETTINGS, PING, GOAWAY, ERROR).
        const CONNECTION_FRAMES: u16 = 1 << 0x01 | 1 << 0x0A | 1 << 0x0B | 1 << 0x0C;
        if (0x01..=0x0C).contains(&ty.0)
            && (CONNECTION_FRAMES >> ty.0 & 1 != 0) != (call_id == CallId::CONNECTION)
        {
            return Err(Frame::wrong_call_id(ty, call_id));
        }
        Ok(())
    }

    #[cold]
    fn wrong_call_id(ty: FrameType, call_id: CallId) -> ProtocolError {
        ProtocolError::new(
            ErrorCode::ILLEGAL_FRAME,
            if call_id != CallId::CONNECTION {
                format!("{} frame must use call id 0, got {}", ty.name(), call_id.0)
            } else {
                format!("{} frame must not use call id 0", ty.name())
            },
        )
    }

    /// Decodes a frame from its header and payload. Checks the payload layout and whether the
    /// frame type may use the call id; checks that need connection state are the
    /// connection's job.
    pub fn decode(header: &Header, payload: Bytes) -> Result<Frame, ProtocolError> {
        let ty = FrameType(header.ty);
        Frame::check_call_id(ty, header.call_id)?;
        match ty {
            FrameType::SETTINGS => Ok(Frame::Settings(Settings::decode_payload(&payload)?)),
            FrameType::CALL => call::decode(header, payload),
            FrameType::MESSAGE => message::decode_message(header, payload),
            FrameType::CONTINUATION => Ok(message::decode_continuation(header, payload)),
            FrameType::HEADERS => response::decode_headers(header, payload),
            FrameType::HALF_CLOSE => control::decode_half_close(header, &payload),
            FrameType::END => response::decode_end(header, payload),
            FrameType::CANCEL => control::decode_cancel(header, &payload),
            FrameType::CREDIT => control::decode_credit(header, &payload),
            FrameType::PING => connection::decode_ping(header, &payload),
            FrameType::GOAWAY => connection::decode_go_away(&payload),
            FrameType::ERROR => connection::decode_error(&payload),
            FrameType(t @ 0x80..=0xFF) => Ok(Frame::Extension {
                ty: t,
                flags: header.flags,
                call_id: header.call_id,
                payload,
            }),
            FrameType(t) => Err(ProtocolError::new(
                ErrorCode::UNKNOWN_FRAME_TYPE,
                format!("unknown frame type 0x{t:02x} (types 0x0d..=0x7f must be understood; 0x80..=0xff may be skipped)"),
            )),
        }
    }

    /// Decodes a frame that needs no slice of the receive buffer — the small control frames,
    /// and a CALL, END or HEADERS whose texts and metadata are empty — from its payload in
    /// place, so the decoder can skip it without splitting it off; `None` for every other
    /// frame (which [`Frame::decode`] takes as a shared slice). Same checks, same frame as
    /// [`Frame::decode`].
    #[inline]
    pub(crate) fn decode_in_place(
        header: &Header,
        payload: &[u8],
    ) -> Option<Result<Frame, ProtocolError>> {
        let ty = FrameType(header.ty);
        let frame = match ty {
            FrameType::CALL => call::decode_bare(header, payload).map(Frame::Call),
            FrameType::END => response::decode_bare_end(header, payload).map(Frame::End),
            FrameType::HEADERS if payload == [0, 0] => Some(Frame::Headers {
                call_id: header.call_id,
                metadata: Metadata::new(),
            }),
            FrameType::HALF_CLOSE
            | FrameType::CANCEL
            | FrameType::CREDIT
            | FrameType::PING
            | FrameType::SETTINGS => {
                return Some(
                    Frame::check_call_id(ty, header.call_id)
                        .and_then(|()| Frame::decode_control(header, payload)),
                );
            }
            _ => None,
        }?;
        Some(Frame::check_call_id(ty, header.call_id).map(|()| frame))
    }

    /// The frames parsed into fixed fields only (their call id already checked).
    #[inline]
    fn decode_control(header: &Header, payload: &[u8]) -> Result<Frame, ProtocolError> {
        match FrameType(header.ty) {
            FrameType::HALF_CLOSE => control::decode_half_close(header, payload),
            FrameType::CANCEL => control::decode_cancel(header, payload),
            FrameType::CREDIT => control::decode_credit(header, payload),
            FrameType::PING => connection::decode_ping(header, payload),
            _ => Ok(Frame::Settings(Settings::decode_payload(payload)?)),
        }
    }

    /// Payload length of the encoded frame (texts as [`clip`] cuts them).
    pub fn payload_len(&self) -> usize {
        match self {
            Frame::Settings(_) => Settings::PAYLOAD_LEN,
            Frame::Call(c) => call_len(c.method_name.as_deref(), &c.metadata),
            Frame::Message(m) => m.total_len.map_or(0, |_| 4) + m.chunk.len(),
            Frame::Continuation { chunk, .. } => chunk.len(),
            Frame::Headers { metadata, .. } => metadata.encoded_len(),
            Frame::HalfClose { .. } => 0,
            Frame::End(e) => end_len(&e.message, &e.trailers),
            Frame::Cancel { .. } => 2,
            Frame::Credit { .. } => 4,
            Frame::Ping { .. } => 8,
            Frame::GoAway { reason, .. } => GOAWAY_FIXED_LEN + clip(reason, usize::MAX).len(),
            Frame::Error { reason, .. } => ERROR_FIXED_LEN + clip(reason, usize::MAX).len(),
            Frame::Extension { payload, .. } => payload.len(),
        }
    }

    /// Writes the header and every payload byte except a trailing body (a message chunk or an
    /// extension payload), which it returns so the caller can send it by reference in a
    /// vectored write instead of copying it. Uses the same per-type encoders as the
    /// connection; texts over 65,535 bytes are clipped at a character boundary.
    pub fn encode_head(&self, dst: &mut impl BufMut) -> Option<&Bytes> {
        match self {
            Frame::Settings(s) => encode_settings(dst, s),
            Frame::Call(c) => encode_call(
                dst,
                c.call_id,
                c.method_id,
                c.method_name.as_deref(),
                c.codec,
                c.timeout_us,
                &c.metadata,
            ),
            Frame::Message(m) => {
                encode_message_head(dst, m.call_id, m.end_stream, m.total_len, m.chunk.len());
                return Some(&m.chunk);
            }
            Frame::Continuation { call_id, chunk } => {
                encode_continuation_head(dst, *call_id, chunk.len());
                return Some(chunk);
            }
            Frame::Headers { call_id, metadata } => encode_headers(dst, *call_id, metadata),
            Frame::HalfClose { call_id } => encode_half_close(dst, *call_id),
            Frame::End(e) => encode_end(dst, e.call_id, e.code, &e.message, &e.trailers),
            Frame::Cancel { call_id, code } => encode_cancel(dst, *call_id, *code),
            Frame::Credit { call_id, increment } => encode_credit(dst, *call_id, *increment),
            Frame::Ping { ack, data } => encode_ping(dst, *ack, data),
            Frame::GoAway {
                last_call_id,
                code,
                reason,
            } => encode_go_away(dst, *last_call_id, *code, reason, usize::MAX),
            Frame::Error { code, reason } => encode_error(dst, *code, reason, usize::MAX),
            Frame::Extension {
                ty,
                flags,
                call_id,
                payload,
            } => {
                head(dst, payload.len(), FrameType(*ty), *flags, *call_id);
                return Some(payload);
            }
        }
        None
    }

    /// Writes the whole frame into `dst` (copying any body).
    ///
    /// ```
    /// use bytes::{Bytes, BytesMut};
    /// use topspin_proto::frame::{Frame, MessageFrame};
    /// use topspin_proto::CallId;
    /// let f = Frame::Message(MessageFrame {
    ///     call_id: CallId(1), end_stream: true, total_len: None, chunk: Bytes::from_static(b"hi"),
    /// });
    /// let mut buf = BytesMut::new();
    /// f.encode(&mut buf);
    /// assert_eq!(&buf[..], b"\x02\0\0\0\x03\x01\0\0\x01\0\0\0hi");
    /// ```
    pub fn encode(&self, dst: &mut BytesMut) {
        dst.reserve(HEADER_LEN + self.payload_len());
        if let Some(body) = self.encode_head(dst) {
            dst.put_slice(body);
        }
    }

    /// The whole frame as a new buffer.
    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::new();
        self.encode(&mut b);
        b.freeze()
    }
}

#[cfg(test)]
mod tests;
