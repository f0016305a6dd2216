//! PNG charts with plotters: latency against payload size (log-log, one line per system),
//! throughput bars, allocation bars. Text needs a TrueType font: DejaVu Sans or Liberation Sans
//! from the system (Debian's fonts-dejavu-core), or the file named by `TOPSPIN_BENCH_FONT`.

use crate::report::{size_label, Record, Run};
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::{Path, PathBuf};

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
];

fn load_font() -> Result<(), String> {
    let mut paths: Vec<String> = std::env::var("TOPSPIN_BENCH_FONT").into_iter().collect();
    paths.extend(FONT_PATHS.iter().map(|s| s.to_string()));
    for p in &paths {
        if let Ok(bytes) = std::fs::read(p) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Ok(());
            }
        }
    }
    Err(format!(
        "no TrueType font found (tried {}); install fonts-dejavu-core or set TOPSPIN_BENCH_FONT",
        paths.join(", ")
    ))
}

fn color(system: &str) -> RGBColor {
    match system {
        "raw" => RGBColor(90, 90, 90),
        "raw-uds" => RGBColor(170, 170, 170),
        "topspin" => RGBColor(214, 39, 40),
        "topspin-uds" => RGBColor(255, 127, 14),
        "tonic" => RGBColor(31, 119, 180),
        "tarpc" => RGBColor(44, 160, 44),
        "capnp" => RGBColor(148, 103, 189),
        "thrift" => RGBColor(140, 86, 75),
        "raw-tls" => RGBColor(120, 120, 60),
        "topspin-tls" => RGBColor(227, 119, 194),
        "tonic-tls" => RGBColor(23, 190, 207),
        "raw-ws" => RGBColor(60, 120, 120),
        "topspin-ws" => RGBColor(188, 189, 34),
        "topspin-grpc" => RGBColor(255, 152, 150),
        "topspin-grpc-client" => RGBColor(196, 156, 148),
        "topspin-grpc-client-go" => RGBColor(247, 182, 210),
        "grpc-go" => RGBColor(0, 173, 216),
        "grpc-go-server" => RGBColor(158, 218, 229),
        "raw-shm" => RGBColor(200, 200, 120),
        "topspin-shm" => RGBColor(255, 187, 120),
        _ => RGBColor(0, 0, 0),
    }
}

fn systems_in(run: &Run) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Vec::new();
    for r in &run.records {
        if !v.contains(&r.system) {
            v.push(r.system);
        }
    }
    v
}

type E = Box<dyn std::error::Error>;

/// Draws every chart the run has data for; returns the files written.
pub(crate) fn draw(run: &Run, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    load_font()?;
    let mut files = Vec::new();
    for (w, name) in [
        ("echo", "latency_echo.png"),
        ("blob", "latency_blob.png"),
        ("nymph_blob", "latency_nymph_blob.png"),
        ("nymph_array", "latency_nymph_array.png"),
    ] {
        let pts = run
            .records
            .iter()
            .filter(|r| r.workload == w && r.median_us.is_some() && r.size.is_some())
            .count();
        if pts == 0 {
            continue;
        }
        let f = dir.join(name);
        latency(run, w, &f).map_err(|e| format!("{}: {e}", f.display()))?;
        files.push(f);
    }
    if run.records.iter().any(|r| r.workload == "throughput") {
        let f = dir.join("throughput.png");
        throughput(run, &f).map_err(|e| format!("{}: {e}", f.display()))?;
        files.push(f);
    }
    if run.records.iter().any(|r| r.workload == "allocs") {
        let f = dir.join("allocs.png");
        allocs(run, &f).map_err(|e| format!("{}: {e}", f.display()))?;
        files.push(f);
    }
    Ok(files)
}

fn latency(run: &Run, workload: &str, file: &Path) -> Result<(), E> {
    let recs: Vec<&Record> = run
        .records
        .iter()
        .filter(|r| r.workload == workload && r.median_us.is_some() && r.size.is_some())
        .collect();
    let xs = recs.iter().map(|r| r.size.unwrap_or(1).max(1) as f64);
    let (xmin, xmax) = xs.fold((f64::MAX, 0f64), |(a, b), x| (a.min(x), b.max(x)));
    let ys = recs.iter().filter_map(|r| r.median_us);
    let (ymin, ymax) = ys.fold((f64::MAX, 0f64), |(a, b), y| (a.min(y), b.max(y)));
    let root = BitMapBackend::new(file, (1100, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let what = if workload == "nymph_array" {
        "elements (uint32)"
    } else {
        "payload bytes"
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{workload}: median latency per call vs {what} (log-log){}",
                if run.noisy { " — noisy run" } else { "" }
            ),
            ("sans-serif", 24),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (xmin * 0.8..xmax * 1.25).log_scale(),
            (ymin * 0.8..ymax * 1.25).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc(what)
        .y_desc("µs per call (median)")
        .x_label_formatter(&|x| size_label(x.round() as u64))
        .y_label_formatter(&|y| {
            if *y >= 1000.0 {
                format!("{:.0} ms", y / 1000.0)
            } else {
                format!("{y:.0} µs")
            }
        })
        .label_style(("sans-serif", 15))
        .draw()?;
    for sys in systems_in(run) {
        let mut pts: Vec<(f64, f64)> = recs
            .iter()
            .filter(|r| r.system == sys)
            .filter_map(|r| Some((r.size? as f64, r.median_us?)))
            .collect();
        if pts.is_empty() {
            continue;
        }
        pts.sort_by(|a, b| a.0.partial_cmp(&b.0).expect("finite"));
        let c = color(sys);
        let style =
            ShapeStyle::from(c).stroke_width(if sys.starts_with("topspin") { 3 } else { 2 });
        chart
            .draw_series(LineSeries::new(pts.clone(), style))?
            .label(sys)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, c.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()?;
    root.present()?;
    Ok(())
}

/// Grouped bars: one group per x label, one bar per system.
fn bars(
    file: &Path,
    caption: &str,
    y_desc: &str,
    groups: &[String],
    systems: &[&'static str],
    value: &dyn Fn(usize, &str) -> Option<f64>,
    legend: SeriesLabelPosition,
) -> Result<(), E> {
    let mut ymax: f64 = 0.0;
    for g in 0..groups.len() {
        for s in systems {
            if let Some(v) = value(g, s) {
                ymax = ymax.max(v);
            }
        }
    }
    let ymax = if ymax > 0.0 { ymax * 1.15 } else { 1.0 };
    let root = BitMapBackend::new(file, (1100, 650)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = groups.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..n, 0.0..ymax)?;
    let labels = groups.to_vec();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 && i < labels.len() {
                labels[i].clone()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .y_label_formatter(&|y| {
            if *y >= 1e6 {
                format!("{:.1} M", y / 1e6)
            } else if *y >= 1e3 {
                format!("{:.0} k", y / 1e3)
            } else {
                format!("{y:.0}")
            }
        })
        .label_style(("sans-serif", 15))
        .draw()?;
    let w = 0.8 / systems.len().max(1) as f64;
    for (si, s) in systems.iter().enumerate() {
        let c = color(s);
        let rects: Vec<_> = (0..groups.len())
            .filter_map(|g| {
                let v = value(g, s)?;
                let x0 = g as f64 + 0.1 + si as f64 * w;
                Some(Rectangle::new([(x0, 0.0), (x0 + w * 0.9, v)], c.filled()))
            })
            .collect();
        chart
            .draw_series(rects)?
            .label(*s)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
    }
    chart
        .configure_series_labels()
        .position(legend)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()?;
    root.present()?;
    Ok(())
}

fn throughput(run: &Run, file: &Path) -> Result<(), E> {
    let recs: Vec<&Record> = run
        .records
        .iter()
        .filter(|r| r.workload == "throughput")
        .collect();
    let mut cfgs: Vec<(usize, usize)> = Vec::new();
    for r in &recs {
        if !cfgs.contains(&(r.connections, r.in_flight)) {
            cfgs.push((r.connections, r.in_flight));
        }
    }
    let groups: Vec<String> = cfgs
        .iter()
        .map(|(c, p)| format!("{c} conn × {p} in flight"))
        .collect();
    let systems = systems_in(run);
    bars(
        file,
        &format!(
            "throughput: 20 B echo calls per second{}",
            if run.noisy { " — noisy run" } else { "" }
        ),
        "calls/s",
        &groups,
        &systems,
        &|g, s| {
            recs.iter()
                .find(|r| r.system == s && (r.connections, r.in_flight) == cfgs[g])
                .and_then(|r| r.calls_per_s)
        },
        SeriesLabelPosition::UpperRight,
    )
}

fn allocs(run: &Run, file: &Path) -> Result<(), E> {
    let recs: Vec<&Record> = run
        .records
        .iter()
        .filter(|r| r.workload == "allocs")
        .collect();
    let calls = ["echo", "answer"];
    let groups: Vec<String> = vec![
        "echo 20 B: allocations per call".into(),
        "answer: allocations per call".into(),
    ];
    let systems = systems_in(run);
    bars(
        file,
        "heap allocations per call, client + server (counting allocator)",
        "allocations per call",
        &groups,
        &systems,
        &|g, s| {
            recs.iter()
                .find(|r| r.system == s && r.call == Some(calls[g]))
                .and_then(|r| r.allocs_per_call)
        },
        SeriesLabelPosition::UpperLeft,
    )
}
