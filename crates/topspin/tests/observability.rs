//! Observability over real TCP sockets: a `tracing` span per call on both sides with its
//! fields; with `--features otel`, one trace across client and server (W3C `traceparent` in
//! the metadata); with `--features metrics`, the per-method metrics scraped from a Prometheus
//! endpoint over HTTP.

use bytes::Bytes;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::{Address, Channel, Request, Response, Server, ServerBuilder, Status};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

const ECHO: &str = "/obs.Obs/Echo";
const FAIL: &str = "/obs.Obs/Fail";

fn methods(b: ServerBuilder) -> ServerBuilder {
    b.unary(ECHO, RawCodec, |req: Request<Bytes>| async move {
        tracing::info!("inside the handler");
        Ok(Response::new(req.into_inner()))
    })
    .unary(FAIL, RawCodec, |_req: Request<Bytes>| async move {
        Err::<Response<Bytes>, _>(Status::not_found("no"))
    })
}

async fn start(b: ServerBuilder) -> (Address, topspin::ShutdownHandle) {
    let server = methods(b).bind("tcp://127.0.0.1:0").await.unwrap();
    let address = server.local_addr().clone();
    let handle = server.shutdown_handle();
    tokio::spawn(server.serve());
    (address, handle)
}

/// The tests of this file run one at a time: each sets its own (thread-local) subscriber, and
/// tracing caches per call site whether any subscriber is interested — a cache that tests
/// registering call sites on other threads at the same moment can leave wrong (a span then
/// goes unrecorded: 2 runs in 60 failed so).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One captured span: its name and fields, and the events recorded inside it.
#[derive(Clone, Debug, Default)]
struct Captured {
    name: String,
    fields: HashMap<String, String>,
    events: Vec<String>,
    closed: bool,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<HashMap<u64, Captured>>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>> Layer<S>
    for Capture
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut c = Captured {
            name: attrs.metadata().name().to_owned(),
            ..Default::default()
        };
        attrs.record(&mut Fields(&mut c.fields));
        self.0.lock().unwrap().insert(id.into_u64(), c);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(c) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(&mut c.fields));
        }
    }
    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.event_span(event) {
            let mut f = HashMap::new();
            event.record(&mut Fields(&mut f));
            if let Some(c) = self.0.lock().unwrap().get_mut(&span.id().into_u64()) {
                c.events.push(f.remove("message").unwrap_or_default());
            }
        }
    }
    fn on_close(&self, id: Id, _: Context<'_, S>) {
        if let Some(c) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            c.closed = true;
        }
    }
}

impl Capture {
    /// The closed call spans, waiting (bounded) until there are `n`.
    async fn calls(&self, n: usize) -> Vec<Captured> {
        for _ in 0..500 {
            let v: Vec<Captured> = self
                .0
                .lock()
                .unwrap()
                .values()
                .filter(|c| c.name == "topspin.call" && c.closed)
                .cloned()
                .collect();
            if v.len() >= n {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("fewer than {n} call spans closed");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn every_call_has_a_span_on_both_sides_with_its_fields() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let _serial = SERIAL.lock().await;
    let _guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();

    let (address, shutdown) = start(Server::builder()).await;
    let ch = Channel::connect(address.clone()).await.unwrap();
    ch.unary(RawCodec, ECHO, Request::new(Bytes::from_static(b"hi")))
        .await
        .unwrap();
    let err = ch
        .unary(RawCodec, FAIL, Request::new(Bytes::from_static(b"hi")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), topspin::Code::NotFound);

    let spans = capture.calls(4).await;
    let find = |side: &str, method: &str| {
        spans
            .iter()
            .find(|c| c.fields["side"] == side && c.fields["method"] == method)
            .unwrap_or_else(|| panic!("no {side} span of {method}: {spans:?}"))
            .clone()
    };
    for side in ["client", "server"] {
        let ok = find(side, ECHO);
        assert_eq!(ok.fields["code"], "OK", "{ok:?}");
        assert!(ok.fields["duration_us"].parse::<u64>().is_ok(), "{ok:?}");
        assert!(ok.fields["call_id"].parse::<u64>().is_ok(), "{ok:?}");
        assert!(!ok.fields["peer"].is_empty(), "{ok:?}");
        let fail = find(side, FAIL);
        assert_eq!(fail.fields["code"], "NOT_FOUND", "{fail:?}");
        assert_eq!(fail.fields["otel.status_code"], "ERROR", "{fail:?}");
    }
    // The client's peer is the server's address; the server's a loopback client address.
    assert_eq!(find("client", ECHO).fields["peer"], address.to_string());
    assert!(find("server", ECHO).fields["peer"].starts_with("127.0.0.1:"));
    // The handler runs inside the server's span.
    assert_eq!(find("server", ECHO).events, ["inside the handler"]);
    shutdown.shutdown(Duration::from_secs(1)).await;
}

#[cfg(feature = "otel")]
#[tokio::test(flavor = "current_thread")]
async fn client_and_server_spans_share_one_trace() {
    use opentelemetry::trace::{SpanKind, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use tracing::Instrument;

    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let _serial = SERIAL.lock().await;
    let _guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();

    let (address, shutdown) = start(Server::builder()).await;
    let ch = Channel::connect(address).await.unwrap();
    let reply = ch
        .unary(RawCodec, ECHO, Request::new(Bytes::from_static(b"hi")))
        .instrument(tracing::info_span!("request from the application"))
        .await
        .unwrap();
    assert_eq!(reply.get_ref(), &Bytes::from_static(b"hi"));

    let mut spans = Vec::new();
    for _ in 0..500 {
        spans = exporter.get_finished_spans().unwrap();
        if spans.iter().filter(|s| s.name == ECHO).count() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let client = spans
        .iter()
        .find(|s| s.name == ECHO && s.span_kind == SpanKind::Client)
        .unwrap_or_else(|| panic!("no client span: {spans:#?}"));
    let server = spans
        .iter()
        .find(|s| s.name == ECHO && s.span_kind == SpanKind::Server)
        .unwrap_or_else(|| panic!("no server span: {spans:#?}"));
    let app = spans
        .iter()
        .find(|s| s.name == "request from the application")
        .unwrap_or_else(|| panic!("no application span: {spans:#?}"));
    assert_eq!(
        client.span_context.trace_id(),
        server.span_context.trace_id(),
        "one trace across the two sides"
    );
    assert_eq!(server.parent_span_id, client.span_context.span_id());
    assert!(server.parent_span_is_remote);
    assert_eq!(client.parent_span_id, app.span_context.span_id());
    assert_eq!(app.span_context.trace_id(), client.span_context.trace_id());
    shutdown.shutdown(Duration::from_secs(1)).await;
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn call_metrics_are_scraped_from_a_prometheus_endpoint() {
    let _serial = SERIAL.lock().await;
    use metrics_exporter_prometheus::PrometheusBuilder;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use topspin::observe::Metrics;

    // A free loopback port for the exporter's HTTP listener.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    PrometheusBuilder::new()
        .with_http_listener(listen)
        .install()
        .unwrap();
    let metrics = Metrics::new();

    let (address, shutdown) = start(Server::builder().interceptor(metrics.clone())).await;
    let ch = topspin::Endpoint::new(address)
        .unwrap()
        .interceptor(metrics)
        .connect()
        .await
        .unwrap();
    for _ in 0..3 {
        ch.unary(RawCodec, ECHO, Request::new(Bytes::from_static(b"hello")))
            .await
            .unwrap();
    }
    let _ = ch
        .unary(RawCodec, FAIL, Request::new(Bytes::from_static(b"x")))
        .await
        .unwrap_err();

    // The server records a call's end as its answer leaves: scrape until it shows (bounded).
    let mut body = String::new();
    for _ in 0..200 {
        let mut s = match tokio::net::TcpStream::connect(listen).await {
            Ok(s) => s,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        body = String::from_utf8_lossy(&out).into_owned();
        if value(
            &body,
            "topspin_calls_finished_total",
            &["side=\"server\"", "code=\"NOT_FOUND\""],
        ) == Some(1.0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    for side in ["client", "server"] {
        let s = format!("side=\"{side}\"");
        let echo = format!("method=\"{ECHO}\"");
        let fail = format!("method=\"{FAIL}\"");
        let get = |name: &str, labels: &[&str]| value(&body, name, labels);
        assert_eq!(
            get("topspin_calls_started_total", &[&s, &echo]),
            Some(3.0),
            "{body}"
        );
        assert_eq!(
            get("topspin_calls_started_total", &[&s, &fail]),
            Some(1.0),
            "{body}"
        );
        assert_eq!(
            get("topspin_calls_finished_total", &[&s, &echo, "code=\"OK\""]),
            Some(3.0),
            "{body}"
        );
        assert_eq!(
            get(
                "topspin_calls_finished_total",
                &[&s, &fail, "code=\"NOT_FOUND\""]
            ),
            Some(1.0),
            "{body}"
        );
        assert_eq!(
            get("topspin_calls_in_flight", &[&s, &echo]),
            Some(0.0),
            "{body}"
        );
        assert_eq!(
            get("topspin_call_duration_seconds_count", &[&s, &echo]),
            Some(3.0),
            "{body}"
        );
        assert_eq!(
            get("topspin_request_bytes_sum", &[&s, &echo]),
            Some(15.0),
            "{body}"
        );
        assert_eq!(
            get("topspin_response_bytes_sum", &[&s, &echo]),
            Some(15.0),
            "{body}"
        );
    }
    shutdown.shutdown(Duration::from_secs(1)).await;
}

/// The value of the sample `name{…}` whose labels include all of `labels`.
#[cfg(feature = "metrics")]
fn value(body: &str, name: &str, labels: &[&str]) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            let set = &l[..l.find('}').unwrap_or(l.len())];
            labels.iter().all(|want| set.contains(want))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
