//! What a [`Connection`](super::Connection) tells its owner, and why a command can fail.

use crate::error::{ErrorCode, ProtocolError};
use crate::frame::CallId;
use crate::metadata::Metadata;
use crate::status::Status;
use bytes::Bytes;
use bytestring::ByteString;
use std::time::Instant;

/// Something that happened on the connection, in the order it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The peer's SETTINGS arrived: calls may start.
    Established,
    /// Server: a client started a call.
    CallStarted {
        /// The call.
        id: CallId,
        /// Full method name, e.g. `/echo.Echo/Say`.
        method: ByteString,
        /// The id the client interned the method under on this connection (1 ..= 1023), or 0:
        /// the same id names the same method for the connection's lifetime, so an owner can
        /// cache its lookup by id instead of hashing the name on every call.
        method_id: u16,
        /// Payload codec of the call's messages.
        codec: u8,
        /// When the call's deadline passes, if it has one.
        deadline: Option<Instant>,
        /// Request headers.
        metadata: Metadata,
    },
    /// Client: the server's response headers.
    Headers {
        /// The call.
        id: CallId,
        /// The headers.
        metadata: Metadata,
    },
    /// A whole message arrived.
    Message {
        /// The call.
        id: CallId,
        /// The message, sharing the receive buffer's memory when it came in one frame.
        message: Bytes,
        /// Flow-control credit the message holds; give it back with
        /// [`Connection::grant_credit`](super::Connection::grant_credit) once the application
        /// has consumed the message, so the peer may send more.
        credit: u32,
    },
    /// Server: the client sends no more messages on this call.
    HalfClosed {
        /// The call.
        id: CallId,
    },
    /// Client: the call is over, with the server's status, or a local one (deadline, limit,
    /// go-away, connection closed).
    Ended {
        /// The call.
        id: CallId,
        /// Its status.
        status: Status,
        /// Trailing metadata (empty for local endings).
        trailers: Metadata,
    },
    /// Server: the call is over without the handler's END: the client cancelled, its deadline
    /// passed, a limit was exceeded, or the connection closed. The handler should stop.
    Cancelled {
        /// The call.
        id: CallId,
        /// Why.
        status: Status,
    },
    /// A message that was refused with [`CallError::WouldBlock`] can now be sent.
    Writable {
        /// The call.
        id: CallId,
    },
    /// The answer to a [`Connection::ping`](super::Connection::ping).
    Pong {
        /// The data sent with the ping.
        data: [u8; 8],
    },
    /// The peer is going away: no new calls; calls up to `last_call_id` go on.
    GoAway {
        /// Highest call id the peer processes.
        last_call_id: CallId,
        /// `NO_ERROR` or why.
        code: ErrorCode,
        /// Text for people.
        reason: ByteString,
    },
    /// The connection is closed; nothing more will happen on it.
    Closed {
        /// The protocol error that closed it, if any.
        error: Option<ProtocolError>,
    },
}

/// Why a command was refused. The connection itself is unaffected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The handshake has not completed: wait for [`Event::Established`].
    #[error("the connection handshake has not completed yet")]
    NotReady,
    /// The connection is closed.
    #[error("the connection is closed")]
    Closed,
    /// A go-away was sent or received: start calls on a new connection.
    #[error("the connection is going away; start new calls on another connection")]
    GoingAway,
    /// The peer's `MAX_CONCURRENT_CALLS` is reached: wait for a call to end.
    #[error("the peer allows at most {limit} concurrent calls on this connection")]
    TooManyCalls {
        /// The peer's limit.
        limit: u32,
    },
    /// Every call id of this connection was used: open a new one.
    #[error("call ids on this connection are exhausted; open a new connection")]
    IdsExhausted,
    /// The call is not open (it ended, or never existed).
    #[error("{0} is not open")]
    NotOpen(CallId),
    /// No send credit, or the previous message is still being sent: wait for
    /// [`Event::Writable`].
    #[error("flow control: wait for the peer to grant credit")]
    WouldBlock,
    /// The message is larger than the peer accepts.
    #[error("message of {size} bytes exceeds the peer's max_message_size of {limit} bytes")]
    MessageTooLarge {
        /// The message's size.
        size: usize,
        /// The peer's limit.
        limit: u32,
    },
    /// The metadata (or status message and trailers) is larger than the peer accepts.
    #[error("metadata of {size} bytes exceeds the peer's max_metadata_size of {limit} bytes")]
    MetadataTooLarge {
        /// The encoded size.
        size: usize,
        /// The peer's limit.
        limit: u32,
    },
    /// The call's deadline has already passed: a CALL is never sent with an expired deadline
    /// (`timeout_us` 0 means "none"; protocol.md §5.2).
    #[error("the call's deadline has already passed; it was not sent")]
    DeadlineExceeded,
    /// The method name is empty or longer than 1024 bytes.
    #[error("invalid method name {0:?}: must be 1..=1024 bytes")]
    InvalidMethod(String),
    /// The command does not fit this side or this call's state.
    #[error("not allowed: {0}")]
    NotAllowed(&'static str),
}
