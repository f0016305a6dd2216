//! `topspin-bench`: topspin against the raw-socket floor and tonic, tarpc, capnp-rpc and Thrift,
//! on the workloads of `docs/benchmarks.md` (method and JSON report there too). See README.md.
//!
//! The driver starts one peer process per system (each hosts that system's server and client,
//! built as its own Cargo package so features never unify across peers; with
//! `--separate-processes` the server moves to a child process of the peer), then, for every
//! workload, runs the systems one after another (A B C … A B C …, three times), each series
//! after a warm-up whose first call is checked for correct content. It prints one table per
//! workload and optionally writes JSON and PNG plots.

mod compare;
mod plots;
mod report;

use clap::{ArgAction, Parser};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use report::{Record, Run};
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use topspin_bench_common::{Cmd, Outcome};

/// A system under test: output name, peer binary, its arguments, transport.
#[derive(Clone, Debug)]
struct System {
    name: &'static str,
    bin: &'static str,
    args: &'static [&'static str],
    transport: &'static str,
}

impl System {
    /// The server side's threads and runtime flavour.
    fn server_threads(&self) -> &'static str {
        match self.name {
            "raw" | "raw-uds" | "raw-tls" | "raw-ws" | "thrift" => {
                "a blocking thread per connection"
            }
            "capnp" => "one thread, current-thread tokio + LocalSet",
            "grpc-go" => "grpc-go: goroutines on the Go runtime (GOMAXPROCS = allowed CPUs)",
            "grpc-go-server" | "topspin-grpc-client-go" => {
                "grpc-go, a process of its own: goroutines (GOMAXPROCS = allowed CPUs)"
            }
            _ => "tokio multi-thread, default workers (one per allowed CPU)",
        }
    }
    /// The client side's threads and runtime flavour.
    fn client_threads(&self) -> &'static str {
        match self.name {
            "raw" | "raw-uds" | "raw-tls" | "raw-ws" | "thrift" => "main thread, blocking calls",
            "capnp" => "main thread, current-thread tokio + LocalSet",
            "grpc-go" => "goroutines (a goroutine per lane in flight), GOMAXPROCS = allowed CPUs",
            _ => "main thread, current-thread tokio",
        }
    }
    /// Whether the server is always in a process of its own (grpc-go's, under a Rust client).
    fn server_elsewhere(&self) -> bool {
        matches!(self.name, "grpc-go-server" | "topspin-grpc-client-go")
    }
    /// Whether this system can put its server in a process of its own (the TLS and WebSocket
    /// peers make their certificate per process, so they keep both sides in one).
    fn can_separate(&self) -> bool {
        matches!(self.transport, "tcp" | "uds")
    }
}

const SYSTEMS: &[System] = &[
    System {
        name: "raw",
        bin: "topspin-bench-raw",
        args: &[],
        transport: "tcp",
    },
    System {
        name: "raw-uds",
        bin: "topspin-bench-raw",
        args: &["--uds"],
        transport: "uds",
    },
    System {
        name: "topspin",
        bin: "topspin-bench-topspin",
        args: &[],
        transport: "tcp",
    },
    System {
        name: "topspin-uds",
        bin: "topspin-bench-topspin",
        args: &["--uds"],
        transport: "uds",
    },
    System {
        name: "raw-shm",
        bin: "topspin-bench-raw",
        args: &["--shm"],
        transport: "shm",
    },
    System {
        name: "topspin-shm",
        bin: "topspin-bench-topspin",
        args: &["--shm"],
        transport: "shm",
    },
    System {
        name: "tonic",
        bin: "topspin-bench-tonic",
        args: &[],
        transport: "tcp",
    },
    System {
        name: "topspin-grpc",
        bin: "topspin-bench-topspin-grpc",
        args: &[],
        transport: "tcp",
    },
    System {
        name: "grpc-go-server",
        bin: "topspin-bench-tonic",
        args: &["--grpc-go-server"],
        transport: "tcp",
    },
    System {
        name: "topspin-grpc-client",
        bin: "topspin-bench-topspin-grpc",
        args: &["--server", "tonic", "--client", "topspin"],
        transport: "tcp",
    },
    System {
        name: "topspin-grpc-client-go",
        bin: "topspin-bench-topspin-grpc",
        args: &["--server", "grpc-go", "--client", "topspin"],
        transport: "tcp",
    },
    System {
        name: "grpc-go",
        bin: "topspin-bench-grpc-go",
        args: &[],
        transport: "tcp",
    },
    System {
        name: "raw-tls",
        bin: "topspin-bench-raw-layered",
        args: &["--tls"],
        transport: "tls",
    },
    System {
        name: "topspin-tls",
        bin: "topspin-bench-topspin-layered",
        args: &["--tls"],
        transport: "tls",
    },
    System {
        name: "tonic-tls",
        bin: "topspin-bench-tonic-tls",
        args: &[],
        transport: "tls",
    },
    System {
        name: "raw-ws",
        bin: "topspin-bench-raw-layered",
        args: &["--ws"],
        transport: "ws",
    },
    System {
        name: "topspin-ws",
        bin: "topspin-bench-topspin-layered",
        args: &["--ws"],
        transport: "ws",
    },
    System {
        name: "tarpc",
        bin: "topspin-bench-tarpc",
        args: &[],
        transport: "tcp",
    },
    System {
        name: "capnp",
        bin: "topspin-bench-capnp",
        args: &[],
        transport: "tcp",
    },
    System {
        name: "thrift",
        bin: "topspin-bench-thrift",
        args: &[],
        transport: "tcp",
    },
];

/// Rows that run in --smoke and, otherwise, only when named with --systems (the quick run's
/// time budget): the gRPC rows — `topspin-grpc` (topspin's gRPC face under tonic's client),
/// `grpc-go-server` (grpc-go's server under tonic's client), `topspin-grpc-client` and
/// `topspin-grpc-client-go` (topspin's grpc:// client calling tonic's and grpc-go's servers)
/// and `grpc-go` (grpc-go's client and server).
fn opt_in(s: &System) -> bool {
    matches!(
        s.name,
        "topspin-grpc"
            | "grpc-go-server"
            | "topspin-grpc-client"
            | "topspin-grpc-client-go"
            | "grpc-go"
    )
}

/// The frameworks a row's "× best peer" compares with.
pub(crate) const PEERS: &[&str] = &["tonic", "tarpc", "capnp", "thrift", "grpc-go"];

/// One point of a workload: what the driver asks every system to run.
#[derive(Clone, Debug)]
pub(crate) struct Item {
    /// Name in the JSON (`allocs` for both allocation series).
    pub(crate) workload: &'static str,
    /// Peer command (`allocs_echo`, `allocs_answer`, else = workload).
    pub(crate) cmd: &'static str,
    pub(crate) size: Option<u64>,
    pub(crate) connections: usize,
    pub(crate) in_flight: usize,
}

fn item(workload: &'static str, size: Option<u64>) -> Item {
    Item {
        workload,
        cmd: workload,
        size,
        connections: 1,
        in_flight: 1,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Smoke,
    Quick,
    Full,
}

fn plan(mode: Mode) -> Vec<Item> {
    let mut v = Vec::new();
    let echo: &[u64] = match mode {
        Mode::Quick => &[20, 20000, 2000000],
        _ => &[20, 200, 2000, 20000, 200000, 2000000, 16777216],
    };
    for &n in echo {
        v.push(item("echo", Some(n)));
    }
    v.push(item("answer", None));
    let blobs: Vec<u64> = match mode {
        Mode::Quick => vec![1 << 20],
        Mode::Smoke => vec![1 << 10, 1 << 20, 16 << 20],
        Mode::Full => (10..=24).map(|p| 1u64 << p).collect(),
    };
    for n in blobs {
        v.push(item("blob", Some(n)));
    }
    v.push(item("structs", None));
    if mode != Mode::Quick {
        v.push(item("nymph_uint32", None));
        v.push(item("nymph_double", None));
        for n in [1, 5, 10, 100, 1000, 10000] {
            v.push(item("nymph_array", Some(n)));
        }
        for n in [1, 10, 100, 1000, 10000, 100000, 200000, 500000, 1000000] {
            v.push(item("nymph_blob", Some(n)));
        }
    }
    let tp: &[(usize, usize)] = match mode {
        Mode::Quick => &[(1, 64)],
        _ => &[(1, 1), (1, 16), (1, 64), (1, 256), (4, 16), (4, 64)],
    };
    for &(c, p) in tp {
        v.push(Item {
            workload: "throughput",
            cmd: "throughput",
            size: Some(20),
            connections: c,
            in_flight: p,
        });
    }
    v.push(Item {
        workload: "burst",
        cmd: "burst",
        size: Some(20),
        connections: 1,
        in_flight: 8,
    });
    v.push(Item {
        workload: "allocs",
        cmd: "allocs_echo",
        size: Some(20),
        connections: 1,
        in_flight: 1,
    });
    v.push(Item {
        workload: "allocs",
        cmd: "allocs_answer",
        size: None,
        connections: 1,
        in_flight: 1,
    });
    v
}

fn command(mode: Mode, it: &Item) -> Cmd {
    let (warmup, warmup_ms, iters, max_ms) = match mode {
        Mode::Smoke => (2, 0, 5, 200),
        Mode::Quick => (2000, 40, 200_000, 150),
        Mode::Full => (5000, 100, 1_000_000, 400),
    };
    let big = it.size.unwrap_or(0) >= 1 << 20 || it.workload == "structs";
    Cmd {
        workload: it.cmd.to_string(),
        size: it.size.unwrap_or(0),
        connections: it.connections,
        in_flight: it.in_flight,
        warmup,
        // Big calls take milliseconds: give their warm-up a few of them.
        warmup_ms: if big && mode != Mode::Smoke {
            warmup_ms.max(60)
        } else {
            warmup_ms
        },
        iters,
        max_ms: if big && mode == Mode::Full {
            max_ms * 2
        } else {
            max_ms
        },
    }
}

/// The background load of `--loaded`: one busy thread per CPU this process may use, at
/// normal priority (a machine shared with other work), stopped after the last measurement.
struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start() -> Load {
        use std::sync::atomic::{AtomicBool, Ordering};
        let n = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..10_000 {
                            x = std::hint::black_box(
                                x.wrapping_mul(6364136223846793005).wrapping_add(1),
                            );
                        }
                    }
                })
            })
            .collect();
        Load { stop, threads }
    }

    /// Stops the threads; returns how many there were.
    fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let n = self.threads.len();
        for t in self.threads {
            let _ = t.join();
        }
        n
    }
}

/// A running peer process.
struct Peer {
    sys: System,
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Peer {
    fn start(sys: &System, bin_dir: &Path, separate: bool) -> Result<Peer, String> {
        let path = bin_dir.join(sys.bin);
        if !path.exists() {
            return Err(format!(
                "{} not found (build it: scripts/bench.sh builds every peer)",
                path.display()
            ));
        }
        let mut child = Command::new(&path)
            .args(sys.args)
            .args(if separate && sys.can_separate() {
                &[topspin_bench_common::placement::SEPARATE][..]
            } else {
                &[][..]
            })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", path.display()))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut p = Peer {
            sys: sys.clone(),
            child,
            stdin,
            lines: rx,
        };
        match p.lines.recv_timeout(Duration::from_secs(60)) {
            Ok(l) if l.starts_with("ready") => Ok(p),
            Ok(l) => {
                p.stop();
                Err(format!("{}: unexpected first line {l:?}", sys.name))
            }
            Err(_) => {
                p.stop();
                Err(format!("{}: did not start within 60 s", sys.name))
            }
        }
    }

    fn run(&mut self, cmd: &Cmd) -> Outcome {
        let line = serde_json::to_string(cmd).expect("command serialises");
        if writeln!(self.stdin, "{line}")
            .and_then(|_| self.stdin.flush())
            .is_err()
        {
            return Outcome::failed(format!("{}: peer process is gone", self.sys.name));
        }
        // Bounded: the series' own bounds plus generous slack for one very slow call.
        let limit = Duration::from_millis(cmd.warmup_ms + cmd.max_ms * 3) + Duration::from_secs(60);
        match self.lines.recv_timeout(limit) {
            Ok(l) => serde_json::from_str(&l)
                .unwrap_or_else(|e| Outcome::failed(format!("bad reply {l:?}: {e}"))),
            Err(_) => Outcome::failed(format!("{}: no reply within {:?}", self.sys.name, limit)),
        }
    }

    fn stop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// topspin against the raw-socket floor and tonic, tarpc, capnp-rpc and Thrift, on the
/// workloads of docs/benchmarks.md: one table per workload, optionally a JSON report and PNG
/// plots. Without --quick or --smoke it is the full run: every workload and size (~12 min).
#[derive(Parser, Debug)]
#[command(
    name = "topspin-bench",
    args_override_self = true,
    disable_help_subcommand = true,
    after_help = SYSTEMS_HELP,
    override_usage = USAGE
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    /// Echo 20/20000/2000000, answer, blob 1 MiB, structs, throughput (1,64), burst, allocs;
    /// every system; under 90 s
    #[arg(long, overrides_with_all = ["smoke", "full"])]
    quick: bool,
    /// Every workload, few calls, one repetition: checks every system returns correct data;
    /// exits non-zero on any failure; asserts no timings (CI)
    #[arg(long, overrides_with_all = ["quick", "full"])]
    smoke: bool,
    /// The full run (the default): every workload and size of docs/benchmarks.md (~12 min)
    #[arg(long, overrides_with_all = ["quick", "smoke"])]
    full: bool,
    /// Writes the JSON report (schema: docs/benchmarks.md) to FILE
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draws PNG plots into DIR
    #[arg(long, value_name = "DIR")]
    plots: Option<PathBuf>,
    /// Only these systems, comma-separated (see the list below)
    #[arg(long, value_name = "raw,topspin,...", value_delimiter = ',', action = ArgAction::Set)]
    systems: Option<Vec<String>>,
    /// Only these workloads (or peer commands such as allocs_echo), comma-separated
    #[arg(long, value_name = "echo,answer,...", value_delimiter = ',', action = ArgAction::Set)]
    workloads: Option<Vec<String>>,
    /// Repetitions of every series (default: 3; 1 with --smoke)
    #[arg(long, value_name = "N")]
    reps: Option<usize>,
    /// Where the peer binaries are (default: this program's directory)
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
    /// Instructions per call of topspin's echo 20 B (one at a time, and 64 in flight), answer
    /// and structs (client + server), from two valgrind runs of different lengths (needs
    /// valgrind)
    #[arg(long)]
    callgrind: bool,
    /// Syscalls and write syscalls per call (echo 20 B; burst of 8) of every system, counted
    /// with strace -f -c (needs strace)
    #[arg(long)]
    syscalls: bool,
    /// Every system's server in a process of its own (a child of its peer process), its client
    /// in the peer process, over loopback TCP / a Unix socket — how services run (default:
    /// client and server of a system share one process). TLS and WebSocket rows keep one
    /// process. CPU and allocations per call stay client + server
    #[arg(long)]
    separate_processes: bool,
    /// A reproducible background load: one busy thread per allowed CPU, at normal priority,
    /// started by the benchmark and running through every measurement (the same for every
    /// system); its tables say LOADED
    #[arg(long)]
    loaded: bool,
}

#[derive(clap::Subcommand, Debug)]
enum Sub {
    /// Two --json reports row by row: each figure before, after, after/before and each run's
    /// spread over its repetitions
    ///
    /// Prints, for every row (system at a point) of both reports, each figure before and after,
    /// after ÷ before, and each run's spread over its repetitions (min–max (n)). Rows in one
    /// report only are listed. Exits 0, or 2 when a report cannot be read.
    #[command(long_flag = "compare")]
    Compare(compare::CompareArgs),
}

struct Args {
    mode: Mode,
    json: Option<PathBuf>,
    plots: Option<PathBuf>,
    systems: Option<Vec<String>>,
    workloads: Option<Vec<String>>,
    reps: Option<usize>,
    bin_dir: PathBuf,
    callgrind: bool,
    syscalls: bool,
    separate: bool,
    loaded: bool,
}

impl From<Cli> for Args {
    fn from(c: Cli) -> Args {
        Args {
            mode: if c.smoke {
                Mode::Smoke
            } else if c.quick {
                Mode::Quick
            } else {
                Mode::Full
            },
            json: c.json,
            plots: c.plots,
            systems: c.systems,
            workloads: c.workloads,
            reps: c.reps,
            bin_dir: c.bin_dir.unwrap_or_else(|| {
                std::env::current_exe()
                    .ok()
                    .and_then(|p| p.parent().map(Path::to_path_buf))
                    .unwrap_or_else(|| PathBuf::from("."))
            }),
            callgrind: c.callgrind,
            syscalls: c.syscalls,
            separate: c.separate_processes,
            loaded: c.loaded,
        }
    }
}

const USAGE: &str = "topspin-bench [--quick | --smoke] [--json FILE] [--plots DIR]
                     [--systems raw,topspin,...] [--workloads echo,answer,...] [--reps N]
                     [--separate-processes] [--loaded] [--bin-dir DIR]
       topspin-bench --callgrind [--bin-dir DIR]
       topspin-bench --syscalls [--systems ...] [--bin-dir DIR]
       topspin-bench compare BEFORE.json AFTER.json [--threshold PCT]";

const SYSTEMS_HELP: &str = "\
Systems: raw raw-uds topspin topspin-uds tonic tarpc capnp thrift
         raw-tls topspin-tls tonic-tls raw-ws topspin-ws raw-shm topspin-shm
         topspin-grpc grpc-go-server topspin-grpc-client topspin-grpc-client-go grpc-go
         (TLS, WebSocket, shared memory and the gRPC rows — servers under tonic's client:
         tonic, topspin-grpc, grpc-go-server; clients against tonic's server: tonic,
         topspin-grpc-client; against grpc-go's: grpc-go, topspin-grpc-client-go — run in
         --smoke, otherwise only when named with --systems)";

fn load_avg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(f64::NAN)
}

fn main() {
    let mut cli = Cli::parse();
    if let Some(Sub::Compare(c)) = cli.command.take() {
        std::process::exit(compare::main(&c));
    }
    let args = Args::from(cli);
    if args.callgrind {
        std::process::exit(callgrind(&args.bin_dir));
    }
    if args.syscalls {
        std::process::exit(syscalls(&args));
    }
    let t_start = Instant::now();
    let started = report::rfc3339_now();
    let load_start = load_avg();
    // The TLS, WebSocket, shared-memory and gRPC-face rows run in --smoke and when named
    // with --systems (they would take the quick run past its time budget).
    let layered = |s: &System| matches!(s.transport, "tls" | "ws" | "shm") || opt_in(s);
    let systems: Vec<System> = SYSTEMS
        .iter()
        .filter(|s| match &args.systems {
            Some(l) => l.iter().any(|n| n == s.name),
            None => args.mode == Mode::Smoke || !layered(s),
        })
        .cloned()
        .collect();
    let items: Vec<Item> = plan(args.mode)
        .into_iter()
        .filter(|i| {
            args.workloads
                .as_ref()
                .is_none_or(|l| l.iter().any(|n| n == i.workload || n == i.cmd))
        })
        .collect();
    let reps = args
        .reps
        .unwrap_or(if args.mode == Mode::Smoke { 1 } else { 3 });

    eprintln!(
        "topspin-bench: {:?} run, {} systems × {} series × {} repetitions; load average {:.2}",
        args.mode,
        systems.len(),
        items.len(),
        reps,
        load_start
    );
    let mut peers = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    for s in &systems {
        match Peer::start(s, &args.bin_dir, args.separate) {
            Ok(p) => peers.push(p),
            Err(e) => {
                eprintln!("topspin-bench: skipping {}: {e}", s.name);
                failures.push(e);
            }
        }
    }

    // Let the peers' start-up (random data, connections) settle before the first series.
    if args.mode != Mode::Smoke {
        std::thread::sleep(Duration::from_millis(500));
    }
    let load = args.loaded.then(Load::start);
    let mut records: Vec<Record> = Vec::new();
    // On a terminal, a bar (series of how many, which one, ETA); otherwise (CI logs) a dot per
    // series as before.
    let n_peers = peers.len();
    let bar = progress((items.len() * reps * n_peers) as u64, "series");
    for (n, it) in items.iter().enumerate() {
        let cmd = command(args.mode, it);
        let mut outs: Vec<Vec<Outcome>> = vec![Vec::new(); peers.len()];
        for rep in 0..reps {
            for (i, p) in peers.iter_mut().enumerate() {
                bar.set_message(format!(
                    "{} ({}/{}) · {} ({}/{n_peers}){}",
                    series_name(it),
                    n + 1,
                    items.len(),
                    p.sys.name,
                    i + 1,
                    if reps > 1 {
                        format!(" · rep {}/{reps}", rep + 1)
                    } else {
                        String::new()
                    },
                ));
                outs[i].push(p.run(&cmd));
                bar.inc(1);
            }
        }
        for (p, o) in peers.iter().zip(outs) {
            let r = Record::aggregate(it, p.sys.name, p.sys.transport, &o);
            if let Some(e) = &r.error {
                let msg = format!("{} {} size {:?}: {e}", p.sys.name, it.cmd, it.size);
                bar.suspend(|| eprintln!("topspin-bench: FAILED {msg}"));
                failures.push(msg);
            }
            records.push(r);
        }
        if bar.is_hidden() {
            eprint!(".");
            let _ = std::io::stderr().flush();
        }
    }
    if bar.is_hidden() {
        eprintln!();
    }
    bar.finish_and_clear();
    let load_threads = load.map_or(0, Load::stop);
    for p in &mut peers {
        p.stop();
    }
    let load_end = load_avg();
    report::fill_ratios(&mut records);
    let layout = report::Layout::new(
        args.separate,
        peers
            .iter()
            .map(|p| report::SystemLayout {
                system: p.sys.name,
                separate_processes: (args.separate && p.sys.can_separate())
                    || p.sys.server_elsewhere(),
                server: p.sys.server_threads(),
                client: p.sys.client_threads(),
            })
            .collect(),
    );
    let mut layout = layout;
    layout.load_threads = load_threads;
    let run = Run {
        version: 1,
        started,
        load_avg_start: load_start,
        load_avg_end: load_end,
        noisy: load_start.is_nan() || load_start > 1.5,
        machine: report::machine(),
        layout,
        records,
    };
    let smoke = args.mode == Mode::Smoke;
    report::print_tables(&run, smoke);
    println!(
        "load average {:.2} at start, {:.2} at end{}; {} s",
        run.load_avg_start,
        run.load_avg_end,
        if run.noisy {
            " — NOISY: the load at start was above 1.5, compare ratios only"
        } else {
            ""
        },
        t_start.elapsed().as_secs()
    );
    if let Some(f) = &args.json {
        match std::fs::write(f, serde_json::to_string_pretty(&run).expect("serialises")) {
            Ok(()) => println!("wrote {}", f.display()),
            Err(e) => {
                eprintln!("topspin-bench: writing {}: {e}", f.display());
                failures.push(e.to_string());
            }
        }
    }
    if let Some(d) = &args.plots {
        match plots::draw(&run, d) {
            Ok(files) => {
                for f in files {
                    println!("wrote {}", f.display());
                }
            }
            Err(e) => {
                eprintln!("topspin-bench: plots: {e}");
                failures.push(format!("plots: {e}"));
            }
        }
    }
    if !failures.is_empty() {
        eprintln!("topspin-bench: {} failure(s):", failures.len());
        for f in &failures {
            eprintln!("  {f}");
        }
        std::process::exit(1);
    }
    if smoke {
        println!("smoke: every system returned correct data for every workload");
    }
}

/// A progress bar over `total` steps on stderr, drawn only when stderr is a terminal (hidden,
/// so drawing nothing, in CI logs and when stderr is redirected).
fn progress(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(&format!(
        "{{bar:20}} {{pos}}/{{len}} {what} · ETA {{eta}} · {{wide_msg}}"
    ))
    .expect("valid template");
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(500));
    bar
}

/// A series as the progress bar names it: `echo 20 B`, `throughput 4×64`, `answer`.
fn series_name(it: &Item) -> String {
    match (it.workload, it.size) {
        ("throughput", _) => format!("throughput {}×{}", it.connections, it.in_flight),
        ("burst", _) => format!("burst of {}", it.in_flight),
        (w, Some(n)) if w.starts_with("nymph_array") => format!("{w} {n}"),
        (_, Some(n)) if it.cmd != "allocs_answer" => format!("{} {n} B", it.cmd),
        _ => it.cmd.to_string(),
    }
}

/// Instructions per call of topspin's hot path under callgrind: (Ir(N2) − Ir(N1)) / (N2 − N1)
/// cancels start-up, connection set-up and warm-up.
fn callgrind(bin_dir: &Path) -> i32 {
    let bin = bin_dir.join("topspin-bench-topspin");
    if !bin.exists() {
        eprintln!("{} not found; build it first", bin.display());
        return 1;
    }
    let dir = std::env::temp_dir().join(format!("topspin-callgrind-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let runs = [
        ("echo", "tcp", 1),
        ("answer", "tcp", 1),
        ("echo", "uds", 1),
        ("echo", "tcp", 64),
        ("structs", "tcp", 1),
    ];
    let bar = progress(runs.len() as u64 * 6, "valgrind runs");
    for (workload, transport, inflight) in runs {
        // A structs call is ~50 M instructions: fewer calls (after 5 warm-up calls).
        let (n1, n2) = if workload == "structs" {
            (10u64, 30u64)
        } else {
            (1000u64, 6000u64)
        };
        // Three pairs of runs; the median pair is reported (an occasional run takes a different
        // scheduling path under valgrind's serialised threads and lands a few % off).
        let mut per_call = Vec::new();
        let mut last = None;
        for rep in 0..3 {
            let mut irs = Vec::new();
            for n in [n1, n2] {
                let out = dir.join(format!("{workload}-{transport}-x{inflight}-{n}-{rep}.out"));
                bar.set_message(format!(
                    "{workload} {transport} ×{inflight} · {n} calls · pair {}/3",
                    rep + 1
                ));
                let mut c = Command::new("valgrind");
                c.arg("--tool=callgrind")
                    .arg(format!("--callgrind-out-file={}", out.display()))
                    .arg(&bin)
                    .args(["--callgrind", &n.to_string(), "--workload", workload])
                    .args(["--inflight", &inflight.to_string()]);
                if transport == "uds" {
                    c.arg("--uds");
                }
                let status = c.stdout(Stdio::null()).stderr(Stdio::null()).status();
                bar.inc(1);
                match status {
                    Ok(s) if s.success() => {}
                    other => {
                        bar.finish_and_clear();
                        eprintln!("valgrind failed: {other:?} (is valgrind installed?)");
                        return 1;
                    }
                }
                let total = std::fs::read_to_string(&out).ok().and_then(|s| {
                    s.lines()
                        .find_map(|l| {
                            l.strip_prefix("totals: ")
                                .or_else(|| l.strip_prefix("summary: "))
                        })
                        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                });
                match total {
                    Some(t) => irs.push(t),
                    None => {
                        bar.finish_and_clear();
                        eprintln!("no instruction total in {}", out.display());
                        return 1;
                    }
                }
                last = Some(out);
            }
            per_call.push((irs[1] as f64 - irs[0] as f64) / (n2 - n1) as f64);
        }
        let all = per_call.clone();
        per_call.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
        bar.suspend(|| {
            println!(
            "topspin {workload} {}{transport}{}: {:.0} instructions per call (client + server; \
             median of 3: {}); profile: {}",
            if workload == "echo" { "20 B " } else { "" },
            if inflight > 1 {
                format!(", {inflight} in flight")
            } else {
                String::new()
            },
            per_call[1],
            all.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
            last.map(|p| p.display().to_string()).unwrap_or_default()
        )
        });
    }
    bar.finish_and_clear();
    println!("inspect a profile with: callgrind_annotate --inclusive=yes <file> | head -60");
    0
}

/// Syscalls per call from `strace -f -c`: a run of N2 calls minus a run of N1 calls, so start-up
/// and connection set-up cancel.
fn syscalls(args: &Args) -> i32 {
    let dir = std::env::temp_dir().join(format!("topspin-strace-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let (n1, n2) = (10u32, 2010u32);
    println!(
        "syscalls per call, client + server (strace -f -c; {} − {} calls)",
        n2, n1
    );
    let systems: Vec<&System> = SYSTEMS
        .iter()
        .filter(|s| match &args.systems {
            Some(l) => l.iter().any(|n| n == s.name),
            None => !matches!(s.transport, "tls" | "ws" | "shm") && !opt_in(s),
        })
        .collect();
    let w = systems
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0)
        .max(12);
    println!(
        "  {:<w$} {:>16} {:>16} {:>16}   echo: top syscalls",
        "system", "echo 20 B: all", "echo: writes", "burst: writes"
    );
    let bar = progress(systems.len() as u64 * 4, "strace runs");
    for (i, sys) in systems.iter().enumerate() {
        let mut cols: Vec<String> = Vec::new();
        let mut top = String::new();
        for workload in ["echo", "burst"] {
            let mut counts = Vec::new();
            for n in [n1, n2] {
                bar.set_message(format!(
                    "{} ({}/{}) · {workload} · {n} calls",
                    sys.name,
                    i + 1,
                    systems.len()
                ));
                let out = dir.join(format!("{}-{workload}-{n}.txt", sys.name));
                let cmd = Cmd {
                    workload: workload.into(),
                    size: 20,
                    connections: 1,
                    in_flight: 1,
                    warmup: 1,
                    warmup_ms: 0,
                    iters: n,
                    max_ms: 600_000,
                };
                let child = Command::new("strace")
                    .args(["-f", "-c", "-o"])
                    .arg(&out)
                    .arg(args.bin_dir.join(sys.bin))
                    .args(sys.args)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn();
                let Ok(mut child) = child else {
                    bar.finish_and_clear();
                    eprintln!("could not run strace (is it installed?)");
                    return 1;
                };
                let mut stdin = child.stdin.take().expect("stdin");
                let _ = writeln!(stdin, "{}", serde_json::to_string(&cmd).expect("cmd"));
                let _ = writeln!(stdin, "quit");
                drop(stdin);
                let mut reply = String::new();
                if let Some(o) = child.stdout.take() {
                    for l in BufReader::new(o).lines().map_while(Result::ok) {
                        if l.starts_with('{') {
                            reply = l;
                        }
                    }
                }
                let _ = child.wait();
                bar.inc(1);
                let o: Outcome = serde_json::from_str(&reply).unwrap_or_default();
                counts.push((strace_counts(&out), o.unsupported));
            }
            let calls = (n2 - n1) as f64 * if workload == "burst" { 8.0 } else { 1.0 };
            if counts.iter().any(|c| c.1) {
                cols.push("—".into());
                continue;
            }
            let per = |k: &str| {
                (counts[1].0.get(k).copied().unwrap_or(0) as f64
                    - counts[0].0.get(k).copied().unwrap_or(0) as f64)
                    / calls
            };
            let mut names: Vec<&String> = counts[1].0.keys().collect();
            names.sort();
            names.dedup();
            let writes: f64 = ["write", "writev", "sendto", "sendmsg", "pwrite64"]
                .iter()
                .map(|k| per(k))
                .sum();
            if workload == "echo" {
                let mut all: Vec<(f64, &String)> = names.iter().map(|k| (per(k), *k)).collect();
                all.sort_by(|a, b| b.0.partial_cmp(&a.0).expect("finite"));
                let total: f64 = all.iter().map(|x| x.0).sum();
                cols.push(format!("{total:.2}"));
                top = all
                    .iter()
                    .filter(|x| x.0 >= 0.05)
                    .map(|(v, k)| format!("{k} {v:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ");
            }
            cols.push(format!("{writes:.2}"));
        }
        while cols.len() < 3 {
            cols.push("—".into());
        }
        bar.suspend(|| {
            println!(
                "  {:<w$} {:>16} {:>16} {:>16}   {}",
                sys.name, cols[0], cols[1], cols[2], top
            )
        });
    }
    bar.finish_and_clear();
    0
}

/// Calls per syscall name from an `strace -c` summary.
fn strace_counts(path: &Path) -> std::collections::HashMap<String, u64> {
    let mut m = std::collections::HashMap::new();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() >= 5 && f[0].chars().next().is_some_and(|c| c.is_ascii_digit()) {
            let name = f[f.len() - 1];
            if name == "total" {
                continue;
            }
            if let Ok(c) = f[3].parse::<u64>() {
                m.insert(name.to_string(), c);
            }
        }
    }
    m
}

#[cfg(test)]
mod cli_tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Args {
        let cli = Cli::try_parse_from(std::iter::once("topspin-bench").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert!(cli.command.is_none());
        Args::from(cli)
    }

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// The forms scripts/bench.sh, scripts/test.sh, CI and the README use.
    #[test]
    fn every_option_keeps_its_spelling() {
        assert_eq!(parse(&[]).mode, Mode::Full);
        assert_eq!(parse(&["--full"]).mode, Mode::Full);
        let a = parse(&[
            "--quick",
            "--json",
            "out/quick.json",
            "--plots",
            "out",
            "--systems",
            "raw,topspin,tarpc",
            "--workloads",
            "echo,allocs_echo",
            "--reps",
            "2",
            "--bin-dir",
            "/x",
            "--separate-processes",
            "--loaded",
        ]);
        assert_eq!(a.mode, Mode::Quick);
        assert_eq!(a.json, Some(PathBuf::from("out/quick.json")));
        assert_eq!(a.plots, Some(PathBuf::from("out")));
        assert_eq!(
            a.systems,
            Some(vec!["raw".into(), "topspin".into(), "tarpc".into()])
        );
        assert_eq!(a.workloads, Some(vec!["echo".into(), "allocs_echo".into()]));
        assert_eq!(a.reps, Some(2));
        assert_eq!(a.bin_dir, PathBuf::from("/x"));
        assert!(a.separate && a.loaded && !a.callgrind && !a.syscalls);
        let a = parse(&["--smoke", "--systems", "raw"]);
        assert_eq!(a.mode, Mode::Smoke);
        assert!(parse(&["--callgrind"]).callgrind);
        assert!(parse(&["--syscalls", "--systems", "raw"]).syscalls);
    }

    /// As the hand-written parser had it: the last of the modes and of a repeated option wins.
    #[test]
    fn the_last_one_wins() {
        assert_eq!(parse(&["--quick", "--smoke"]).mode, Mode::Smoke);
        assert_eq!(parse(&["--smoke", "--quick"]).mode, Mode::Quick);
        assert_eq!(parse(&["--smoke", "--full"]).mode, Mode::Full);
        let a = parse(&[
            "--systems",
            "raw,tonic",
            "--systems",
            "topspin",
            "--reps",
            "1",
            "--reps",
            "4",
        ]);
        assert_eq!(a.systems, Some(vec!["topspin".into()]));
        assert_eq!(a.reps, Some(4));
    }

    #[test]
    fn compare_and_its_flag_form() {
        for first in ["compare", "--compare"] {
            let cli = Cli::try_parse_from([
                "topspin-bench",
                first,
                "b.json",
                "a.json",
                "--threshold",
                "5%",
            ])
            .unwrap_or_else(|e| panic!("{first}: {e}"));
            let Some(Sub::Compare(c)) = cli.command else {
                panic!("{first}: no compare");
            };
            assert_eq!((c.before.as_str(), c.after.as_str()), ("b.json", "a.json"));
            assert_eq!(c.threshold, Some(5.0));
        }
        for bad in [
            &["compare", "b.json", "a.json", "--threshold", "-1"][..],
            &["compare", "b.json", "a.json", "--threshold", "x"],
            &["compare", "b.json"],
            &["--reps", "many"],
            &["--quik"],
        ] {
            let e =
                Cli::try_parse_from(std::iter::once("topspin-bench").chain(bad.iter().copied()))
                    .expect_err("rejected");
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }
}
