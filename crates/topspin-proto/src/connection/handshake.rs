//! The preface and SETTINGS exchange (protocol.md §2, §4): the first 8 bytes, then the peer's
//! SETTINGS as its first frame.

use super::{Connection, Event, Handshake};
use crate::error::{ErrorCode, ProtocolError};
use crate::frame::Frame;
use crate::preface::{self, PREFACE_LEN};
use bytes::{Buf, BytesMut};

impl Connection {
    /// Consumes the peer's preface once it is all there; whether frames may follow.
    pub(super) fn on_preface(&mut self, src: &mut BytesMut) -> Result<bool, ProtocolError> {
        if self.handshake != Handshake::AwaitPreface {
            return Ok(true);
        }
        let Some(p) = src.first_chunk::<PREFACE_LEN>() else {
            return Ok(false);
        };
        if let Err(e) = preface::check(p) {
            return Err(self.fail(e, true));
        }
        src.advance(PREFACE_LEN);
        self.handshake = Handshake::AwaitSettings;
        Ok(true)
    }

    /// The first frame after the preface, which must be SETTINGS.
    pub(super) fn on_first_frame(&mut self, frame: Frame) -> Result<(), ProtocolError> {
        if let Frame::Error { code, reason } = frame {
            // The peer explains why it closes (for example our preface was bad): report its
            // code rather than SETTINGS_ERROR (protocol.md §2).
            let e = ProtocolError::new(
                code,
                format!("the peer closed the connection with {code}: {}", &*reason),
            );
            return Err(self.fail(e, false));
        }
        let Frame::Settings(s) = frame else {
            let e = ProtocolError::new(
                ErrorCode::SETTINGS_ERROR,
                format!(
                    "the first frame after the preface must be SETTINGS, got {}",
                    frame.frame_type().name()
                ),
            );
            return Err(self.fail(e, true));
        };
        self.peer = s;
        self.handshake = Handshake::Established;
        self.events.push_back(Event::Established);
        Ok(())
    }
}
