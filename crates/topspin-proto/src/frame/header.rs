//! The fixed 12-byte frame header (protocol.md §3).

use bytes::BufMut;

/// Size of every frame header in bytes.
pub const HEADER_LEN: usize = 12;

/// A call's id on a connection; `CallId(0)` is the connection itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct CallId(pub u32);

impl CallId {
    /// The connection's own id, used by connection frames.
    pub const CONNECTION: CallId = CallId(0);
}

impl std::fmt::Display for CallId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "call {}", self.0)
    }
}

/// A decoded frame header.
///
/// ```
/// use topspin_proto::frame::{Header, FrameType, HEADER_LEN};
/// use topspin_proto::CallId;
/// let h = Header { length: 5, ty: FrameType::MESSAGE.0, flags: 1, call_id: CallId(7) };
/// let mut buf = Vec::new();
/// h.encode(&mut buf);
/// assert_eq!(buf.len(), HEADER_LEN);
/// assert_eq!(Header::parse(buf[..].try_into().unwrap()), h);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Payload length in bytes (not counting the header).
    pub length: u32,
    /// Frame type byte.
    pub ty: u8,
    /// Type-specific flags.
    pub flags: u8,
    /// The call the frame belongs to.
    pub call_id: CallId,
}

impl Header {
    /// Parses a header; every 12-byte sequence is a header (reserved bytes are ignored).
    #[inline]
    pub fn parse(b: &[u8; HEADER_LEN]) -> Header {
        Header {
            length: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            ty: b[4],
            flags: b[5],
            call_id: CallId(u32::from_le_bytes([b[8], b[9], b[10], b[11]])),
        }
    }

    /// Writes the header (reserved bytes as zero).
    #[inline]
    pub fn encode(&self, dst: &mut impl BufMut) {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&self.length.to_le_bytes());
        b[4] = self.ty;
        b[5] = self.flags;
        b[8..12].copy_from_slice(&self.call_id.0.to_le_bytes());
        dst.put_slice(&b);
    }
}
