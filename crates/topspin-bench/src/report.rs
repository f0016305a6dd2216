//! Aggregation (median of the repetitions' medians), ratios, tables and the JSON document.

use crate::{Item, PEERS};
use serde::{Deserialize, Deserializer, Serialize};
use topspin_bench_common::Outcome;

/// The JSON document (its schema is described in docs/benchmarks.md).
///
/// `Deserialize` (for `topspin-bench compare`) is `Deserialize<'static>`: the names are
/// `&'static str`, so a report is read from a `&'static str` (the compare subcommand leaks the
/// two files' text, once per process).
#[derive(Serialize, Deserialize)]
#[serde(bound(deserialize = "'de: 'static"))]
pub(crate) struct Run {
    pub(crate) version: u32,
    pub(crate) started: String,
    /// NaN when /proc/loadavg was unreadable (serialised as `null`).
    #[serde(deserialize_with = "nan_if_null")]
    pub(crate) load_avg_start: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub(crate) load_avg_end: f64,
    pub(crate) noisy: bool,
    pub(crate) machine: Machine,
    /// Where every system's threads ran (printed with every table).
    pub(crate) layout: Layout,
    pub(crate) records: Vec<Record>,
}

/// `f64::NAN` for a JSON `null` (how serde_json writes a NaN).
fn nan_if_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Option::<f64>::deserialize(d).map(|v| v.unwrap_or(f64::NAN))
}

/// The thread layout of a run: placement of client and server, CPUs, runtimes.
#[derive(Serialize, Deserialize)]
pub(crate) struct Layout {
    /// `"separate processes"` or `"one process"` (per system below).
    pub(crate) placement: &'static str,
    /// The CPUs the peers may run on (`Cpus_allowed_list`, inherited from `taskset`).
    pub(crate) cpus_allowed: String,
    /// Online CPUs of the machine.
    pub(crate) cpus_online: usize,
    /// True when the run is restricted to fewer CPUs than are online (e.g. `taskset -c 0`).
    pub(crate) pinned: bool,
    /// Busy threads the benchmark itself ran during the measurement (`--loaded`): one per
    /// allowed CPU at normal priority, the same for every system; 0 in a quiet run.
    #[serde(default)]
    pub(crate) load_threads: usize,
    systems: Vec<SystemLayout>,
}

/// One system's thread layout.
#[derive(Serialize, Deserialize)]
pub(crate) struct SystemLayout {
    pub(crate) system: &'static str,
    /// Server in a process of its own.
    pub(crate) separate_processes: bool,
    pub(crate) server: &'static str,
    pub(crate) client: &'static str,
}

impl Layout {
    pub(crate) fn new(separate: bool, systems: Vec<SystemLayout>) -> Layout {
        let cpus_allowed = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .map(|v| v.trim().to_string())
            })
            .unwrap_or_else(|| "?".into());
        let online = std::fs::read_to_string("/proc/cpuinfo").map_or(0, |s| {
            s.lines().filter(|l| l.starts_with("processor")).count()
        });
        let allowed = std::thread::available_parallelism().map_or(online, |n| n.get());
        Layout {
            placement: if separate {
                "separate processes"
            } else {
                "one process"
            },
            cpus_allowed,
            cpus_online: online,
            pinned: allowed < online,
            load_threads: 0,
            systems,
        }
    }

    /// One line for under a table: placement, CPUs, and each side's threads for `names`.
    fn line(&self, names: &[&str]) -> String {
        let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
        for l in self.systems.iter().filter(|l| names.contains(&l.system)) {
            let key = format!(
                "{}server {}; client {}",
                if l.separate_processes {
                    "separate processes: "
                } else {
                    "one process: "
                },
                l.server,
                l.client
            );
            match groups.iter_mut().find(|g| g.0 == key) {
                Some(g) => g.1.push(l.system),
                None => groups.push((key, vec![l.system])),
            }
        }
        let cpus = if self.pinned {
            format!(
                "pinned: every thread confined to CPU(s) {} of {}",
                self.cpus_allowed, self.cpus_online
            )
        } else {
            format!(
                "unpinned: threads float over CPUs {} (the scheduler places them)",
                self.cpus_allowed
            )
        };
        let mut out = format!("  layout — {cpus}; no thread pins itself");
        for (k, v) in groups {
            out.push_str(&format!("\n    {}: {k}", v.join(", ")));
        }
        out
    }
}

#[derive(Serialize, Deserialize)]
pub(crate) struct Machine {
    pub(crate) cpus: usize,
    pub(crate) model: String,
    pub(crate) kernel: String,
}

/// Each repetition's own figure, in run order (the record's figure is their median): the run's
/// noise. Empty in reports written before they were recorded, and for figures a point lacks.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Reps {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) median_us: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) p99_us: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) cpu_us_per_call: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) calls_per_s: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) allocs_per_call: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) bytes_alloc_per_call: Vec<f64>,
}

impl Reps {
    fn is_empty(&self) -> bool {
        self.median_us.is_empty()
            && self.p99_us.is_empty()
            && self.cpu_us_per_call.is_empty()
            && self.calls_per_s.is_empty()
            && self.allocs_per_call.is_empty()
            && self.bytes_alloc_per_call.is_empty()
    }
}

/// One system on one workload point.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) workload: &'static str,
    /// Only on `allocs` records: which call was counted (`echo` 20 B or `answer`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) call: Option<&'static str>,
    pub(crate) system: &'static str,
    pub(crate) transport: &'static str,
    pub(crate) size: Option<u64>,
    pub(crate) connections: usize,
    pub(crate) in_flight: usize,
    pub(crate) median_us: Option<f64>,
    pub(crate) p99_us: Option<f64>,
    pub(crate) cpu_us_per_call: Option<f64>,
    pub(crate) calls_per_s: Option<f64>,
    pub(crate) allocs_per_call: Option<f64>,
    pub(crate) bytes_alloc_per_call: Option<f64>,
    pub(crate) ratio_to_raw: Option<f64>,
    pub(crate) ratio_to_best_peer: Option<f64>,
    /// Measured calls over all repetitions.
    pub(crate) calls: u64,
    /// The system cannot run this workload (e.g. a blocking client and calls in flight).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) unsupported: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// Each repetition's figures (the median figures above are taken over these).
    #[serde(default, skip_serializing_if = "Reps::is_empty")]
    pub(crate) reps: Reps,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

impl Record {
    /// Median over repetitions of each figure (median of medians; the p99 is the median of the
    /// repetitions' p99s).
    pub(crate) fn aggregate(
        it: &Item,
        system: &'static str,
        transport: &'static str,
        outs: &[Outcome],
    ) -> Record {
        let each = |f: fn(&Outcome) -> Option<f64>| -> Vec<f64> {
            outs.iter()
                .filter_map(f)
                .filter(|x| x.is_finite())
                .collect()
        };
        let m = |f: fn(&Outcome) -> Option<f64>| median(each(f));
        let error = outs.iter().find_map(|o| o.error.clone());
        let unsupported = outs.iter().all(|o| o.unsupported);
        Record {
            workload: it.workload,
            call: (it.workload == "allocs").then_some(if it.cmd == "allocs_echo" {
                "echo"
            } else {
                "answer"
            }),
            system,
            transport,
            size: it.size,
            connections: it.connections,
            in_flight: it.in_flight,
            median_us: m(|o| o.median_us),
            p99_us: m(|o| o.p99_us),
            cpu_us_per_call: m(|o| o.cpu_us_per_call),
            calls_per_s: m(|o| o.calls_per_s),
            allocs_per_call: m(|o| o.allocs_per_call),
            bytes_alloc_per_call: m(|o| o.bytes_alloc_per_call),
            ratio_to_raw: None,
            ratio_to_best_peer: None,
            calls: outs.iter().map(|o| o.calls).sum(),
            unsupported,
            error,
            reps: Reps {
                median_us: each(|o| o.median_us),
                p99_us: each(|o| o.p99_us),
                cpu_us_per_call: each(|o| o.cpu_us_per_call),
                calls_per_s: each(|o| o.calls_per_s),
                allocs_per_call: each(|o| o.allocs_per_call),
                bytes_alloc_per_call: each(|o| o.bytes_alloc_per_call),
            },
        }
    }

    pub(crate) fn same_point(&self, o: &Record) -> bool {
        self.workload == o.workload
            && self.call == o.call
            && self.size == o.size
            && self.connections == o.connections
            && self.in_flight == o.in_flight
    }

    /// The figure ratios are taken on, "smaller is better" oriented: latency, or 1 / calls/s
    /// for throughput, or allocations for allocs.
    fn cost(&self) -> Option<f64> {
        match self.workload {
            "throughput" => self.calls_per_s.filter(|c| *c > 0.0).map(|c| 1.0 / c),
            "allocs" => self.allocs_per_call,
            _ => self.median_us,
        }
    }
}

/// ratio_to_raw (raw for TCP systems, raw-uds for Unix-socket ones, raw-tls, raw-ws and raw-shm
/// for the TLS, WebSocket and shared-memory ones) and ratio to the best of tonic, tarpc, capnp, thrift and grpc-go (tonic-tls
/// for TLS systems; WebSocket systems have no peer), on the same workload point of the same run.
pub(crate) fn fill_ratios(records: &mut [Record]) {
    let snapshot = records.to_vec();
    for r in records.iter_mut() {
        if r.workload == "allocs" {
            continue; // 0 allocations at the floor: a ratio means nothing there.
        }
        let (floor, peers): (&str, &[&str]) = match r.transport {
            "uds" => ("raw-uds", PEERS),
            "tls" => ("raw-tls", &["tonic-tls"]),
            "ws" => ("raw-ws", &[]),
            "shm" => ("raw-shm", PEERS),
            _ => ("raw", PEERS),
        };
        let base = snapshot
            .iter()
            .find(|o| o.system == floor && o.same_point(r))
            .and_then(Record::cost);
        let best = snapshot
            .iter()
            .filter(|o| peers.contains(&o.system) && o.same_point(r))
            .filter_map(Record::cost)
            .min_by(|a, b| a.partial_cmp(b).expect("finite"));
        if let Some(c) = r.cost() {
            r.ratio_to_raw = base.filter(|b| *b > 0.0).map(|b| c / b);
            r.ratio_to_best_peer = best.filter(|b| *b > 0.0).map(|b| c / b);
        }
    }
}

pub(crate) fn machine() -> Machine {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    Machine {
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        model,
        kernel,
    }
}

/// Now, as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn rfc3339_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil from days (H. Hinnant's algorithm).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

pub(crate) fn size_label(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) && n < 10000 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

pub(crate) fn us(v: Option<f64>) -> String {
    match v {
        None => "—".into(),
        Some(x) if x >= 10_000.0 => format!("{:.2} ms", x / 1000.0),
        Some(x) if x >= 1000.0 => format!("{:.0} µs", x),
        Some(x) if x >= 100.0 => format!("{:.1} µs", x),
        Some(x) => format!("{:.2} µs", x),
    }
}

pub(crate) fn ratio(v: Option<f64>) -> String {
    v.map_or("—".into(), |x| format!("{x:.2}×"))
}

pub(crate) fn rate(v: Option<f64>) -> String {
    match v {
        None => "—".into(),
        Some(x) if x >= 1e6 => format!("{:.2} M/s", x / 1e6),
        Some(x) if x >= 1e3 => format!("{:.1} k/s", x / 1e3),
        Some(x) => format!("{x:.0} /s"),
    }
}

pub(crate) fn title(r: &Record) -> String {
    match r.workload {
        "throughput" => format!(
            "throughput, 20 B echo, {} connection(s) × {} in flight",
            r.connections, r.in_flight
        ),
        "burst" => "burst: 8 × 20 B echo issued at once, then awaited (µs per call)".into(),
        "allocs" => format!(
            "allocations per call, client + server: {}",
            if r.call == Some("echo") {
                "echo 20 B"
            } else {
                "answer"
            }
        ),
        "nymph_array" => format!("nymph_array, {} × uint32", r.size.unwrap_or(0)),
        w => match r.size {
            Some(n) => format!("{w} {}", size_label(n)),
            None => w.to_string(),
        },
    }
}

/// One table per workload point: system, median, p99, CPU per call, ratios.
pub(crate) fn print_tables(run: &Run, smoke: bool) {
    let mut seen: Vec<&Record> = Vec::new();
    println!(
        "topspin-bench — {} CPUs, {}, kernel {}; started {}",
        run.machine.cpus, run.machine.model, run.machine.kernel, run.started
    );
    if smoke {
        println!("(smoke run: few calls, figures are not measurements)");
    }
    if run.layout.load_threads > 0 {
        println!(
            "LOADED: {} busy thread(s) of the benchmark's own (one per allowed CPU, normal priority) ran through every measurement",
            run.layout.load_threads
        );
    }
    // The system column: 12 wide, or as wide as the longest name in the run.
    let w = run
        .records
        .iter()
        .map(|r| r.system.chars().count())
        .max()
        .unwrap_or(0)
        .max(12);
    for r in &run.records {
        if seen.iter().any(|s| s.same_point(r)) {
            continue;
        }
        seen.push(r);
        let rows: Vec<&Record> = run.records.iter().filter(|o| o.same_point(r)).collect();
        let names: Vec<&str> = rows.iter().map(|o| o.system).collect();
        let layout = run.layout.line(&names);
        println!("\n{}", title(r));
        match r.workload {
            "throughput" => {
                println!(
                    "  {:<w$} {:>11} {:>10} {:>8} {:>11}",
                    "system", "calls/s", "cpu/call", "× raw", "× best peer"
                );
                for o in rows {
                    println!(
                        "  {:<w$} {:>11} {:>10} {:>8} {:>11}{}",
                        o.system,
                        rate(o.calls_per_s),
                        us(o.cpu_us_per_call),
                        ratio(o.ratio_to_raw),
                        ratio(o.ratio_to_best_peer),
                        note(o)
                    );
                }
            }
            "allocs" => {
                println!(
                    "  {:<w$} {:>12} {:>12} {:>10}",
                    "system", "allocs/call", "bytes/call", "median"
                );
                for o in rows {
                    println!(
                        "  {:<w$} {:>12} {:>12} {:>10}{}",
                        o.system,
                        o.allocs_per_call.map_or("—".into(), |x| format!("{x:.1}")),
                        o.bytes_alloc_per_call
                            .map_or("—".into(), |x| format!("{x:.0}")),
                        us(o.median_us),
                        note(o)
                    );
                }
            }
            _ => {
                println!(
                    "  {:<w$} {:>10} {:>10} {:>10} {:>8} {:>11}",
                    "system", "median", "p99", "cpu/call", "× raw", "× best peer"
                );
                for o in rows {
                    println!(
                        "  {:<w$} {:>10} {:>10} {:>10} {:>8} {:>11}{}",
                        o.system,
                        us(o.median_us),
                        us(o.p99_us),
                        us(o.cpu_us_per_call),
                        ratio(o.ratio_to_raw),
                        ratio(o.ratio_to_best_peer),
                        note(o)
                    );
                }
            }
        }
        println!("{layout}");
    }
}

pub(crate) fn note(r: &Record) -> String {
    if let Some(e) = &r.error {
        format!("  FAILED: {e}")
    } else if r.unsupported {
        "  (not applicable: one call in flight per connection)".into()
    } else {
        String::new()
    }
}
