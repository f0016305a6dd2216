//! W3C trace context (`traceparent`, `tracestate`) in request metadata, through
//! OpenTelemetry's propagator and `tracing-opentelemetry`'s span extension.

use crate::Metadata;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Collects what the propagator writes.
struct Pairs(Vec<(String, String)>);

impl Injector for Pairs {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_ascii_lowercase(), value));
    }
}

/// Reads from received metadata.
struct Reader<'a>(&'a Metadata);

impl Extractor for Reader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get_str(&key.to_ascii_lowercase())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k).collect()
    }
}

/// Client: writes `span`'s trace context into the request metadata (replacing any there).
pub(crate) fn inject(span: &Span, metadata: &mut Metadata) {
    let mut pairs = Pairs(Vec::new());
    TraceContextPropagator::new().inject_context(&span.context(), &mut pairs);
    if pairs.0.is_empty() {
        return; // no valid span context (no OpenTelemetry layer)
    }
    let mut b = Metadata::builder();
    for (k, v) in metadata.iter() {
        if pairs.0.iter().any(|(p, _)| p == k) {
            continue;
        }
        match b.entry(k, v) {
            Ok(next) => b = next,
            Err(_) => return, // cannot happen: the entries were valid
        }
    }
    for (k, v) in &pairs.0 {
        match b.text(k, v) {
            Ok(next) => b = next,
            Err(_) => return,
        }
    }
    *metadata = b.build();
}

/// Server: makes the trace context the client sent, if any, the parent of `span`.
pub(crate) fn extract(span: &Span, metadata: &Metadata) {
    if metadata.get("traceparent").is_none() {
        return;
    }
    let cx = TraceContextPropagator::new().extract(&Reader(metadata));
    // Fails only without the OpenTelemetry layer: then there is no trace to join.
    let _ = span.set_parent(cx);
}
