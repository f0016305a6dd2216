//! The sans-IO protocol engine of topspin: the frame codec and the connection state machine.
//!
//! Nothing here touches a socket, spawns a task or reads a clock: bytes go in, events and bytes
//! come out, and time is passed in by the caller. That keeps the protocol deterministic and
//! testable without I/O; the `topspin` crate is the async shell around it. The wire format is
//! specified in `docs/protocol.md`.
//!
//! - [`frame`]: the frame types, encoded into a caller's buffer and decoded by reference.
//! - [`Connection`]: one side of a connection, fed with received bytes and commands, yielding
//!   [`Event`]s and bytes to transmit.
//! - [`Metadata`], [`Settings`], [`Status`] and [`Code`], [`ProtocolError`] and [`ErrorCode`].
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, clippy::too_many_lines)]

mod budget;
pub mod connection;
mod error;
pub mod frame;
mod limits;
mod metadata;
pub mod preface;
pub mod settings;
mod status;

pub use budget::{MemoryBudget, DEFAULT_MEMORY_BUDGET};
pub use connection::{CallError, Connection, Event, Payload, Side, SHARE_OF_BUDGET};
pub use error::{ErrorCode, ProtocolError};
pub use frame::CallId;
pub use limits::{Limits, Rate};
pub use metadata::{is_binary_key, is_valid_key, InvalidMetadata, Metadata, MetadataBuilder};
pub use settings::{Settings, MAX_WINDOW, MIN_MAX_FRAME_SIZE, MIN_MAX_METADATA_SIZE};
pub use status::{Code, Status, DETAILS_KEY};
