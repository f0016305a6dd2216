//! [`Metrics`]: per-method call metrics through the `metrics` facade.

use crate::interceptor::{CallEnd, CallInfo, Interceptor, Side};
use crate::{Code, Status};
use metrics::{Counter, Gauge, Histogram, Label};
use rustc_hash::FxHashMap;
use std::sync::{Arc, OnceLock, RwLock};

/// An interceptor that records, per side and method, through the [`metrics`] facade:
///
/// | name | kind | labels |
/// |---|---|---|
/// | `topspin_calls_started_total` | counter | `side`, `method` |
/// | `topspin_calls_finished_total` | counter | `side`, `method`, `code` (e.g. `OK`, `NOT_FOUND`) |
/// | `topspin_calls_in_flight` | gauge | `side`, `method` |
/// | `topspin_call_duration_seconds` | histogram | `side`, `method` |
/// | `topspin_request_bytes` | histogram | `side`, `method` |
/// | `topspin_response_bytes` | histogram | `side`, `method` |
///
/// Register it first (outermost) to count every call, also those a later interceptor
/// rejects. Install the `metrics` recorder (a Prometheus exporter …) before the first call:
/// the handles of a method are registered once, with the recorder of that moment. Only
/// methods a server serves, or a client calls, get labels (a server never records a method
/// name a client made up).
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use topspin::observe::Metrics;
/// let metrics = Metrics::new();
/// let server = topspin::Server::builder().interceptor(metrics.clone());
/// let channel = topspin::Endpoint::new("tcp://127.0.0.1:50051")?.interceptor(metrics);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Per-method handles, client side and server side.
    methods: Arc<[ByMethod; 2]>,
}

/// The handles of each method of one side.
type ByMethod = RwLock<FxHashMap<Box<str>, Arc<MethodMetrics>>>;

#[derive(Debug)]
struct MethodMetrics {
    labels: [Label; 2],
    started: Counter,
    in_flight: Gauge,
    duration: Histogram,
    request_bytes: Histogram,
    response_bytes: Histogram,
    /// Finished calls by status code (registered when a code is first seen).
    finished: [OnceLock<Counter>; 17],
}

impl MethodMetrics {
    fn new(side: Side, method: &str) -> MethodMetrics {
        let labels = [
            Label::new("side", side.as_str()),
            Label::new("method", method.to_owned()),
        ];
        let l = labels.to_vec();
        MethodMetrics {
            started: metrics::counter!("topspin_calls_started_total", l.clone()),
            in_flight: metrics::gauge!("topspin_calls_in_flight", l.clone()),
            duration: metrics::histogram!("topspin_call_duration_seconds", l.clone()),
            request_bytes: metrics::histogram!("topspin_request_bytes", l.clone()),
            response_bytes: metrics::histogram!("topspin_response_bytes", l),
            finished: Default::default(),
            labels,
        }
    }

    fn finished(&self, code: Code) -> Option<&Counter> {
        let slot = self.finished.get(usize::from(code.as_u16()))?;
        Some(slot.get_or_init(|| {
            let mut l = self.labels.to_vec();
            l.push(Label::new("code", code.name()));
            metrics::counter!("topspin_calls_finished_total", l)
        }))
    }
}

impl Metrics {
    /// A recorder of call metrics (clones share their per-method handles). Describes the
    /// metrics to the installed recorder.
    pub fn new() -> Metrics {
        metrics::describe_counter!("topspin_calls_started_total", "Calls started");
        metrics::describe_counter!(
            "topspin_calls_finished_total",
            "Calls finished, by status code"
        );
        metrics::describe_gauge!("topspin_calls_in_flight", "Calls started and not finished");
        metrics::describe_histogram!(
            "topspin_call_duration_seconds",
            metrics::Unit::Seconds,
            "Time from a call's start to its end"
        );
        metrics::describe_histogram!(
            "topspin_request_bytes",
            metrics::Unit::Bytes,
            "Bytes of request messages per call"
        );
        metrics::describe_histogram!(
            "topspin_response_bytes",
            metrics::Unit::Bytes,
            "Bytes of response messages per call"
        );
        Metrics::default()
    }

    fn method(&self, side: Side, method: &str) -> Arc<MethodMetrics> {
        let map = &self.methods[usize::from(side == Side::Server)];
        if let Some(m) = map.read().unwrap_or_else(|e| e.into_inner()).get(method) {
            return m.clone();
        }
        map.write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(method.into())
            .or_insert_with(|| Arc::new(MethodMetrics::new(side, method)))
            .clone()
    }
}

impl Interceptor for Metrics {
    fn on_call(&self, call: &mut CallInfo) -> Result<(), Status> {
        let m = self.method(call.side(), call.method());
        m.started.increment(1);
        m.in_flight.increment(1.0);
        Ok(())
    }

    fn on_end(&self, call: &CallInfo, end: &CallEnd<'_>) {
        let m = self.method(call.side(), call.method());
        m.in_flight.decrement(1.0);
        if let Some(c) = m.finished(end.code()) {
            c.increment(1);
        }
        m.duration.record(end.duration().as_secs_f64());
        m.request_bytes.record(end.request_bytes() as f64);
        m.response_bytes.record(end.response_bytes() as f64);
    }
}
