//! The 8-byte connection preface (protocol.md §2).

use crate::error::{ErrorCode, ProtocolError};

/// The magic that opens every connection.
pub const MAGIC: &[u8; 7] = b"TOPSPIN";
/// The protocol version this crate speaks.
pub const VERSION: u8 = 1;
/// Length of the preface.
pub const PREFACE_LEN: usize = 8;
/// The preface this crate sends.
pub const PREFACE: [u8; PREFACE_LEN] = [b'T', b'O', b'P', b'S', b'P', b'I', b'N', VERSION];

/// Checks a received preface.
///
/// ```
/// use topspin_proto::preface::{check, PREFACE};
/// assert!(check(&PREFACE).is_ok());
/// assert!(check(b"GET / HT").is_err());
/// ```
pub fn check(b: &[u8; PREFACE_LEN]) -> Result<(), ProtocolError> {
    if &b[..7] != MAGIC {
        return Err(ProtocolError::new(
            ErrorCode::BAD_PREFACE,
            format!(
                "connection does not start with the topspin preface (got {:02x?}); is the peer speaking another protocol?",
                &b[..]
            ),
        ));
    }
    if b[7] != VERSION {
        return Err(ProtocolError::new(
            ErrorCode::UNSUPPORTED_VERSION,
            format!(
                "peer speaks topspin protocol version {}, this side speaks version {VERSION}",
                b[7]
            ),
        ));
    }
    Ok(())
}
