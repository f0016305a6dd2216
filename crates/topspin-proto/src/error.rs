//! Connection-level protocol errors (protocol.md §10).

use std::borrow::Cow;
use std::fmt;

/// A protocol error code, as carried by ERROR and GOAWAY frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// Graceful (GOAWAY only).
    NoError = 0,
    /// The first 7 bytes were not `TOPSPIN`.
    BadPreface = 1,
    /// The preface names a version the receiver does not speak.
    UnsupportedVersion = 2,
    /// SETTINGS missing, repeated, or with a value out of range.
    SettingsError = 3,
    /// Frame length above the receiver's `MAX_FRAME_SIZE`.
    FrameTooLarge = 4,
    /// Type `0x00` or an unknown type in `0x0D..=0x7F`.
    UnknownFrameType = 5,
    /// Payload does not match its layout.
    MalformedFrame = 6,
    /// A valid frame that is not allowed here (side, call id, state).
    IllegalFrame = 7,
    /// A call frame for an id that was never opened.
    UnknownCall = 8,
    /// CALL with an id not above every earlier one.
    DuplicateCall = 9,
    /// Unbound, rebound or out-of-range method id.
    MethodIdError = 10,
    /// Message frame without credit, or credit overflow.
    FlowControl = 11,
    /// Split message chunks that do not add up to `total_len`.
    MessageLengthMismatch = 12,
    /// Handshake or idle timeout.
    Timeout = 13,
    /// The sender failed on its own account.
    InternalError = 14,
}

impl ErrorCode {
    const ALL: [ErrorCode; 15] = [
        ErrorCode::NoError,
        ErrorCode::BadPreface,
        ErrorCode::UnsupportedVersion,
        ErrorCode::SettingsError,
        ErrorCode::FrameTooLarge,
        ErrorCode::UnknownFrameType,
        ErrorCode::MalformedFrame,
        ErrorCode::IllegalFrame,
        ErrorCode::UnknownCall,
        ErrorCode::DuplicateCall,
        ErrorCode::MethodIdError,
        ErrorCode::FlowControl,
        ErrorCode::MessageLengthMismatch,
        ErrorCode::Timeout,
        ErrorCode::InternalError,
    ];

    /// The code for a wire value; unknown values map to [`ErrorCode::InternalError`].
    ///
    /// ```
    /// use topspin_proto::ErrorCode;
    /// assert_eq!(ErrorCode::from_u16(8), ErrorCode::UnknownCall);
    /// assert_eq!(ErrorCode::from_u16(999), ErrorCode::InternalError);
    /// ```
    pub fn from_u16(v: u16) -> ErrorCode {
        ErrorCode::ALL
            .get(usize::from(v))
            .copied()
            .unwrap_or(ErrorCode::InternalError)
    }

    /// The wire value.
    pub fn as_u16(self) -> u16 {
        self as u16
    }

    /// The upper-case name used in the protocol document and the test vectors.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::NoError => "NO_ERROR",
            ErrorCode::BadPreface => "BAD_PREFACE",
            ErrorCode::UnsupportedVersion => "UNSUPPORTED_VERSION",
            ErrorCode::SettingsError => "SETTINGS_ERROR",
            ErrorCode::FrameTooLarge => "FRAME_TOO_LARGE",
            ErrorCode::UnknownFrameType => "UNKNOWN_FRAME_TYPE",
            ErrorCode::MalformedFrame => "MALFORMED_FRAME",
            ErrorCode::IllegalFrame => "ILLEGAL_FRAME",
            ErrorCode::UnknownCall => "UNKNOWN_CALL",
            ErrorCode::DuplicateCall => "DUPLICATE_CALL",
            ErrorCode::MethodIdError => "METHOD_ID_ERROR",
            ErrorCode::FlowControl => "FLOW_CONTROL",
            ErrorCode::MessageLengthMismatch => "MESSAGE_LENGTH_MISMATCH",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::InternalError => "INTERNAL_ERROR",
        }
    }

    /// The code with this name, if any.
    pub fn from_name(name: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.name() == name)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A connection error: a code and a reason a person can act on.
///
/// ```
/// use topspin_proto::{ErrorCode, ProtocolError};
/// let e = ProtocolError::new(ErrorCode::FrameTooLarge, "frame of 5 bytes");
/// assert_eq!(e.to_string(), "FRAME_TOO_LARGE: frame of 5 bytes");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {reason}")]
pub struct ProtocolError {
    /// What kind of error.
    pub code: ErrorCode,
    /// What exactly was wrong.
    pub reason: Cow<'static, str>,
}

impl ProtocolError {
    /// A new error.
    pub fn new(code: ErrorCode, reason: impl Into<Cow<'static, str>>) -> ProtocolError {
        ProtocolError {
            code,
            reason: reason.into(),
        }
    }

    pub(crate) fn malformed(reason: impl Into<Cow<'static, str>>) -> ProtocolError {
        ProtocolError::new(ErrorCode::MalformedFrame, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for (i, c) in ErrorCode::ALL.iter().enumerate() {
            assert_eq!(c.as_u16() as usize, i);
            assert_eq!(ErrorCode::from_u16(i as u16), *c);
            assert_eq!(ErrorCode::from_name(c.name()), Some(*c));
        }
    }
}
