//! Endpoint scaling: a balanced topspin channel over 1, 2 and 4 servers, calls per second.
//!
//! ```sh
//! cargo build --release -p topspin-bench --bin topspin-bench-endpoints
//! sudo target/release/topspin-bench-endpoints            # servers in network namespaces
//! target/release/topspin-bench-endpoints --loopback      # servers on loopback ports
//! ```
//!
//! As root (and where `ip netns` works) every server runs in a network namespace of its own
//! and the client in another, joined by veth pairs (10.78.K.1 ↔ 10.78.K.2, prefix `tsb`,
//! removed at the start and the end); otherwise — or with `--loopback` — the servers are
//! processes on separate loopback ports. Each server is its own process (this binary again,
//! `serve ADDRESS`); the client (`drive …`) balances over them with the default policy (least
//! loaded of two random choices) and keeps `--inflight` unary calls in flight for `--secs`.
//!
//! Two workloads:
//! - `echo`: 64-byte echo, as fast as the servers answer (CPU-bound: on a 2-core machine
//!   client and servers share two cores, so this shows the balancer's overhead more than
//!   scaling);
//! - `capacity`: each server takes at most 16 calls at once, each 2 ms (a backend with a fixed
//!   capacity, as real services have): what more endpoints buy.

use bytes::Bytes;
use clap::Parser;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use topspin::codec::RawCodec;
use topspin::{Endpoint, Request, Response, Server};

const ECHO: &str = "/bench.Endpoints/Echo";
const WORK: &str = "/bench.Endpoints/Work";
const PREFIX: &str = "tsb";
const COUNTS: [usize; 3] = [1, 2, 4];
/// The points measured: endpoints, connections per endpoint. One endpoint with four
/// connections tells what comes from more connections rather than more servers.
const POINTS: [(usize, usize); 4] = [(1, 1), (1, 4), (2, 1), (4, 1)];

/// Endpoint scaling: a balanced topspin channel over 1, 2 and 4 servers, calls per second
/// (an echo workload and a fixed-capacity one). As root (where `ip netns` works) every server
/// runs in a network namespace of its own, otherwise on loopback ports.
#[derive(Parser, Debug)]
#[command(name = env!("CARGO_BIN_NAME"))]
struct Cli {
    #[command(subcommand)]
    role: Option<Role>,
    /// Servers on loopback ports even as root (no network namespaces)
    #[arg(long)]
    loopback: bool,
    /// Seconds per point
    #[arg(long, value_name = "S", default_value_t = 3.0)]
    secs: f64,
    /// Unary calls the client keeps in flight
    #[arg(long, value_name = "N", default_value_t = 128)]
    inflight: usize,
}

/// The processes this program starts of itself.
#[derive(clap::Subcommand, Debug)]
enum Role {
    /// One server on ADDRESS (started by this program): `Echo` answers at once, `Work` takes
    /// 2 ms, at most 16 at a time; prints `LISTENING ADDRESS`
    Serve { address: String },
    /// The client (started by this program): balances over ADDRESS… and prints
    /// `RATE <calls/s>`
    Drive {
        /// echo, or anything else for the fixed-capacity work
        workload: String,
        secs: f64,
        inflight: usize,
        /// Connections per endpoint
        connections: usize,
        #[arg(required = true)]
        addresses: Vec<String>,
    },
}

fn main() {
    let cli = Cli::parse();
    match cli.role {
        Some(Role::Serve { address }) => return serve(&address),
        Some(Role::Drive {
            workload,
            secs,
            inflight,
            connections,
            addresses,
        }) => return drive(&workload, secs, inflight, connections, addresses),
        None => {}
    }
    let (secs, inflight) = (cli.secs, cli.inflight);
    let netns = !cli.loopback && netns_usable();
    cleanup();
    let result = std::panic::catch_unwind(|| run(netns, secs, inflight));
    cleanup();
    if let Ok(Err(e)) | Err(e) = result.map_err(|_| "panic".to_owned()) {
        eprintln!("topspin-bench-endpoints: {e}");
        std::process::exit(1);
    }
}

fn run(netns: bool, secs: f64, inflight: usize) -> Result<(), String> {
    let layout = if netns {
        "each server in a network namespace of its own, the client in another (veth pairs)"
    } else {
        "servers on separate loopback ports (no network namespaces here)"
    };
    println!("endpoint scaling: {layout}; {inflight} calls in flight, {secs} s per point");
    if netns {
        setup()?;
    }
    let mut servers: Vec<Child> = Vec::new();
    let mut addresses = Vec::new();
    for k in 1..=*COUNTS.last().unwrap_or(&4) {
        let mut cmd = if netns {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &format!("{PREFIX}-s{k}")])
                .arg(exe()?);
            c.args(["serve", &format!("tcp://10.78.{k}.2:50051")]);
            c
        } else {
            let mut c = Command::new(exe()?);
            c.args(["serve", "tcp://127.0.0.1:0"]);
            c
        };
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        servers.push(child);
        let addr = line
            .trim()
            .strip_prefix("LISTENING ")
            .unwrap_or("")
            .to_owned();
        if addr.is_empty() {
            return Err(format!("server {k} did not start"));
        }
        addresses.push(addr);
    }
    let mut rows = Vec::new();
    for workload in ["echo", "capacity"] {
        for (n, conns) in POINTS {
            let mut cmd = if netns {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &format!("{PREFIX}-c")])
                    .arg(exe()?);
                c
            } else {
                Command::new(exe()?)
            };
            cmd.args(["drive", workload, &secs.to_string(), &inflight.to_string()]);
            cmd.arg(conns.to_string());
            cmd.args(&addresses[..n]);
            let out = cmd.output().map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout);
            let rate: f64 = text
                .trim()
                .strip_prefix("RATE ")
                .and_then(|r| r.parse().ok())
                .ok_or_else(|| {
                    format!(
                        "driver failed: {text} {}",
                        String::from_utf8_lossy(&out.stderr)
                    )
                })?;
            rows.push((workload, n, conns, rate));
        }
    }
    for mut s in servers {
        let _ = s.kill();
        let _ = s.wait();
    }
    println!("\n| workload | endpoints | connections each | calls/s | vs 1 endpoint |");
    println!("|---|---:|---:|---:|---:|");
    for (w, n, c, rate) in &rows {
        let one = rows
            .iter()
            .find(|(w1, n1, c1, _)| w1 == w && *n1 == 1 && *c1 == 1)
            .map_or(1.0, |r| r.3);
        println!("| {w} | {n} | {c} | {rate:.0} | {:.2}× |", rate / one);
    }
    Ok(())
}

fn exe() -> Result<std::path::PathBuf, String> {
    std::env::current_exe().map_err(|e| e.to_string())
}

fn quiet(cmd: &[&str]) -> bool {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn must(cmd: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            cmd.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn netns_usable() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let probe = format!("{PREFIX}-probe");
    let ok = root && quiet(&["ip", "netns", "add", &probe]);
    let _ = quiet(&["ip", "netns", "del", &probe]);
    ok
}

/// Removes our namespaces (prefix `tsb-`), killing what runs in them first.
fn cleanup() {
    let Ok(list) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&list.stdout).lines() {
        let Some(ns) = line.split_whitespace().next() else {
            continue;
        };
        if !ns.starts_with(&format!("{PREFIX}-")) {
            continue;
        }
        if let Ok(o) = Command::new("ip").args(["netns", "pids", ns]).output() {
            for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let _ = quiet(&["kill", "-9", pid]);
            }
        }
        let _ = quiet(&["ip", "netns", "del", ns]);
    }
}

fn setup() -> Result<(), String> {
    let client = format!("{PREFIX}-c");
    must(&["ip", "netns", "add", &client])?;
    must(&[
        "ip", "netns", "exec", &client, "ip", "link", "set", "lo", "up",
    ])?;
    for k in 1..=4 {
        let ns = format!("{PREFIX}-s{k}");
        let (h, n) = (format!("{PREFIX}{k}h"), format!("{PREFIX}{k}n"));
        must(&["ip", "netns", "add", &ns])?;
        must(&[
            "ip", "link", "add", &h, "netns", &client, "type", "veth", "peer", "name", &n, "netns",
            &ns,
        ])?;
        let a = format!("10.78.{k}.1/24");
        let b = format!("10.78.{k}.2/24");
        must(&[
            "ip", "netns", "exec", &client, "ip", "addr", "add", &a, "dev", &h,
        ])?;
        must(&[
            "ip", "netns", "exec", &client, "ip", "link", "set", &h, "up",
        ])?;
        must(&[
            "ip", "netns", "exec", &ns, "ip", "addr", "add", &b, "dev", &n,
        ])?;
        must(&["ip", "netns", "exec", &ns, "ip", "link", "set", &n, "up"])?;
        must(&["ip", "netns", "exec", &ns, "ip", "link", "set", "lo", "up"])?;
    }
    Ok(())
}

/// A server: `Echo` answers at once; `Work` takes 2 ms, at most 16 at a time.
fn serve(address: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let permits = Arc::new(tokio::sync::Semaphore::new(16));
        let server = Server::builder()
            .unary(ECHO, RawCodec, |req: Request<Bytes>| async move {
                Ok(Response::new(req.into_inner()))
            })
            .unary(WORK, RawCodec, move |req: Request<Bytes>| {
                let permits = permits.clone();
                async move {
                    let _p = permits.acquire().await;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    Ok(Response::new(req.into_inner()))
                }
            })
            .bind(address)
            .await
            .expect("bind");
        println!("LISTENING {}", server.local_addr());
        server.serve().await;
    });
}

/// The client: `drive WORKLOAD SECS INFLIGHT CONNECTIONS ADDRESS…`; prints `RATE <calls/s>`.
fn drive(workload: &str, secs: f64, inflight: usize, connections: usize, addresses: Vec<String>) {
    let method = if workload == "echo" { ECHO } else { WORK };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async move {
        let channel = Endpoint::balanced(addresses)
            .expect("addresses")
            .connections(connections)
            .connect()
            .await
            .expect("connect");
        let stop = Arc::new(AtomicBool::new(false));
        let counting = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let payload = Bytes::from(vec![7u8; 64]);
        let mut tasks = Vec::new();
        for _ in 0..inflight {
            let (ch, stop, counting, done, payload) = (
                channel.clone(),
                stop.clone(),
                counting.clone(),
                done.clone(),
                payload.clone(),
            );
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let r = ch
                        .unary(RawCodec, method, Request::new(payload.clone()))
                        .await;
                    if r.is_ok() && counting.load(Ordering::Relaxed) {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await; // warm-up
        counting.store(true, Ordering::Relaxed);
        let start = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        let n = done.load(Ordering::Relaxed);
        let elapsed = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
        println!("RATE {:.0}", n as f64 / elapsed);
    });
}
