//! [`Status`]: how a call fails (or ends), with gRPC's codes — one type shared with the protocol
//! engine (`topspin_proto::Status`), so a status crosses from the wire to the application
//! without being copied.
//!
//! ```
//! use topspin::{Code, Status};
//! let s = Status::not_found("no key 'apple'");
//! assert_eq!(s.code(), Code::NotFound);
//! assert_eq!(s.to_string(), "NOT_FOUND: no key 'apple'");
//! ```

pub use topspin_proto::{Code, Status, DETAILS_KEY};

/// What a message still waiting to be sent — and whoever waits for it to go — is told once its
/// call is over: the same words on the client and the server, on every face.
pub(crate) fn call_over() -> Status {
    Status::cancelled("the call is over")
}
