//! The frame codec: every frame type of protocol.md §5, encoded into a caller's buffer and
//! decoded by reference (payloads are slices of the received [`Bytes`], never copies).

mod decoder;
mod header;

pub use decoder::FrameDecoder;
pub use header::{CallId, Header, HEADER_LEN};

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

/// A decoded frame. Byte fields share the memory of the received buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
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

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn text(payload: &Bytes, what: &'static str) -> Result<ByteString, ProtocolError> {
    ByteString::try_from(payload.clone())
        .map_err(|_| ProtocolError::malformed(format!("{what} is not valid UTF-8")))
}

/// A length-prefixed (u16) text at `at`; returns it and the offset after it.
fn text_u16(
    payload: &Bytes,
    at: usize,
    what: &'static str,
) -> Result<(ByteString, usize), ProtocolError> {
    if payload.len() < at + 2 {
        return Err(ProtocolError::malformed(format!(
            "{what} length is truncated"
        )));
    }
    let len = usize::from(u16_at(payload, at));
    let end = at + 2 + len;
    if payload.len() < end {
        return Err(ProtocolError::malformed(format!(
            "{what} of {len} bytes is truncated to {}",
            payload.len() - at - 2
        )));
    }
    Ok((text(&payload.slice(at + 2..end), what)?, end))
}

fn exact_len(payload: &Bytes, n: usize, ty: FrameType) -> Result<(), ProtocolError> {
    if payload.len() != n {
        return Err(ProtocolError::malformed(format!(
            "{} payload must be {n} bytes, got {}",
            ty.name(),
            payload.len()
        )));
    }
    Ok(())
}

fn no_trailing(payload: &Bytes, used: usize, ty: FrameType) -> Result<(), ProtocolError> {
    if used != payload.len() {
        return Err(ProtocolError::malformed(format!(
            "{} payload has {} unexpected trailing bytes",
            ty.name(),
            payload.len() - used
        )));
    }
    Ok(())
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

    /// Decodes a frame from its header and payload. Checks the payload layout and whether the
    /// frame type may use the call id; checks that need connection state are the
    /// connection's job.
    pub fn decode(header: &Header, payload: Bytes) -> Result<Frame, ProtocolError> {
        let ty = FrameType(header.ty);
        let call_id = header.call_id;
        let flags = header.flags;
        let connection_frame = matches!(
            ty,
            FrameType::SETTINGS | FrameType::PING | FrameType::GOAWAY | FrameType::ERROR
        );
        if (0x01..=0x0C).contains(&ty.0) && connection_frame != (call_id == CallId::CONNECTION) {
            return Err(ProtocolError::new(
                ErrorCode::IllegalFrame,
                if connection_frame {
                    format!("{} frame must use call id 0, got {}", ty.name(), call_id.0)
                } else {
                    format!("{} frame must not use call id 0", ty.name())
                },
            ));
        }
        match ty {
            FrameType::SETTINGS => Ok(Frame::Settings(Settings::decode_payload(&payload)?)),
            FrameType::CALL => {
                if payload.len() < CALL_FIXED_LEN {
                    return Err(ProtocolError::malformed(format!(
                        "CALL payload of {} bytes is shorter than its {CALL_FIXED_LEN} fixed bytes",
                        payload.len()
                    )));
                }
                let method_id = u16_at(&payload, 0);
                let codec = payload[2];
                let timeout_us = u64::from_le_bytes(payload[4..12].try_into().unwrap_or_default());
                let (method_name, at) = if flags & FLAG_NAMED != 0 {
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
                no_trailing(&payload, at + used, ty)?;
                Ok(Frame::Call(CallFrame {
                    call_id,
                    method_id,
                    method_name,
                    codec,
                    timeout_us,
                    metadata,
                }))
            }
            FrameType::MESSAGE => {
                let end_stream = flags & FLAG_END_STREAM != 0;
                if flags & FLAG_SPLIT != 0 {
                    if payload.len() < 4 {
                        return Err(ProtocolError::malformed(
                            "split MESSAGE payload is shorter than its 4-byte total length",
                        ));
                    }
                    let total_len = u32_at(&payload, 0);
                    Ok(Frame::Message(MessageFrame {
                        call_id,
                        end_stream,
                        total_len: Some(total_len),
                        chunk: payload.slice(4..),
                    }))
                } else {
                    Ok(Frame::Message(MessageFrame {
                        call_id,
                        end_stream,
                        total_len: None,
                        chunk: payload,
                    }))
                }
            }
            FrameType::CONTINUATION => Ok(Frame::Continuation {
                call_id,
                chunk: payload,
            }),
            FrameType::HEADERS => {
                let (metadata, used) = Metadata::decode(&payload)?;
                no_trailing(&payload, used, ty)?;
                Ok(Frame::Headers { call_id, metadata })
            }
            FrameType::HALF_CLOSE => {
                exact_len(&payload, 0, ty)?;
                Ok(Frame::HalfClose { call_id })
            }
            FrameType::END => {
                if payload.len() < 2 {
                    return Err(ProtocolError::malformed("END payload is shorter than its status code"));
                }
                let code = Code::from_u16(u16_at(&payload, 0));
                let (message, at) = text_u16(&payload, 2, "END status message")?;
                let (trailers, used) = Metadata::decode(&payload.slice(at..))?;
                no_trailing(&payload, at + used, ty)?;
                Ok(Frame::End(EndFrame {
                    call_id,
                    code,
                    message,
                    trailers,
                }))
            }
            FrameType::CANCEL => {
                exact_len(&payload, 2, ty)?;
                Ok(Frame::Cancel {
                    call_id,
                    code: Code::from_u16(u16_at(&payload, 0)),
                })
            }
            FrameType::CREDIT => {
                exact_len(&payload, 4, ty)?;
                let increment = u32_at(&payload, 0);
                if increment == 0 || increment > crate::settings::MAX_WINDOW {
                    return Err(ProtocolError::malformed(format!(
                        "CREDIT increment must be 1..=2147483647, got {increment}"
                    )));
                }
                Ok(Frame::Credit { call_id, increment })
            }
            FrameType::PING => {
                exact_len(&payload, 8, ty)?;
                let mut data = [0u8; 8];
                data.copy_from_slice(&payload);
                Ok(Frame::Ping {
                    ack: flags & FLAG_ACK != 0,
                    data,
                })
            }
            FrameType::GOAWAY => {
                if payload.len() < 6 {
                    return Err(ProtocolError::malformed("GOAWAY payload is shorter than 8 bytes"));
                }
                let last_call_id = CallId(u32_at(&payload, 0));
                let code = ErrorCode::from_u16(u16_at(&payload, 4));
                let (reason, used) = text_u16(&payload, 6, "GOAWAY reason")?;
                no_trailing(&payload, used, ty)?;
                Ok(Frame::GoAway {
                    last_call_id,
                    code,
                    reason,
                })
            }
            FrameType::ERROR => {
                if payload.len() < 2 {
                    return Err(ProtocolError::malformed("ERROR payload is shorter than 4 bytes"));
                }
                let code = ErrorCode::from_u16(u16_at(&payload, 0));
                let (reason, used) = text_u16(&payload, 2, "ERROR reason")?;
                no_trailing(&payload, used, ty)?;
                Ok(Frame::Error { code, reason })
            }
            FrameType(t @ 0x80..=0xFF) => Ok(Frame::Extension {
                ty: t,
                flags,
                call_id,
                payload,
            }),
            FrameType(t) => Err(ProtocolError::new(
                ErrorCode::UnknownFrameType,
                format!("unknown frame type 0x{t:02x} (types 0x0d..=0x7f must be understood; 0x80..=0xff may be skipped)"),
            )),
        }
    }

    /// Payload length of the encoded frame.
    pub fn payload_len(&self) -> usize {
        match self {
            Frame::Settings(_) => Settings::PAYLOAD_LEN,
            Frame::Call(c) => {
                CALL_FIXED_LEN
                    + c.method_name.as_ref().map_or(0, |n| 2 + n.len())
                    + c.metadata.encoded_len()
            }
            Frame::Message(m) => m.total_len.map_or(0, |_| 4) + m.chunk.len(),
            Frame::Continuation { chunk, .. } => chunk.len(),
            Frame::Headers { metadata, .. } => metadata.encoded_len(),
            Frame::HalfClose { .. } => 0,
            Frame::End(e) => 4 + e.message.len() + e.trailers.encoded_len(),
            Frame::Cancel { .. } => 2,
            Frame::Credit { .. } => 4,
            Frame::Ping { .. } => 8,
            Frame::GoAway { reason, .. } => 8 + reason.len(),
            Frame::Error { reason, .. } => 4 + reason.len(),
            Frame::Extension { payload, .. } => payload.len(),
        }
    }

    fn flags(&self) -> u8 {
        match self {
            Frame::Call(c) if c.method_name.is_some() => FLAG_NAMED,
            Frame::Message(m) => {
                (if m.end_stream { FLAG_END_STREAM } else { 0 })
                    | (if m.total_len.is_some() { FLAG_SPLIT } else { 0 })
            }
            Frame::Ping { ack: true, .. } => FLAG_ACK,
            Frame::Extension { flags, .. } => *flags,
            _ => 0,
        }
    }

    /// Writes the header and every payload byte except a trailing body (a message chunk or an
    /// extension payload), which it returns so the caller can send it by reference in a
    /// vectored write instead of copying it.
    ///
    /// Text and metadata longer than their length fields allow must be prevented by the caller
    /// (the connection checks them); they are truncated here.
    pub fn encode_head(&self, dst: &mut impl BufMut) -> Option<&Bytes> {
        Header {
            length: self.payload_len() as u32,
            ty: self.frame_type().0,
            flags: self.flags(),
            call_id: self.call_id(),
        }
        .encode(dst);
        fn put_text(dst: &mut impl BufMut, s: &str) {
            let n = s.len().min(usize::from(u16::MAX));
            dst.put_u16_le(n as u16);
            dst.put_slice(&s.as_bytes()[..n]);
        }
        match self {
            Frame::Settings(s) => s.encode_payload(dst),
            Frame::Call(c) => {
                dst.put_u16_le(c.method_id);
                dst.put_u8(c.codec);
                dst.put_u8(0);
                dst.put_u64_le(c.timeout_us);
                if let Some(name) = &c.method_name {
                    put_text(dst, name);
                }
                c.metadata.encode(dst);
            }
            Frame::Message(m) => {
                if let Some(t) = m.total_len {
                    dst.put_u32_le(t);
                }
                return Some(&m.chunk);
            }
            Frame::Continuation { chunk, .. } => return Some(chunk),
            Frame::Headers { metadata, .. } => metadata.encode(dst),
            Frame::HalfClose { .. } => {}
            Frame::End(e) => {
                dst.put_u16_le(e.code.as_u16());
                put_text(dst, &e.message);
                e.trailers.encode(dst);
            }
            Frame::Cancel { code, .. } => dst.put_u16_le(code.as_u16()),
            Frame::Credit { increment, .. } => dst.put_u32_le(*increment),
            Frame::Ping { data, .. } => dst.put_slice(data),
            Frame::GoAway {
                last_call_id,
                code,
                reason,
            } => {
                dst.put_u32_le(last_call_id.0);
                dst.put_u16_le(code.as_u16());
                put_text(dst, reason);
            }
            Frame::Error { code, reason } => {
                dst.put_u16_le(code.as_u16());
                put_text(dst, reason);
            }
            Frame::Extension { payload, .. } => return Some(payload),
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
