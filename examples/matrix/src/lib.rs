//! The Rust server and client of the cross-language matrix: `testdata/matrix/README.md` is
//! their contract, `testdata/matrix/matrix.proto` their service.
#![forbid(unsafe_code)]

/// The `matrix.v1` package: messages, the `Matrix` trait, `MatrixServer` and `MatrixClient`.
#[allow(missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/matrix.v1.rs"));
}

pub mod server;

/// Installs OpenTelemetry tracing as the process's `tracing` subscriber (an SDK tracer provider
/// without an exporter, always sampling): topspin's spans become OpenTelemetry spans, and the
/// W3C trace context travels in `traceparent` metadata (the matrix `trace` check).
pub fn install_tracing() {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("matrix")));
    // A second call (none here) would keep the first subscriber.
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// The trace id of `span` as W3C writes it (32 lowercase hex digits), or `None` when it has no
/// valid OpenTelemetry context.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}
