//! Connection-level protocol errors (protocol.md §10).

use std::borrow::Cow;
use std::fmt;

/// A protocol error code, as carried by ERROR and GOAWAY frames (protocol.md §10).
///
/// An open set, like [`FrameType`](crate::frame::FrameType): a code from a newer peer that this
/// implementation does not know keeps its number (and is handled like `INTERNAL_ERROR`).
///
/// ```
/// use topspin_proto::ErrorCode;
/// assert_eq!(ErrorCode::from_u16(8), ErrorCode::UNKNOWN_CALL);
/// assert_eq!(ErrorCode::UNKNOWN_CALL.to_string(), "UNKNOWN_CALL");
/// let newer = ErrorCode::from_u16(300);
/// assert!(!newer.is_known());
/// assert_eq!(newer.to_string(), "UNKNOWN_ERROR_CODE(300)");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub u16);

impl ErrorCode {
    /// Graceful (GOAWAY only).
    pub const NO_ERROR: ErrorCode = ErrorCode(0);
    /// The first 7 bytes were not `TOPSPIN`.
    pub const BAD_PREFACE: ErrorCode = ErrorCode(1);
    /// The preface names a version the receiver does not speak.
    pub const UNSUPPORTED_VERSION: ErrorCode = ErrorCode(2);
    /// SETTINGS missing, repeated, or with a value out of range.
    pub const SETTINGS_ERROR: ErrorCode = ErrorCode(3);
    /// Frame length above the receiver's `MAX_FRAME_SIZE`.
    pub const FRAME_TOO_LARGE: ErrorCode = ErrorCode(4);
    /// Type `0x00` or an unknown type in `0x0D..=0x7F`.
    pub const UNKNOWN_FRAME_TYPE: ErrorCode = ErrorCode(5);
    /// Payload does not match its layout.
    pub const MALFORMED_FRAME: ErrorCode = ErrorCode(6);
    /// A valid frame that is not allowed here (side, call id, state).
    pub const ILLEGAL_FRAME: ErrorCode = ErrorCode(7);
    /// A call frame for an id that was never opened.
    pub const UNKNOWN_CALL: ErrorCode = ErrorCode(8);
    /// CALL with an id not above every earlier one.
    pub const DUPLICATE_CALL: ErrorCode = ErrorCode(9);
    /// Unbound, rebound or out-of-range method id.
    pub const METHOD_ID_ERROR: ErrorCode = ErrorCode(10);
    /// Message frame without credit, or credit overflow.
    pub const FLOW_CONTROL: ErrorCode = ErrorCode(11);
    /// Split message chunks that do not add up to `total_len`.
    pub const MESSAGE_LENGTH_MISMATCH: ErrorCode = ErrorCode(12);
    /// Handshake or idle timeout.
    pub const TIMEOUT: ErrorCode = ErrorCode(13);
    /// The sender failed on its own account.
    pub const INTERNAL_ERROR: ErrorCode = ErrorCode(14);
    /// The peer generates excessive load (PING flood, calls cancelled before an answer, calls
    /// refused over the limit …): the receiver closes the connection (GOAWAY, then ERROR).
    pub const ENHANCE_YOUR_CALM: ErrorCode = ErrorCode(15);

    /// The code for a wire value (any value: unknown ones are kept).
    pub fn from_u16(v: u16) -> ErrorCode {
        ErrorCode(v)
    }

    /// The wire value.
    pub fn as_u16(self) -> u16 {
        self.0
    }

    /// Whether protocol.md names this code.
    pub fn is_known(self) -> bool {
        self.0 <= ErrorCode::ENHANCE_YOUR_CALM.0
    }

    /// The upper-case name used in the protocol document and the test vectors (`"UNKNOWN"`
    /// for a code it does not name).
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "NO_ERROR",
            1 => "BAD_PREFACE",
            2 => "UNSUPPORTED_VERSION",
            3 => "SETTINGS_ERROR",
            4 => "FRAME_TOO_LARGE",
            5 => "UNKNOWN_FRAME_TYPE",
            6 => "MALFORMED_FRAME",
            7 => "ILLEGAL_FRAME",
            8 => "UNKNOWN_CALL",
            9 => "DUPLICATE_CALL",
            10 => "METHOD_ID_ERROR",
            11 => "FLOW_CONTROL",
            12 => "MESSAGE_LENGTH_MISMATCH",
            13 => "TIMEOUT",
            14 => "INTERNAL_ERROR",
            15 => "ENHANCE_YOUR_CALM",
            _ => "UNKNOWN",
        }
    }

    /// The code with this name, if any.
    pub fn from_name(name: &str) -> Option<ErrorCode> {
        (0..=ErrorCode::ENHANCE_YOUR_CALM.0)
            .map(ErrorCode)
            .find(|c| c.name() == name)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_known() {
            f.write_str(self.name())
        } else {
            write!(f, "UNKNOWN_ERROR_CODE({})", self.0)
        }
    }
}

impl fmt::Debug for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A connection error: a code and a reason a person can act on.
///
/// ```
/// use topspin_proto::{ErrorCode, ProtocolError};
/// let e = ProtocolError::new(ErrorCode::FRAME_TOO_LARGE, "frame of 5 bytes");
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
        ProtocolError::new(ErrorCode::MALFORMED_FRAME, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for v in 0..=14u16 {
            let c = ErrorCode::from_u16(v);
            assert!(c.is_known());
            assert_eq!(c.as_u16(), v);
            assert_eq!(ErrorCode::from_name(c.name()), Some(c));
        }
        // A newer peer's code is kept, not folded into INTERNAL_ERROR.
        let newer = ErrorCode::from_u16(15);
        assert_ne!(newer, ErrorCode::INTERNAL_ERROR);
        assert_eq!(newer.as_u16(), 15);
        assert_eq!(ErrorCode::from_name("UNKNOWN"), None);
    }
}
