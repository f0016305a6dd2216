//! The settings each side announces once, right after its preface (protocol.md §4).

use crate::error::{ErrorCode, ProtocolError};
use bytes::BufMut;

/// Setting id of [`Settings::max_frame_size`].
pub const SETTING_MAX_FRAME_SIZE: u16 = 1;
/// Setting id of [`Settings::max_concurrent_calls`].
pub const SETTING_MAX_CONCURRENT_CALLS: u16 = 2;
/// Setting id of [`Settings::initial_call_window`].
pub const SETTING_INITIAL_CALL_WINDOW: u16 = 3;
/// Setting id of [`Settings::max_message_size`].
pub const SETTING_MAX_MESSAGE_SIZE: u16 = 4;
/// Setting id of [`Settings::max_metadata_size`].
pub const SETTING_MAX_METADATA_SIZE: u16 = 5;

/// Smallest `MAX_FRAME_SIZE` a peer may announce.
pub const MIN_MAX_FRAME_SIZE: u32 = 16 * 1024;
/// Smallest `MAX_METADATA_SIZE` a peer may announce: the smallest END status (an empty message
/// and an empty trailer block) must always fit, so that a call can always be ended.
pub const MIN_MAX_METADATA_SIZE: u32 = 4;
/// Largest frame size, window and credit value (2³¹ − 1).
pub const MAX_WINDOW: u32 = i32::MAX as u32;

/// The receive limits one side announces; they bind what its peer may send to it. Read with
/// the getters, build with the `with_…` setters (ranges: protocol.md §4).
///
/// ```
/// use topspin_proto::Settings;
/// let s = Settings::default().with_max_message_size(1 << 20);
/// assert_eq!(s.max_message_size(), 1 << 20);
/// assert_eq!(Settings::default().max_frame_size(), 16 * 1024 * 1024);
/// let mut buf = bytes::BytesMut::new();
/// s.encode_payload(&mut buf);
/// assert_eq!(Settings::decode_payload(&buf).unwrap(), s);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub(crate) max_frame_size: u32,
    pub(crate) max_concurrent_calls: u32,
    pub(crate) initial_call_window: u32,
    pub(crate) max_message_size: u32,
    pub(crate) max_metadata_size: u32,
}

macro_rules! setting {
    ($(#[doc = $doc:literal])* $name:ident, $with:ident) => {
        $(#[doc = $doc])*
        pub fn $name(&self) -> u32 {
            self.$name
        }

        #[doc = concat!("Sets [`Settings::", stringify!($name), "`].")]
        #[must_use]
        pub fn $with(mut self, value: u32) -> Settings {
            self.$name = value;
            self
        }
    };
}

impl Settings {
    setting! {
        /// `MAX_FRAME_SIZE`: largest frame payload accepted (default 16 MiB; 16 KiB ..= 2³¹−1).
        max_frame_size, with_max_frame_size
    }
    setting! {
        /// `MAX_CONCURRENT_CALLS`: calls the peer may have open at once towards this side
        /// (default 1024; 0 ..= 2³¹−1).
        max_concurrent_calls, with_max_concurrent_calls
    }
    setting! {
        /// `INITIAL_CALL_WINDOW`: the peer's initial send credit on every call, in bytes
        /// (default 1 MiB; 0 ..= 2³¹−1).
        initial_call_window, with_initial_call_window
    }
    setting! {
        /// `MAX_MESSAGE_SIZE`: largest message accepted (default 64 MiB).
        max_message_size, with_max_message_size
    }
    setting! {
        /// `MAX_METADATA_SIZE`: largest metadata block (with the status message, for END)
        /// accepted (default 16 KiB; 4 ..= 2³²−1, so that the smallest END always fits).
        max_metadata_size, with_max_metadata_size
    }
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            max_frame_size: 16 * 1024 * 1024,
            max_concurrent_calls: 1024,
            initial_call_window: 1024 * 1024,
            max_message_size: 64 * 1024 * 1024,
            max_metadata_size: 16 * 1024,
        }
    }
}

impl Settings {
    /// Encoded size of [`Settings::encode_payload`]'s output.
    pub const PAYLOAD_LEN: usize = 5 * 6;

    /// Checks every value against its valid range.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        if !(MIN_MAX_FRAME_SIZE..=MAX_WINDOW).contains(&self.max_frame_size) {
            return Err(ProtocolError::new(
                ErrorCode::SETTINGS_ERROR,
                format!(
                    "MAX_FRAME_SIZE {} is outside {MIN_MAX_FRAME_SIZE}..={MAX_WINDOW}",
                    self.max_frame_size
                ),
            ));
        }
        if self.max_concurrent_calls > MAX_WINDOW {
            return Err(ProtocolError::new(
                ErrorCode::SETTINGS_ERROR,
                format!(
                    "MAX_CONCURRENT_CALLS {} is above {MAX_WINDOW}",
                    self.max_concurrent_calls
                ),
            ));
        }
        if self.initial_call_window > MAX_WINDOW {
            return Err(ProtocolError::new(
                ErrorCode::SETTINGS_ERROR,
                format!(
                    "INITIAL_CALL_WINDOW {} is above {MAX_WINDOW}",
                    self.initial_call_window
                ),
            ));
        }
        if self.max_metadata_size < MIN_MAX_METADATA_SIZE {
            return Err(ProtocolError::new(
                ErrorCode::SETTINGS_ERROR,
                format!(
                    "MAX_METADATA_SIZE {} is below {MIN_MAX_METADATA_SIZE}: the smallest END (no message, no trailers) would not fit",
                    self.max_metadata_size
                ),
            ));
        }
        Ok(())
    }

    /// Writes all five settings as SETTINGS entries (30 bytes), in id order.
    pub fn encode_payload(&self, dst: &mut impl BufMut) {
        for (id, v) in [
            (SETTING_MAX_FRAME_SIZE, self.max_frame_size),
            (SETTING_MAX_CONCURRENT_CALLS, self.max_concurrent_calls),
            (SETTING_INITIAL_CALL_WINDOW, self.initial_call_window),
            (SETTING_MAX_MESSAGE_SIZE, self.max_message_size),
            (SETTING_MAX_METADATA_SIZE, self.max_metadata_size),
        ] {
            dst.put_u16_le(id);
            dst.put_u32_le(v);
        }
    }

    /// Parses a SETTINGS payload over the defaults: unknown ids are ignored, the last of a
    /// repeated id wins, and the result is validated.
    pub fn decode_payload(payload: &[u8]) -> Result<Settings, ProtocolError> {
        if payload.len() % 6 != 0 {
            return Err(ProtocolError::malformed(format!(
                "SETTINGS payload of {} bytes is not a multiple of 6",
                payload.len()
            )));
        }
        let mut s = Settings::default();
        for entry in payload.chunks_exact(6) {
            let id = u16::from_le_bytes([entry[0], entry[1]]);
            let v = u32::from_le_bytes([entry[2], entry[3], entry[4], entry[5]]);
            match id {
                SETTING_MAX_FRAME_SIZE => s.max_frame_size = v,
                SETTING_MAX_CONCURRENT_CALLS => s.max_concurrent_calls = v,
                SETTING_INITIAL_CALL_WINDOW => s.initial_call_window = v,
                SETTING_MAX_MESSAGE_SIZE => s.max_message_size = v,
                SETTING_MAX_METADATA_SIZE => s.max_metadata_size = v,
                _ => {} // unknown settings are ignored (protocol.md §12)
            }
        }
        s.validate()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip() {
        let mut b = Vec::new();
        Settings::default().encode_payload(&mut b);
        assert_eq!(b.len(), Settings::PAYLOAD_LEN);
        assert_eq!(Settings::decode_payload(&b).unwrap(), Settings::default());
        assert_eq!(Settings::decode_payload(&[]).unwrap(), Settings::default());
    }

    #[test]
    fn unknown_ignored_last_wins() {
        let mut b = Vec::new();
        for (id, v) in [(99u16, 7u32), (4, 10), (4, 20)] {
            b.put_u16_le(id);
            b.put_u32_le(v);
        }
        let s = Settings::decode_payload(&b).unwrap();
        assert_eq!(s.max_message_size, 20);
    }

    #[test]
    fn out_of_range() {
        let mut b = Vec::new();
        b.put_u16_le(SETTING_MAX_FRAME_SIZE);
        b.put_u32_le(100);
        let e = Settings::decode_payload(&b).unwrap_err();
        assert_eq!(e.code, ErrorCode::SETTINGS_ERROR);
        assert_eq!(
            Settings::decode_payload(&[1, 0, 0]).unwrap_err().code,
            ErrorCode::MALFORMED_FRAME
        );
    }
}
