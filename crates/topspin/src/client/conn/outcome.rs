//! One client call's outcome, the same for both modes — the native `ClientRole` (`conn.rs`) and
//! the gRPC client mode's `GrpcCall` (`grpc/call.rs`): the delivery rules of what the server
//! answers (response headers, messages — a unary-response call takes exactly one —, the end
//! with its status and trailers), how a call that never reached the server's application is
//! marked for transparent retry, and the words of the errors those rules give. The modes only
//! translate their transport's events into these calls.

use super::handle::Sink;
use crate::streaming::Item;
use crate::{Response, Status};
use bytes::Bytes;
use topspin_proto::{Code, Metadata};

/// Where one call's answer goes, and what of it is kept until its end.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// `None` once the call's result went out.
    sink: Option<Sink>,
    /// Response headers (a unary-response call keeps them for its `Response` or error).
    headers: Metadata,
    /// The one response message of a unary-response call.
    message: Option<Bytes>,
}

/// The call broke a delivery rule (a unary-response call got a second message): its caller
/// has been told, and the transport ends the call (native: CANCEL; gRPC: RST_STREAM(CANCEL)).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Broken;

impl Outcome {
    pub(crate) fn new(sink: Sink) -> Outcome {
        Outcome {
            sink: Some(sink),
            headers: Metadata::new(),
            message: None,
        }
    }

    /// Whether the call's result went out already.
    pub(crate) fn is_over(&self) -> bool {
        self.sink.is_none()
    }

    /// The response headers: a response stream hands them on at once; a unary-response call
    /// keeps them for its `Response` (or its error, [`Status::headers`]).
    #[inline]
    pub(crate) fn on_headers(&mut self, headers: Metadata) {
        match &mut self.sink {
            Some(Sink::Stream { headers: tx, .. }) => {
                if let Some(h) = tx.take() {
                    let _ = h.send(Ok(headers));
                }
            }
            _ => self.headers = headers,
        }
    }

    /// One response message, holding `credit` bytes of the call's receive window; `compressed`:
    /// it arrived compressed and was decompressed already (gRPC; a native message keeps its
    /// flag byte, which the response stream reads). `Ok`: the
    /// credit the stream's consumer now holds (it gives it back as it takes the message; a
    /// unary-response call's one message holds none: the call ends with it). A second message
    /// of a unary-response call fails the call INTERNAL ([`Broken`]).
    #[inline]
    pub(crate) fn on_message(
        &mut self,
        message: Bytes,
        credit: u32,
        compressed: bool,
        method: &str,
    ) -> Result<u32, Broken> {
        match &mut self.sink {
            Some(Sink::Stream { headers, items }) => {
                // A message before any HEADERS: the response headers are empty (§5.4).
                if let Some(h) = headers.take() {
                    let _ = h.send(Ok(Metadata::new()));
                }
                let _ = items.send(Item::Message(message, credit, compressed));
                Ok(credit)
            }
            Some(Sink::Unary(_)) if self.message.is_none() => {
                self.message = Some(message);
                Ok(0)
            }
            Some(Sink::Unary(_)) => {
                self.fail(Status::internal(format!(
                    "the server sent more than one response message for {method}, which expects one"
                )));
                Err(Broken)
            }
            None => Ok(0),
        }
    }

    /// The server ended the call with `status` and `trailers`. OK: a unary-response call gets
    /// its one message with the response headers and trailers — INTERNAL if the server sent
    /// none — and a response stream its end with the trailers. An error: the trailers become
    /// the status's metadata and details ([`Status::from_wire`]; a gRPC status read from its
    /// trailers has them already, and comes with none here), and a unary-response call's
    /// status keeps the response headers that came before it (a response stream handed them
    /// on already).
    #[inline]
    pub(crate) fn on_end(&mut self, status: Status, trailers: Metadata, method: &str) {
        let Some(sink) = self.sink.take() else {
            return;
        };
        let headers = std::mem::take(&mut self.headers);
        if !status.is_ok() {
            let status = Status::from_wire(status, trailers);
            let status = match sink {
                Sink::Unary(_) if !headers.is_empty() => status.with_headers(headers),
                _ => status,
            };
            return sink.fail(status);
        }
        match sink {
            Sink::Unary(tx) => {
                let r = match self.message.take() {
                    Some(m) => Ok(Response::from_parts(m, headers, trailers)),
                    None => Err(Status::internal(format!(
                        "the server ended {method} with OK but sent no response message"
                    ))),
                };
                let _ = tx.send(r);
            }
            Sink::Stream { headers, items } => {
                if let Some(h) = headers {
                    let _ = h.send(Ok(Metadata::new()));
                }
                let _ = items.send(Item::End(Ok(trailers)));
            }
        }
    }

    /// The server says it did not process the call (native: above the last_call_id of its
    /// GOAWAY, protocol.md §8.3; gRPC: RST_STREAM(REFUSED_STREAM), or above the last stream id
    /// of a graceful GOAWAY): the call fails with `status` marked unprocessed
    /// ([`Status::with_unprocessed`]: safe to send again even when it is not idempotent, a
    /// transparent retry), without response headers.
    pub(crate) fn unprocessed(&mut self, status: Status) {
        self.fail(status.with_unprocessed());
    }

    /// The call ends on this side with `status` (a local error, the connection lost, …).
    pub(crate) fn fail(&mut self, status: Status) {
        if let Some(sink) = self.sink.take() {
            sink.fail(status);
        }
    }
}

/// The status of a call refused before anything of it was written: an UNAVAILABLE one (the
/// connection closed or going away) never reached the server, so it is marked unprocessed
/// (safe to send again); any other is the call's own fault and stays as it is.
pub(crate) fn refused_unsent(status: Status) -> Status {
    if status.code() == Code::Unavailable {
        status.with_unprocessed()
    } else {
        status
    }
}

/// A call that could not be sent because of `why` (the connection closed or is going away,
/// the server takes no calls): UNAVAILABLE, marked unprocessed (safe to send again).
pub(crate) fn not_sent(why: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("{why}; the call was not sent and is safe to retry"))
        .with_unprocessed()
}

/// A call whose deadline passed before it was sent (protocol.md §8.1: never sent expired).
pub(crate) fn expired_before_sent(method: &str) -> Status {
    Status::deadline_exceeded(format!(
        "the deadline of {method} passed before it was sent"
    ))
}

/// A call whose deadline passed while it waited (`what`: for what) to be sent.
pub(crate) fn expired_while_waiting(method: &str, what: &str) -> Status {
    Status::deadline_exceeded(format!("deadline exceeded while {method} waited {what}"))
}

/// What a request message (or its pump) is told once its call is over.
pub(crate) use crate::status::call_over;

#[cfg(test)]
mod tests;
