//! Call status: the 17 gRPC status codes and [`Status`] (code, message, details, trailers).

use crate::metadata::Metadata;
use bytes::Bytes;
use bytestring::ByteString;
use std::fmt;

/// A call's status code, with gRPC's numbers and meanings (protocol.md §11).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum Code {
    /// Success.
    Ok = 0,
    /// The call was cancelled, typically by the caller.
    Cancelled = 1,
    /// Unknown error, or a code this implementation does not know.
    Unknown = 2,
    /// The client specified an invalid argument.
    InvalidArgument = 3,
    /// The deadline passed before the call completed.
    DeadlineExceeded = 4,
    /// Some requested entity was not found.
    NotFound = 5,
    /// The entity the client tried to create already exists.
    AlreadyExists = 6,
    /// The caller may not execute the operation.
    PermissionDenied = 7,
    /// A resource or limit is exhausted (message size, concurrency …).
    ResourceExhausted = 8,
    /// The system is not in a state required for the operation.
    FailedPrecondition = 9,
    /// The operation was aborted.
    Aborted = 10,
    /// Operation attempted past the valid range.
    OutOfRange = 11,
    /// The method (or codec) is not implemented by the server.
    Unimplemented = 12,
    /// An invariant of the system is broken.
    Internal = 13,
    /// The service is unavailable; a retry may succeed.
    Unavailable = 14,
    /// Unrecoverable data loss or corruption.
    DataLoss = 15,
    /// The request lacks valid authentication credentials.
    Unauthenticated = 16,
}

impl Code {
    /// Every code, in numeric order.
    pub const ALL: [Code; 17] = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// The code for a wire value; values above 16 map to [`Code::Unknown`].
    ///
    /// ```
    /// use topspin_proto::Code;
    /// assert_eq!(Code::from_u16(4), Code::DeadlineExceeded);
    /// assert_eq!(Code::from_u16(99), Code::Unknown);
    /// ```
    pub fn from_u16(v: u16) -> Code {
        Code::ALL
            .get(usize::from(v))
            .copied()
            .unwrap_or(Code::Unknown)
    }

    /// The wire value.
    pub fn as_u16(self) -> u16 {
        self as u16
    }

    /// The upper-case name used by gRPC and in the protocol documents, e.g. `DEADLINE_EXCEEDED`.
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Cancelled => "CANCELLED",
            Code::Unknown => "UNKNOWN",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Aborted => "ABORTED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::DataLoss => "DATA_LOSS",
            Code::Unauthenticated => "UNAUTHENTICATED",
        }
    }

    /// The code with this upper-case name, if any.
    pub fn from_name(name: &str) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| c.name() == name)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Trailer key that carries a status's binary details (for example an encoded
/// `google.rpc.Status`).
pub const DETAILS_KEY: &str = "topspin-status-details-bin";

/// How a call ends: a [`Code`], a message for people, optional binary details and trailing
/// metadata. One type for the engine, the runtime and the applications: a received status's
/// message is a slice of the receive buffer, never copied.
///
/// ```
/// use topspin_proto::{Code, Status};
/// let s = Status::not_found("no such key: 'apple'");
/// assert_eq!(s.code(), Code::NotFound);
/// assert_eq!(s.to_string(), "NOT_FOUND: no such key: 'apple'");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Status {
    code: Code,
    /// The call never reached the server's application (see [`Status::is_unprocessed`]).
    /// Local knowledge: never sent on the wire.
    unprocessed: bool,
    message: ByteString,
    /// Details, trailers and headers, out of line: most statuses have none, and a small status
    /// is cheap to move through the engine's event queue.
    extra: Option<Box<Extra>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Extra {
    details: Bytes,
    metadata: Metadata,
    headers: Metadata,
}

static NO_DETAILS: Bytes = Bytes::new();
static NO_METADATA: Metadata = Metadata::new();

macro_rules! ctor {
    ($($name:ident => $code:ident),* $(,)?) => {$(
        #[doc = concat!("A `", stringify!($code), "` status.")]
        pub fn $name(message: impl Into<ByteString>) -> Status {
            Status::new(Code::$code, message)
        }
    )*};
}

impl Status {
    /// A status with a code and a message.
    pub fn new(code: Code, message: impl Into<ByteString>) -> Status {
        Status {
            code,
            unprocessed: false,
            message: message.into(),
            extra: None,
        }
    }

    /// `OK` with an empty message (allocates nothing).
    pub fn ok() -> Status {
        Status::new(Code::Ok, ByteString::new())
    }

    ctor! {
        cancelled => Cancelled, unknown => Unknown, invalid_argument => InvalidArgument,
        deadline_exceeded => DeadlineExceeded, not_found => NotFound,
        already_exists => AlreadyExists, permission_denied => PermissionDenied,
        resource_exhausted => ResourceExhausted, failed_precondition => FailedPrecondition,
        aborted => Aborted, out_of_range => OutOfRange, unimplemented => Unimplemented,
        internal => Internal, unavailable => Unavailable, data_loss => DataLoss,
        unauthenticated => Unauthenticated,
    }

    /// Adds binary details.
    pub fn with_details(mut self, details: impl Into<Bytes>) -> Status {
        self.extra.get_or_insert_default().details = details.into();
        self
    }

    /// Adds trailing metadata.
    pub fn with_metadata(mut self, metadata: Metadata) -> Status {
        self.extra.get_or_insert_default().metadata = metadata;
        self
    }

    /// Adds response headers (initial metadata) that go out before this status.
    ///
    /// A server handler that fails a call returns them with its error: if the call has sent no
    /// headers yet, they go out first (a HEADERS frame, then the END or the gRPC trailers,
    /// instead of a trailers-only answer), as grpc-go's `SetHeader` before an error does. A
    /// client sees them on the failed call's status ([`Status::headers`]). Headers a call has
    /// already sent (a response stream's) are not sent again.
    ///
    /// ```
    /// use topspin_proto::{Metadata, Status};
    /// let headers = Metadata::builder().text("retry-region", "eu").unwrap().build();
    /// let s = Status::unavailable("draining").with_headers(headers);
    /// assert_eq!(s.headers().get_str("retry-region"), Some("eu"));
    /// assert!(s.metadata().is_empty());
    /// ```
    pub fn with_headers(mut self, headers: Metadata) -> Status {
        self.extra.get_or_insert_default().headers = headers;
        self
    }

    /// Marks the status of a call that never reached the server's application: it was not
    /// written to a connection (the connection was closed or going away, no endpoint was
    /// available), or the server's GOAWAY says it did not process it. Such a call is safe to
    /// send again, even when it is not idempotent (a "transparent retry").
    pub fn with_unprocessed(mut self) -> Status {
        self.unprocessed = true;
        self
    }

    /// Whether the call certainly never reached the server's application, so sending it again
    /// cannot run it twice (see [`Status::with_unprocessed`]). `false` means "unknown or
    /// processed", never "not processed". Set only by the side that knows; a status received
    /// from a peer never has it.
    ///
    /// ```
    /// use topspin_proto::Status;
    /// assert!(!Status::unavailable("connection reset").is_unprocessed());
    /// assert!(Status::unavailable("not sent").with_unprocessed().is_unprocessed());
    /// ```
    pub fn is_unprocessed(&self) -> bool {
        self.unprocessed
    }

    /// The code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The message as shared bytes (no copy).
    pub fn message_bytes(&self) -> &ByteString {
        &self.message
    }

    /// Binary details (empty if none).
    pub fn details(&self) -> &Bytes {
        self.extra.as_ref().map_or(&NO_DETAILS, |e| &e.details)
    }

    /// Trailing metadata that came with the status.
    pub fn metadata(&self) -> &Metadata {
        self.extra.as_ref().map_or(&NO_METADATA, |e| &e.metadata)
    }

    /// Response headers that go (server) or came (client) before the status: see
    /// [`Status::with_headers`]. Empty if none.
    pub fn headers(&self) -> &Metadata {
        self.extra.as_ref().map_or(&NO_METADATA, |e| &e.headers)
    }

    /// Whether the code is `OK`.
    pub fn is_ok(&self) -> bool {
        self.code == Code::Ok
    }

    /// A status as received in an END: the trailers become its metadata and the details come
    /// from their [`DETAILS_KEY`] entry.
    ///
    /// ```
    /// use topspin_proto::{Code, Metadata, Status, DETAILS_KEY};
    /// let sent = Status::aborted("conflict").with_details(vec![1, 2, 3]);
    /// let back = Status::from_wire(Status::new(Code::Aborted, "conflict"), sent.wire_trailers());
    /// assert_eq!(back.details().as_ref(), &[1, 2, 3]);
    /// ```
    pub fn from_wire(status: Status, trailers: Metadata) -> Status {
        if trailers.is_empty() {
            return status;
        }
        let details = trailers
            .get(DETAILS_KEY)
            .map(Bytes::copy_from_slice)
            .unwrap_or_default();
        let headers = status.headers().clone();
        Status {
            extra: Some(Box::new(Extra {
                details,
                metadata: trailers,
                headers,
            })),
            ..status
        }
    }

    /// The trailers to send with this status: its metadata plus the details entry (details
    /// over 64 KiB, which a metadata value cannot hold, are left out).
    pub fn wire_trailers(&self) -> Metadata {
        let (details, metadata) = (self.details(), self.metadata());
        if details.is_empty() {
            return metadata.clone();
        }
        let mut b = Metadata::builder();
        for (k, v) in metadata.iter() {
            if k != DETAILS_KEY {
                // Entries of a valid Metadata are valid; should one not be, keep the trailers
                // whole and drop the details rather than lose entries.
                match b.entry(k, v) {
                    Ok(next) => b = next,
                    Err(_) => return metadata.clone(),
                }
            }
        }
        match b.binary(DETAILS_KEY, details) {
            Ok(b) => b.build(),
            Err(_) => metadata.clone(),
        }
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Status");
        d.field("code", &self.code)
            .field("message", &&*self.message);
        if self.unprocessed {
            d.field("unprocessed", &true);
        }
        if !self.details().is_empty() {
            d.field("details", self.details());
        }
        if !self.metadata().is_empty() {
            d.field("metadata", self.metadata());
        }
        if !self.headers().is_empty() {
            d.field("headers", self.headers());
        }
        d.finish()
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.code)
        } else {
            write!(f, "{}: {}", self.code, &*self.message)
        }
    }
}

impl std::error::Error for Status {}

impl From<std::io::Error> for Status {
    fn from(e: std::io::Error) -> Status {
        Status::unavailable(format!("I/O error: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_by_value_and_name() {
        for (i, c) in Code::ALL.iter().enumerate() {
            assert_eq!(c.as_u16() as usize, i);
            assert_eq!(Code::from_u16(c.as_u16()), *c);
            assert_eq!(Code::from_name(c.name()), Some(*c));
        }
        assert_eq!(Code::from_u16(17), Code::Unknown);
        assert_eq!(Code::from_u16(u16::MAX), Code::Unknown);
        assert_eq!(Code::from_name("NOPE"), None);
    }

    #[test]
    fn details_travel_in_trailers() {
        let md = Metadata::builder()
            .text("retry-after", "3")
            .unwrap()
            .build();
        let s = Status::aborted("conflict")
            .with_details(Bytes::from_static(&[1, 2, 3]))
            .with_metadata(md);
        let t = s.wire_trailers();
        assert_eq!(t.get(DETAILS_KEY), Some(&[1u8, 2, 3][..]));
        let back = Status::from_wire(Status::new(Code::Aborted, "conflict"), t);
        assert_eq!(back.details(), &Bytes::from_static(&[1, 2, 3]));
        assert_eq!(back.metadata().get_str("retry-after"), Some("3"));
    }

    #[test]
    fn display() {
        assert_eq!(Status::ok().to_string(), "OK");
        assert_eq!(
            Status::new(Code::Internal, "boom").to_string(),
            "INTERNAL: boom"
        );
    }
}
