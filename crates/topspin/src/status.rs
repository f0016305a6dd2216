//! [`Status`]: how a call fails (or ends), with gRPC's codes.

use bytes::Bytes;
use std::fmt;
pub use topspin_proto::Code;
use topspin_proto::Metadata;

/// Trailer key that carries a status's binary details.
pub const DETAILS_KEY: &str = "topspin-status-details-bin";

/// A call's outcome when it is not a plain success: a [`Code`], a message for people, optional
/// binary details (for example an encoded `google.rpc.Status`) and trailing metadata.
///
/// ```
/// use topspin::{Code, Status};
/// let s = Status::not_found("no key 'apple'");
/// assert_eq!(s.code(), Code::NotFound);
/// assert_eq!(s.to_string(), "NOT_FOUND: no key 'apple'");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Status {
    code: Code,
    message: String,
    details: Bytes,
    metadata: Metadata,
}

macro_rules! ctor {
    ($($name:ident => $code:ident),* $(,)?) => {$(
        #[doc = concat!("A `", stringify!($code), "` status.")]
        pub fn $name(message: impl Into<String>) -> Status {
            Status::new(Code::$code, message)
        }
    )*};
}

impl Status {
    /// A status with a code and a message.
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status {
            code,
            message: message.into(),
            details: Bytes::new(),
            metadata: Metadata::new(),
        }
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
        self.details = details.into();
        self
    }

    /// Adds trailing metadata.
    pub fn with_metadata(mut self, metadata: Metadata) -> Status {
        self.metadata = metadata;
        self
    }

    /// The code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Binary details (empty if none).
    pub fn details(&self) -> &Bytes {
        &self.details
    }

    /// Trailing metadata that came with the status.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Builds a status from a received END (details come from their trailer).
    pub(crate) fn from_wire(s: topspin_proto::Status, trailers: Metadata) -> Status {
        let details = trailers
            .get(DETAILS_KEY)
            .map(Bytes::copy_from_slice)
            .unwrap_or_default();
        Status {
            code: s.code(),
            message: s.message().to_owned(),
            details,
            metadata: trailers,
        }
    }

    /// Trailers to send: the metadata plus the details entry.
    pub(crate) fn wire_trailers(&self) -> Metadata {
        if self.details.is_empty() {
            return self.metadata.clone();
        }
        let mut b = Metadata::builder();
        for (k, v) in self.metadata.iter() {
            if k != DETAILS_KEY {
                // Entries of a valid Metadata are valid; should one not be, keep the trailers
                // whole and drop the details rather than lose entries.
                match b.entry(k, v) {
                    Ok(next) => b = next,
                    Err(_) => return self.metadata.clone(),
                }
            }
        }
        match b.binary(DETAILS_KEY, &self.details) {
            Ok(b) => b.build(),
            Err(_) => self.metadata.clone(), // details over 64 KiB: sent without them
        }
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Status");
        d.field("code", &self.code).field("message", &self.message);
        if !self.details.is_empty() {
            d.field("details", &self.details);
        }
        if !self.metadata.is_empty() {
            d.field("metadata", &self.metadata);
        }
        d.finish()
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.code)
        } else {
            write!(f, "{}: {}", self.code, self.message)
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
        let back = Status::from_wire(topspin_proto::Status::new(Code::Aborted, "conflict"), t);
        assert_eq!(back.details(), &Bytes::from_static(&[1, 2, 3]));
        assert_eq!(back.metadata().get_str("retry-after"), Some("3"));
    }
}
