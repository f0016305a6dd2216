//! Observability: a [`tracing`] span per call on both sides, W3C trace-context propagation
//! (feature `otel`) and per-method metrics (feature `metrics`, `Metrics`).
//!
//! **Spans.** Every call gets a span named `topspin.call` at level `DEBUG` (so a service
//! logging at `INFO` pays nothing; enable them with a filter such as `topspin::call=debug`),
//! target `topspin::call`, with the fields `side`, `method`, `peer`, `call_id` and, when the call
//! ends, `code` and `duration_us` (OpenTelemetry: `otel.name` is the method, `otel.kind`
//! client or server, `otel.status_code` `ERROR` for a failed call). The span is created only
//! when a subscriber is interested (`tracing::span_enabled!`), so without one a call pays a
//! cached callsite check and nothing else. On the server the handler runs inside the span;
//! on the client the span's parent is the caller's current span.
//!
//! **Trace context** (feature `otel`, with `tracing-opentelemetry`'s layer installed): the
//! client writes its span's context into the request metadata as W3C `traceparent` and
//! `tracestate`; the server reads them and makes them its span's parent, so both sides of a
//! call are in one trace.
//!
//! **Metrics** (feature `metrics`): `Metrics` is an interceptor that records through the
//! `metrics` facade; register it like any other (see its documentation).

#[cfg(feature = "metrics")]
mod metrics;
#[cfg(feature = "otel")]
pub(crate) mod otel;

#[cfg(feature = "metrics")]
pub use self::metrics::Metrics;

use crate::Code;
use std::fmt::Display;
use std::time::Duration;
use tracing::field::Empty;
use tracing::Span;

/// Which side of a call an interceptor runs on, or a span or metric describes
/// ([`crate::interceptor::Side`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The caller ([`Channel`](crate::Channel)).
    Client,
    /// The [`Server`](crate::Server).
    Server,
}

impl Side {
    /// `"client"` or `"server"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Server => "server",
        }
    }
}

/// A call's span, if a subscriber wants it.
/// Whether a subscriber wants call spans (one cached callsite check).
#[inline]
pub(crate) fn spans_wanted() -> bool {
    tracing::span_enabled!(target: "topspin::call", tracing::Level::DEBUG)
}

#[inline]
pub(crate) fn call_span(side: Side, method: &str, peer: &dyn Display, id: u64) -> Option<Span> {
    if !tracing::span_enabled!(target: "topspin::call", tracing::Level::DEBUG) {
        return None;
    }
    let span = tracing::debug_span!(
        target: "topspin::call",
        "topspin.call",
        otel.name = method,
        otel.kind = side.as_str(),
        otel.status_code = Empty,
        side = side.as_str(),
        method = method,
        peer = %peer,
        call_id = id,
        code = Empty,
        duration_us = Empty,
    );
    (!span.is_disabled()).then_some(span)
}

/// Records how a call ended on its span.
pub(crate) fn record_end(span: &Span, code: Code, duration: Duration) {
    span.record("code", code.name());
    span.record(
        "duration_us",
        u64::try_from(duration.as_micros()).unwrap_or(u64::MAX),
    );
    if code != Code::Ok {
        span.record("otel.status_code", "ERROR");
    }
}

/// Whether a subscriber wants call spans (a cached callsite check).
pub(crate) fn span_wanted() -> bool {
    tracing::span_enabled!(target: "topspin::call", tracing::Level::DEBUG)
}
