//! `topspin-bench compare BEFORE.json AFTER.json [--threshold PCT]`: two runs' JSON reports
//! (`--json FILE`, the schema of docs/benchmarks.md) side by side, row by row.
//!
//! A row is one system at one point: (`workload`, `call`, `size`, `connections`, `in_flight`,
//! `system`, `transport`). For every figure either run has, it prints before, after and
//! after ÷ before, each run's figure with its repetitions' range next to it (`reps` in the
//! report; older reports keep only the median over the repetitions, which is said). Rows found in
//! one file only are listed at the end. Placement is per run (`layout`), not per row: a
//! difference between the two runs is printed as a warning above the tables.

use crate::report::{self, Record, Run};

// The `compare` subcommand's arguments (its help text is on `Sub::Compare` in main.rs).
#[derive(clap::Args, Debug)]
pub(crate) struct CompareArgs {
    /// The earlier run's report (topspin-bench --json FILE)
    #[arg(value_name = "BEFORE.json")]
    pub(crate) before: String,
    /// The later run's report
    #[arg(value_name = "AFTER.json")]
    pub(crate) after: String,
    /// Marks ratios more than PCT % away from 1.00× as worse or better (and "within noise"
    /// when the two runs' ranges overlap); a trailing % is allowed
    #[arg(long, value_name = "PCT", value_parser = percentage)]
    pub(crate) threshold: Option<f64>,
}

/// `--threshold`: a percentage ≥ 0, with or without `%`.
fn percentage(v: &str) -> Result<f64, String> {
    match v.trim_end_matches('%').parse::<f64>() {
        Ok(p) if p >= 0.0 => Ok(p),
        _ => Err("needs a percentage (e.g. 5)".into()),
    }
}

/// A figure of a record that the comparison shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fig {
    Median,
    P99,
    Cpu,
    CallsPerS,
    Allocs,
    Bytes,
    XRaw,
    XBestPeer,
}

const FIGS: [Fig; 8] = [
    Fig::Median,
    Fig::P99,
    Fig::Cpu,
    Fig::CallsPerS,
    Fig::Allocs,
    Fig::Bytes,
    Fig::XRaw,
    Fig::XBestPeer,
];

impl Fig {
    fn label(self) -> &'static str {
        match self {
            Fig::Median => "median",
            Fig::P99 => "p99",
            Fig::Cpu => "cpu/call",
            Fig::CallsPerS => "calls/s",
            Fig::Allocs => "allocs/call",
            Fig::Bytes => "bytes/call",
            Fig::XRaw => "× raw",
            Fig::XBestPeer => "× best peer",
        }
    }

    fn value(self, r: &Record) -> Option<f64> {
        match self {
            Fig::Median => r.median_us,
            Fig::P99 => r.p99_us,
            Fig::Cpu => r.cpu_us_per_call,
            Fig::CallsPerS => r.calls_per_s,
            Fig::Allocs => r.allocs_per_call,
            Fig::Bytes => r.bytes_alloc_per_call,
            Fig::XRaw => r.ratio_to_raw,
            Fig::XBestPeer => r.ratio_to_best_peer,
        }
        .filter(|x| x.is_finite())
    }

    /// The repetitions' own figures (none for the ratios, which are taken on the medians).
    fn reps(self, r: &Record) -> &[f64] {
        match self {
            Fig::Median => &r.reps.median_us,
            Fig::P99 => &r.reps.p99_us,
            Fig::Cpu => &r.reps.cpu_us_per_call,
            Fig::CallsPerS => &r.reps.calls_per_s,
            Fig::Allocs => &r.reps.allocs_per_call,
            Fig::Bytes => &r.reps.bytes_alloc_per_call,
            Fig::XRaw | Fig::XBestPeer => &[],
        }
    }

    /// Calls per second: more is better; every other figure (the ratios included): less is.
    fn higher_is_better(self) -> bool {
        self == Fig::CallsPerS
    }

    fn fmt(self, v: Option<f64>) -> String {
        match self {
            Fig::Median | Fig::P99 | Fig::Cpu => report::us(v),
            Fig::CallsPerS => report::rate(v),
            Fig::Allocs => v.map_or("—".into(), |x| format!("{x:.1}")),
            Fig::Bytes => v.map_or("—".into(), |x| format!("{x:.0}")),
            Fig::XRaw | Fig::XBestPeer => report::ratio(v),
        }
    }
}

/// The spread of one run's repetitions of a figure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Noise {
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) n: usize,
}

impl Noise {
    fn of(reps: &[f64]) -> Option<Noise> {
        let v: Vec<f64> = reps.iter().copied().filter(|x| x.is_finite()).collect();
        let min = v.iter().copied().reduce(f64::min)?;
        let max = v.iter().copied().reduce(f64::max)?;
        Some(Noise {
            min,
            max,
            n: v.len(),
        })
    }

    fn overlaps(&self, o: &Noise) -> bool {
        self.min <= o.max && o.min <= self.max
    }
}

/// Where a ratio lies against `--threshold`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mark {
    Worse,
    Better,
}

/// One figure of a matched row.
#[derive(Debug)]
pub(crate) struct Line {
    pub(crate) fig: Fig,
    pub(crate) before: Option<f64>,
    pub(crate) after: Option<f64>,
    pub(crate) before_noise: Option<Noise>,
    pub(crate) after_noise: Option<Noise>,
    /// after ÷ before; 1 when both are 0, infinite when only before is 0.
    pub(crate) ratio: Option<f64>,
    pub(crate) mark: Option<Mark>,
}

impl Line {
    /// Both runs' ranges overlap: the change is inside the repetitions' spread.
    pub(crate) fn within_noise(&self) -> bool {
        matches!((&self.before_noise, &self.after_noise), (Some(b), Some(a)) if b.overlaps(a))
    }
}

/// after ÷ before.
pub(crate) fn ratio(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    let (b, a) = (before?, after?);
    if b > 0.0 {
        Some(a / b)
    } else if b == 0.0 && a == 0.0 {
        Some(1.0)
    } else if b == 0.0 && a > 0.0 {
        Some(f64::INFINITY)
    } else {
        None
    }
}

/// `Some` when `ratio` is more than `pct` % away from 1.
pub(crate) fn mark(fig: Fig, ratio: Option<f64>, pct: Option<f64>) -> Option<Mark> {
    let (r, p) = (ratio?, pct?);
    if (r - 1.0).abs() * 100.0 <= p {
        return None;
    }
    Some(if (r > 1.0) == fig.higher_is_better() {
        Mark::Better
    } else {
        Mark::Worse
    })
}

/// Two records are the same row: the same system at the same point.
fn same_row(a: &Record, b: &Record) -> bool {
    a.same_point(b) && a.system == b.system && a.transport == b.transport
}

/// A row found in both reports.
pub(crate) struct Row<'a> {
    pub(crate) before: &'a Record,
    pub(crate) after: &'a Record,
    pub(crate) lines: Vec<Line>,
}

pub(crate) struct Comparison<'a> {
    /// In the order of BEFORE's records.
    pub(crate) rows: Vec<Row<'a>>,
    pub(crate) only_before: Vec<&'a Record>,
    pub(crate) only_after: Vec<&'a Record>,
}

pub(crate) fn compare<'a>(
    before: &'a Run,
    after: &'a Run,
    threshold: Option<f64>,
) -> Comparison<'a> {
    let mut rows = Vec::new();
    let mut only_before = Vec::new();
    for b in &before.records {
        let Some(a) = after.records.iter().find(|a| same_row(a, b)) else {
            only_before.push(b);
            continue;
        };
        let lines = FIGS
            .iter()
            .filter_map(|&fig| {
                let (bv, av) = (fig.value(b), fig.value(a));
                if bv.is_none() && av.is_none() {
                    return None;
                }
                let r = ratio(bv, av);
                Some(Line {
                    fig,
                    before: bv,
                    after: av,
                    before_noise: Noise::of(fig.reps(b)),
                    after_noise: Noise::of(fig.reps(a)),
                    ratio: r,
                    mark: mark(fig, r, threshold),
                })
            })
            .collect();
        rows.push(Row {
            before: b,
            after: a,
            lines,
        });
    }
    let only_after = after
        .records
        .iter()
        .filter(|a| !before.records.iter().any(|b| same_row(a, b)))
        .collect();
    Comparison {
        rows,
        only_before,
        only_after,
    }
}

fn noise_cell(fig: Fig, n: Option<Noise>) -> String {
    match n {
        None => String::new(),
        Some(n) if n.n == 1 => "(1 rep)".into(),
        Some(n) => format!(
            "{}–{} ({})",
            fig.fmt(Some(n.min)),
            fig.fmt(Some(n.max)),
            n.n
        ),
    }
}

fn ratio_cell(r: Option<f64>) -> String {
    match r {
        Some(x) if x.is_infinite() => "∞".into(),
        other => report::ratio(other),
    }
}

/// Pads `s` to `w` characters (not bytes: µ, – and × are one character, several bytes).
fn pad(s: &str, w: usize) -> String {
    let n = s.chars().count();
    format!("{s}{}", " ".repeat(w.saturating_sub(n)))
}

fn padl(s: &str, w: usize) -> String {
    let n = s.chars().count();
    format!("{}{s}", " ".repeat(w.saturating_sub(n)))
}

fn run_line(tag: &str, path: &str, r: &Run) -> String {
    format!(
        "{tag} {path}: started {}, load average {:.2} → {:.2}{}; {}, {}; {} CPUs, {}",
        r.started,
        r.load_avg_start,
        r.load_avg_end,
        if r.noisy { " (NOISY)" } else { "" },
        r.layout.placement,
        if r.layout.pinned {
            format!("pinned to CPU(s) {}", r.layout.cpus_allowed)
        } else {
            format!("unpinned over CPUs {}", r.layout.cpus_allowed)
        },
        r.machine.cpus,
        r.machine.model
    )
}

fn row_label(r: &Record) -> String {
    format!("{} · {} ({})", report::title(r), r.system, r.transport)
}

/// The whole comparison as text (what the subcommand prints).
pub(crate) fn render(before: (&str, &Run), after: (&str, &Run), threshold: Option<f64>) -> String {
    let (bp, b) = before;
    let (ap, a) = after;
    let c = compare(b, a, threshold);
    let mut out = String::new();
    let mut say = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    say(run_line("BEFORE", bp, b));
    say(run_line("AFTER ", ap, a));
    // What makes the two runs' figures not comparable as they stand.
    let mut warn = Vec::new();
    if b.layout.placement != a.layout.placement {
        warn.push(format!(
            "placement differs ({} → {})",
            b.layout.placement, a.layout.placement
        ));
    }
    if (b.layout.pinned, &b.layout.cpus_allowed) != (a.layout.pinned, &a.layout.cpus_allowed) {
        warn.push("CPUs allowed / pinning differ".into());
    }
    if b.machine.model != a.machine.model || b.machine.cpus != a.machine.cpus {
        warn.push("machine differs".into());
    }
    if b.noisy || a.noisy {
        warn.push("a run is NOISY (load above 1.5 at start): compare the × raw ratios".into());
    }
    for w in warn {
        say(format!("warning: {w}"));
    }
    for (tag, r) in [("BEFORE", b), ("AFTER", a)] {
        if r.records
            .iter()
            .all(|x| Noise::of(&x.reps.median_us).is_none())
            && r.records
                .iter()
                .all(|x| Noise::of(&x.reps.calls_per_s).is_none())
        {
            say(format!(
                "note: {tag} keeps one figure per row (the median over its repetitions, no \
                 \"reps\"): its noise is not known"
            ));
        }
    }
    say(
        "each figure is the median over the run's repetitions; next to it, min–max of the \
         repetitions' own figures (n)"
            .into(),
    );
    say(match threshold {
        Some(p) => format!(
            "after/before is marked worse or better beyond ±{p}% (\"within noise\": the ranges overlap)"
        ),
        None => "no --threshold: nothing is marked".into(),
    });
    let header = format!(
        "  {} {} {} {} {} {} {}",
        pad("system", 12),
        pad("figure", 11),
        padl("before", 10),
        pad("min–max (n)", 26),
        padl("after", 10),
        pad("min–max (n)", 26),
        padl("after/before", 12),
    );
    let mut last: Option<&Record> = None;
    for row in &c.rows {
        if !last.is_some_and(|l| l.same_point(row.before)) {
            say(String::new());
            say(report::title(row.before));
            say(header.clone());
        }
        last = Some(row.before);
        for (i, l) in row.lines.iter().enumerate() {
            let mark = match l.mark {
                None => String::new(),
                Some(m) => format!(
                    "  {}{}",
                    if m == Mark::Worse { "WORSE" } else { "better" },
                    if l.within_noise() {
                        " (within noise)"
                    } else {
                        ""
                    }
                ),
            };
            say(format!(
                "  {} {} {} {} {} {} {}{mark}",
                pad(if i == 0 { row.before.system } else { "" }, 12),
                pad(l.fig.label(), 11),
                padl(&l.fig.fmt(l.before), 10),
                pad(&noise_cell(l.fig, l.before_noise), 26),
                padl(&l.fig.fmt(l.after), 10),
                pad(&noise_cell(l.fig, l.after_noise), 26),
                padl(&ratio_cell(l.ratio), 12),
            ));
        }
        // Failed or not applicable, on either side (a row with no figure still gets its name).
        let (nb, na) = (report::note(row.before), report::note(row.after));
        let name = if row.lines.is_empty() {
            row.before.system
        } else {
            ""
        };
        if !nb.is_empty() && nb == na {
            say(format!("  {}{nb}, in both", pad(name, 12)));
        } else {
            for (tag, n) in [("before", nb), ("after", na)] {
                if !n.is_empty() {
                    say(format!("  {} {tag}:{n}", pad(name, 12)));
                }
            }
        }
    }
    for (tag, path, rows) in [("BEFORE", bp, &c.only_before), ("AFTER", ap, &c.only_after)] {
        if !rows.is_empty() {
            say(String::new());
            say(format!("only in {tag} ({path}):"));
            for r in rows.iter() {
                say(format!("  {}", row_label(r)));
            }
        }
    }
    out
}

/// Reads a report. The names in a report are `&'static str` (see [`Run`]): the text is leaked,
/// once per file, for the life of this short process.
pub(crate) fn load(path: &str) -> Result<Run, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let text: &'static str = Box::leak(text.into_boxed_str());
    let run: Run = serde_json::from_str(text)
        .map_err(|e| format!("{path} is not a topspin-bench JSON report: {e}"))?;
    if run.version != 1 {
        eprintln!(
            "topspin-bench compare: {path} has report version {} (this build reads 1); comparing anyway",
            run.version
        );
    }
    Ok(run)
}

/// The subcommand. Returns the exit code.
pub(crate) fn main(args: &CompareArgs) -> i32 {
    let (bp, ap) = (&args.before, &args.after);
    let threshold = args.threshold;
    let (b, a) = match (load(bp), load(ap)) {
        (Ok(b), Ok(a)) => (b, a),
        (b, a) => {
            for e in [b.err(), a.err()].into_iter().flatten() {
                eprintln!("topspin-bench compare: {e}");
            }
            return 2;
        }
    };
    print!("{}", render((bp, &b), (ap, &a), threshold));
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Item;
    use topspin_bench_common::Outcome;

    const BEFORE: &str = include_str!("../testdata/compare-before.json");
    const AFTER: &str = include_str!("../testdata/compare-after.json");

    fn fixtures() -> (Run, Run) {
        (
            serde_json::from_str(BEFORE).expect("before fixture parses"),
            serde_json::from_str(AFTER).expect("after fixture parses"),
        )
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    fn row<'a>(c: &'a Comparison<'a>, workload: &str, system: &str) -> &'a Row<'a> {
        c.rows
            .iter()
            .find(|r| r.before.workload == workload && r.before.system == system)
            .expect("row")
    }

    fn line<'a>(r: &'a Row<'a>, fig: Fig) -> &'a Line {
        r.lines.iter().find(|l| l.fig == fig).expect("figure")
    }

    #[test]
    fn matched_rows_and_rows_in_one_file() {
        let (b, a) = fixtures();
        let c = compare(&b, &a, None);
        // echo: raw, topspin, tonic; throughput: raw, topspin, tonic, thrift; allocs: topspin.
        assert_eq!(c.rows.len(), 8);
        let only_b: Vec<_> = c
            .only_before
            .iter()
            .map(|r| (r.workload, r.system))
            .collect();
        let only_a: Vec<_> = c
            .only_after
            .iter()
            .map(|r| (r.workload, r.system))
            .collect();
        assert_eq!(only_b, [("echo", "tarpc")]);
        assert_eq!(only_a, [("echo", "capnp")]);
        // A point's key includes in-flight and call: throughput rows match their own point only.
        let tp = row(&c, "throughput", "topspin");
        assert_eq!((tp.after.connections, tp.after.in_flight), (1, 64));
        // Figures neither run has are left out (a throughput row has no latency).
        let figs: Vec<Fig> = tp.lines.iter().map(|l| l.fig).collect();
        assert_eq!(figs, [Fig::Cpu, Fig::CallsPerS, Fig::XRaw, Fig::XBestPeer]);
        // An unsupported row on both sides matches, with no figures.
        assert!(row(&c, "throughput", "thrift").lines.is_empty());
    }

    #[test]
    fn ratio_maths() {
        assert!(close(ratio(Some(11.2), Some(12.4)).unwrap(), 12.4 / 11.2));
        assert_eq!(ratio(Some(0.0), Some(0.0)), Some(1.0));
        assert_eq!(ratio(Some(0.0), Some(2.0)), Some(f64::INFINITY));
        assert_eq!(ratio(None, Some(2.0)), None);
        assert_eq!(ratio(Some(2.0), None), None);
        // Less is better for times, allocations and the × raw ratios; more for calls/s.
        assert_eq!(mark(Fig::Median, Some(1.06), Some(5.0)), Some(Mark::Worse));
        assert_eq!(mark(Fig::Median, Some(0.94), Some(5.0)), Some(Mark::Better));
        assert_eq!(mark(Fig::Median, Some(1.04), Some(5.0)), None);
        assert_eq!(
            mark(Fig::CallsPerS, Some(1.06), Some(5.0)),
            Some(Mark::Better)
        );
        assert_eq!(
            mark(Fig::CallsPerS, Some(0.90), Some(5.0)),
            Some(Mark::Worse)
        );
        assert_eq!(mark(Fig::XRaw, Some(1.5), None), None);

        let (b, a) = fixtures();
        let c = compare(&b, &a, Some(5.0));
        let t = row(&c, "echo", "topspin");
        let m = line(t, Fig::Median);
        assert_eq!((m.before, m.after), (Some(11.2), Some(12.4)));
        assert!(close(m.ratio.unwrap(), 12.4 / 11.2));
        assert_eq!(m.mark, Some(Mark::Worse));
        let x = line(t, Fig::XRaw);
        assert!(close(x.ratio.unwrap(), 1.1698 / 1.0667));
        let tp = line(row(&c, "throughput", "topspin"), Fig::CallsPerS);
        assert!(close(tp.ratio.unwrap(), 290000.0 / 250000.0));
        assert_eq!(tp.mark, Some(Mark::Better));
        let al = line(row(&c, "allocs", "topspin"), Fig::Allocs);
        assert!(close(al.ratio.unwrap(), 0.75));
        assert_eq!(al.mark, Some(Mark::Better));
        // The raw echo moved by less than 5 %: unmarked.
        assert_eq!(line(row(&c, "echo", "raw"), Fig::Median).mark, None);
    }

    #[test]
    fn noise_columns() {
        let (b, a) = fixtures();
        let c = compare(&b, &a, Some(5.0));
        let t = row(&c, "echo", "topspin");
        let m = line(t, Fig::Median);
        assert_eq!(
            m.before_noise,
            Some(Noise {
                min: 10.9,
                max: 11.6,
                n: 3
            })
        );
        assert_eq!(
            m.after_noise,
            Some(Noise {
                min: 12.1,
                max: 13.0,
                n: 3
            })
        );
        assert!(!m.within_noise()); // 10.9–11.6 against 12.1–13.0
        let p = line(t, Fig::P99);
        assert_eq!(p.mark, Some(Mark::Worse));
        assert!(p.within_noise()); // 15.1–17.3 against 16.5–19.9
                                   // The ratios to raw are taken on medians: no noise of their own.
        assert_eq!(line(t, Fig::XRaw).before_noise, None);

        let text = render(("before.json", &b), ("after.json", &a), Some(5.0));
        assert!(text.contains("10.90 µs–11.60 µs (3)"), "{text}");
        assert!(text.contains("285.0 k/s–296.0 k/s (3)"), "{text}");
        assert!(text.contains("WORSE (within noise)"), "{text}");
        assert!(
            text.contains("only in BEFORE (before.json):\n  echo 20 B · tarpc (tcp)"),
            "{text}"
        );
        assert!(
            text.contains("only in AFTER (after.json):\n  echo 20 B · capnp (tcp)"),
            "{text}"
        );
        assert!(
            text.contains(
                "  thrift        (not applicable: one call in flight per connection), in both"
            ),
            "{text}"
        );
        assert!(!text.contains("keeps one figure per row"), "{text}");
    }

    #[test]
    fn a_report_without_repetitions_says_so() {
        let mut v: serde_json::Value = serde_json::from_str(BEFORE).expect("json");
        for r in v["records"].as_array_mut().expect("records") {
            r.as_object_mut().expect("record").remove("reps");
        }
        let text: &'static str = Box::leak(v.to_string().into_boxed_str());
        let b: Run = serde_json::from_str(text).expect("an old report parses");
        let (_, a) = fixtures();
        let c = compare(&b, &a, None);
        let m = line(row(&c, "echo", "topspin"), Fig::Median);
        assert_eq!(m.before_noise, None);
        assert!(m.after_noise.is_some());
        assert_eq!(m.mark, None); // no --threshold
        let out = render(("old.json", &b), ("after.json", &a), None);
        assert!(
            out.contains("note: BEFORE keeps one figure per row"),
            "{out}"
        );
        assert!(!out.contains("note: AFTER"), "{out}");
    }

    #[test]
    fn what_the_benchmark_writes_reads_back() {
        let it = Item {
            workload: "echo",
            cmd: "echo",
            size: Some(20),
            connections: 1,
            in_flight: 1,
        };
        let o = |m: f64| Outcome {
            calls: 100,
            median_us: Some(m),
            p99_us: Some(m * 2.0),
            cpu_us_per_call: Some(m * 1.5),
            ..Outcome::default()
        };
        let mut records = vec![
            Record::aggregate(&it, "raw", "tcp", &[o(10.0), o(12.0), o(11.0)]),
            Record::aggregate(&it, "topspin", "tcp", &[o(11.0), o(13.0), o(f64::NAN)]),
        ];
        report::fill_ratios(&mut records);
        let run = Run {
            version: 1,
            started: report::rfc3339_now(),
            load_avg_start: f64::NAN, // written as null
            load_avg_end: 0.5,
            noisy: true,
            machine: report::machine(),
            layout: report::Layout::new(false, Vec::new()),
            records,
        };
        let text: &'static str = Box::leak(
            serde_json::to_string_pretty(&run)
                .expect("writes")
                .into_boxed_str(),
        );
        let back: Run = serde_json::from_str(text).expect("reads back");
        assert!(back.load_avg_start.is_nan());
        assert_eq!(back.records[0].median_us, Some(11.0));
        assert_eq!(back.records[0].reps.median_us, [10.0, 12.0, 11.0]);
        assert_eq!(back.records[1].reps.median_us, [11.0, 13.0]); // NaN left out
        assert_eq!(back.records[1].median_us, Some(12.0));
        let c = compare(&run, &back, None);
        assert_eq!(c.rows.len(), 2);
        assert!(c.only_before.is_empty() && c.only_after.is_empty());
        assert_eq!(line(&c.rows[1], Fig::XRaw).ratio, Some(1.0));
    }

    #[test]
    fn unreadable_files_exit_2() {
        let missing = "/nonexistent/topspin-bench-compare.json";
        assert!(load(missing).err().expect("fails").contains("cannot read"));
        let args = CompareArgs {
            before: missing.into(),
            after: missing.into(),
            threshold: None,
        };
        assert_eq!(super::main(&args), 2);
        let not_json = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
        assert!(load(not_json)
            .err()
            .expect("fails")
            .contains("not a topspin-bench JSON report"));
        // Usage errors are clap's: exit code 2 as well.
        use clap::Parser;
        let e = crate::Cli::try_parse_from(["topspin-bench", "compare", "only-one.json"])
            .expect_err("needs two reports");
        assert_eq!(e.exit_code(), 2);
    }
}
