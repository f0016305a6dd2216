//! The fault test of balanced channels across network namespaces (run as root; see README.md).
//!
//! `netns-faults` (the orchestrator, in the root namespace) builds the network, starts four
//! `netns-server` replicas in namespaces of their own and a client (`netns-faults client`, this
//! binary again) in a fifth namespace, then drives the phases: it tells the client a phase
//! begins, injects the fault, waits, and reads the client's numbers for the phase. At the end
//! it checks every call against the servers' execution logs and prints the table.
//!
//! ```text
//!   namespace tsn-c (client)                        namespace tsn-sK (K = 1..4)
//!   tsnKh 10.77.K.1/24  <──── veth pair ────>  tsnKn 10.77.K.2/24   netns-server sK :50051
//!   tsn3h also 10.77.3.3: the fault proxy ──> 10.77.3.2:50051
//!   /etc/netns/tsn-c/hosts: svc.topspin.test -> 10.77.1.2 10.77.2.2 10.77.3.3 10.77.4.2
//! ```
//!
//! The root namespace's network is not touched: every link lives between the namespaces the
//! test creates (prefix `tsn`), and they are removed at the start (leftovers) and at the end,
//! also on failure. The whole run is bounded (a watchdog ends it after 150 s).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PREFIX: &str = "tsn";
const CLIENT_NS: &str = "tsn-c";
const SERVERS: usize = 4;
const NAME: &str = "svc.topspin.test";
const PORT: u16 = 50051;
/// Replica 3 is reached through the fault proxy.
const PROXIED: usize = 3;

/// The fault test of balanced channels across network namespaces (run as root): builds the
/// network, starts four netns-server replicas and a client, injects the faults, checks every
/// call against the servers' logs. Prints SKIP (exit 0) where namespaces cannot be used, unless
/// TOPSPIN_REQUIRE_NETNS is set.
#[derive(clap::Parser, Debug)]
#[command(name = "netns-faults")]
struct Args {
    #[command(subcommand)]
    role: Option<Role>,
}

#[derive(clap::Subcommand, Debug)]
enum Role {
    /// The client, in its namespace (started by the orchestrator): takes the phases on stdin
    Client {
        /// The run's directory
        dir: std::path::PathBuf,
    },
}

fn main() {
    let args: Args = clap::Parser::parse();
    if let Some(Role::Client { dir }) = args.role {
        return client::main(dir);
    }
    if let Some(why) = unavailable() {
        println!("SKIP netns fault test: {why}");
        if std::env::var_os("TOPSPIN_REQUIRE_NETNS").is_some() {
            std::process::exit(1);
        }
        return;
    }
    let dir = std::env::temp_dir().join(format!("{PREFIX}-run-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    cleanup();
    let watchdog_dir = dir.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(150));
        eprintln!("netns fault test: over its 150 s bound; cleaning up");
        cleanup();
        let _ = std::fs::remove_dir_all(&watchdog_dir);
        std::process::exit(1);
    });
    let outcome = std::panic::catch_unwind(|| orchestrate(&dir));
    cleanup();
    let _ = std::fs::remove_dir_all(&dir);
    match outcome {
        Ok(Ok(())) => println!("netns fault test: passed"),
        Ok(Err(e)) => {
            eprintln!("netns fault test FAILED: {e}");
            std::process::exit(1);
        }
        Err(_) => {
            eprintln!("netns fault test FAILED (panic)");
            std::process::exit(1);
        }
    }
}

/// Why namespaces cannot be used here, if they cannot.
fn unavailable() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not running as root (network namespaces need CAP_SYS_ADMIN)".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("the `ip` command (iproute2) is missing".into());
    }
    let probe = format!("{PREFIX}-probe");
    let _ = quiet(&["ip", "netns", "del", &probe]);
    if !quiet(&["ip", "netns", "add", &probe]) {
        return Some(
            "`ip netns add` fails (no namespace support in this kernel or sandbox)".into(),
        );
    }
    let _ = quiet(&["ip", "netns", "del", &probe]);
    None
}

fn quiet(cmd: &[&str]) -> bool {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn run(cmd: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .map_err(|e| format!("{}: {e}", cmd.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            cmd.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

fn in_ns(ns: &str, cmd: &[&str]) -> Result<(), String> {
    let mut full = vec!["ip", "netns", "exec", ns];
    full.extend_from_slice(cmd);
    run(&full)
}

/// Removes every namespace of ours (killing the processes inside first) and their hosts files.
fn cleanup() {
    let list = Command::new("ip").args(["netns", "list"]).output();
    let list = list
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for line in list.lines() {
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
    if let Ok(entries) = std::fs::read_dir("/etc/netns") {
        for e in entries.flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{PREFIX}-"))
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

fn server_ns(k: usize) -> String {
    format!("{PREFIX}-s{k}")
}

fn hosts(present: &[usize]) -> String {
    let mut s = String::from("127.0.0.1 localhost\n");
    for &k in present {
        let ip = if k == PROXIED {
            format!("10.77.{k}.3")
        } else {
            format!("10.77.{k}.2")
        };
        s.push_str(&format!("{ip} {NAME}\n"));
    }
    s
}

/// Rewrites the client namespace's hosts file in place (the same inode, which `ip netns exec`
/// bind-mounted over the client's /etc/hosts).
fn write_hosts(present: &[usize]) -> Result<(), String> {
    let path = format!("/etc/netns/{CLIENT_NS}/hosts");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| format!("{path}: {e}"))?;
    f.write_all(hosts(present).as_bytes())
        .map_err(|e| format!("{path}: {e}"))
}

fn setup() -> Result<(), String> {
    run(&["ip", "netns", "add", CLIENT_NS])?;
    in_ns(CLIENT_NS, &["ip", "link", "set", "lo", "up"])?;
    for k in 1..=SERVERS {
        let ns = server_ns(k);
        let (h, n) = (format!("{PREFIX}{k}h"), format!("{PREFIX}{k}n"));
        run(&["ip", "netns", "add", &ns])?;
        run(&[
            "ip", "link", "add", &h, "netns", CLIENT_NS, "type", "veth", "peer", "name", &n,
            "netns", &ns,
        ])?;
        in_ns(
            CLIENT_NS,
            &["ip", "addr", "add", &format!("10.77.{k}.1/24"), "dev", &h],
        )?;
        in_ns(CLIENT_NS, &["ip", "link", "set", &h, "up"])?;
        in_ns(
            &ns,
            &["ip", "addr", "add", &format!("10.77.{k}.2/24"), "dev", &n],
        )?;
        in_ns(&ns, &["ip", "link", "set", &n, "up"])?;
        in_ns(&ns, &["ip", "link", "set", "lo", "up"])?;
    }
    // The proxy's own address, on the client's side of replica 3's link.
    let h3 = format!("{PREFIX}{PROXIED}h");
    in_ns(
        CLIENT_NS,
        &[
            "ip",
            "addr",
            "add",
            &format!("10.77.{PROXIED}.3/24"),
            "dev",
            &h3,
        ],
    )?;
    std::fs::create_dir_all(format!("/etc/netns/{CLIENT_NS}")).map_err(|e| e.to_string())?;
    write_hosts(&(1..=SERVERS).collect::<Vec<_>>())
}

fn exe() -> Result<std::path::PathBuf, String> {
    std::env::current_exe().map_err(|e| e.to_string())
}

fn start_server(k: usize, dir: &std::path::Path) -> Result<Child, String> {
    let bin = exe()?.with_file_name("netns-server");
    let log = dir.join(format!("s{k}.log"));
    Command::new("ip")
        .args(["netns", "exec", &server_ns(k)])
        .arg(&bin)
        .args(["--listen", &format!("tcp://10.77.{k}.2:{PORT}")])
        .args(["--name", &format!("s{k}"), "--log"])
        .arg(&log)
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("start {}: {e}", bin.display()))
}

/// The client process and the line protocol to it.
struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Client {
    fn ask(&mut self, cmd: &str) -> Result<String, String> {
        writeln!(self.stdin, "{cmd}").map_err(|e| format!("client stdin: {e}"))?;
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(|e| format!("client stdout: {e}"))?;
        if line.is_empty() {
            return Err(format!("the client ended (after {cmd:?})"));
        }
        Ok(line.trim().to_owned())
    }
}

/// A phase's numbers, as the client reports them.
#[derive(Debug, Default)]
struct Phase {
    name: String,
    ok: u64,
    failed: u64,
    retried: u64,
    failover_ms: Option<u64>,
    per_server: BTreeMap<String, u64>,
}

fn parse_phase(line: &str) -> Result<Phase, String> {
    let mut p = Phase::default();
    let mut words = line.split_whitespace();
    if words.next() != Some("PHASE") {
        return Err(format!("unexpected client answer {line:?}"));
    }
    p.name = words.next().unwrap_or("?").to_owned();
    for w in words {
        let Some((k, v)) = w.split_once('=') else {
            continue;
        };
        match k {
            "ok" => p.ok = v.parse().unwrap_or(0),
            "failed" => p.failed = v.parse().unwrap_or(0),
            "retried" => p.retried = v.parse().unwrap_or(0),
            "failover_ms" => p.failover_ms = v.parse().ok(),
            "per" => {
                for kv in v.split(',').filter(|s| !s.is_empty()) {
                    if let Some((s, n)) = kv.split_once(':') {
                        p.per_server.insert(s.to_owned(), n.parse().unwrap_or(0));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(p)
}

fn orchestrate(dir: &std::path::Path) -> Result<(), String> {
    let started = Instant::now();
    setup()?;
    let mut servers: HashMap<usize, Child> = HashMap::new();
    for k in 1..=SERVERS {
        servers.insert(k, start_server(k, dir)?);
    }
    let mut child = Command::new("ip")
        .args(["netns", "exec", CLIENT_NS])
        .arg(exe()?)
        .arg("client")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("start the client: {e}"))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("the client's pipes".into());
    };
    let mut client = Client {
        child,
        stdin,
        stdout: BufReader::new(stdout),
    };
    let ready = client.ask("ready")?;
    if ready != "READY" {
        return Err(format!("the client did not start: {ready}"));
    }
    let signal = |k: usize, servers: &HashMap<usize, Child>, sig: &str| -> Result<(), String> {
        let pid = servers.get(&k).ok_or("no such server")?.id().to_string();
        run(&["kill", sig, &pid])
    };
    // The server's end of the link: the client's end keeps its carrier-less route, so
    // packets vanish silently (a cable pulled on the far side), and only keep-alive notices.
    let link = |k: usize, state: &str| {
        in_ns(
            &server_ns(k),
            &["ip", "link", "set", &format!("{PREFIX}{k}n"), state],
        )
    };
    let mut phases: Vec<Phase> = Vec::new();
    let mut begin = |client: &mut Client, name: &str| -> Result<(), String> {
        let line = client.ask(&format!("phase {name}"))?;
        if line.starts_with("PHASE") {
            phases.push(parse_phase(&line)?);
        }
        Ok(())
    };
    let wait = |secs: f64| std::thread::sleep(Duration::from_secs_f64(secs));

    begin(&mut client, "baseline")?;
    wait(3.0);
    begin(&mut client, "s1-not-serving")?;
    signal(1, &servers, "-USR1")?;
    wait(3.0);
    begin(&mut client, "s1-serving")?;
    signal(1, &servers, "-USR2")?;
    wait(2.5);
    begin(&mut client, "s2-link-down")?;
    link(2, "down")?;
    wait(4.0);
    begin(&mut client, "s2-link-up")?;
    link(2, "up")?;
    wait(3.5);
    begin(&mut client, "s4-killed")?;
    signal(4, &servers, "-KILL")?;
    if let Some(mut c) = servers.remove(&4) {
        let _ = c.wait();
    }
    wait(3.0);
    begin(&mut client, "s4-restarted")?;
    servers.insert(4, start_server(4, dir)?);
    wait(3.5);
    begin(&mut client, "s3-delay-loss")?;
    client.ask("proxy 20 0.05")?;
    wait(4.0);
    begin(&mut client, "s4-ns-removed")?;
    client.ask("proxy 0 0")?;
    if let Some(mut c) = servers.remove(&4) {
        let _ = c.kill();
        let _ = c.wait();
    }
    run(&["ip", "netns", "del", &server_ns(4)])?;
    write_hosts(&[1, 2, 3])?;
    wait(4.0);
    let endpoints = client.ask("endpoints")?;
    begin(&mut client, "steady")?;
    wait(3.0);
    begin(&mut client, "end")?;
    let summary = client.ask("stop")?;
    let _ = client.child.wait();
    for (_, mut c) in servers {
        let _ = c.kill();
        let _ = c.wait();
    }

    let verdict = check(dir, &phases, &endpoints);
    print_table(&phases);
    println!("client: {summary}");
    println!("endpoints after s4's namespace was removed: {endpoints}");
    println!("run time: {:.1} s", started.elapsed().as_secs_f64());
    verdict
}

fn print_table(phases: &[Phase]) {
    println!();
    println!("| phase | calls ok | failed | sent again (unprocessed) | failover | ok per server |");
    println!("|---|---:|---:|---:|---:|---|");
    for p in phases {
        let per: Vec<String> = p
            .per_server
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect();
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            p.name,
            p.ok,
            p.failed,
            p.retried,
            p.failover_ms.map_or("-".into(), |ms| format!("{ms} ms")),
            per.join(", ")
        );
    }
    println!();
}

/// The servers' logs against the client's records: no call ran twice, every call answered OK
/// ran exactly once, no attempt reported unprocessed ran at all; and the phases without a
/// fault lost nothing.
fn check(dir: &std::path::Path, phases: &[Phase], endpoints: &str) -> Result<(), String> {
    let mut runs: HashMap<String, u32> = HashMap::new();
    for k in 1..=SERVERS {
        let log = std::fs::read_to_string(dir.join(format!("s{k}.log"))).unwrap_or_default();
        for line in log.lines() {
            *runs.entry(line.to_owned()).or_default() += 1;
        }
    }
    let records = std::fs::read_to_string(dir.join("client.txt"))
        .map_err(|e| format!("the client's records: {e}"))?;
    let mut errors = Vec::new();
    let mut per_call: HashMap<&str, u32> = HashMap::new();
    let mut calls = 0;
    for line in records.lines() {
        // "<id>.<attempt> ok|unprocessed|failed"
        let mut w = line.split_whitespace();
        let (Some(attempt), Some(outcome)) = (w.next(), w.next()) else {
            continue;
        };
        let n = runs.get(attempt).copied().unwrap_or(0);
        let id = attempt.split('.').next().unwrap_or(attempt);
        *per_call.entry(id).or_default() += n;
        calls += 1;
        match outcome {
            "ok" if n != 1 => errors.push(format!("{attempt} answered OK but ran {n} times")),
            "unprocessed" if n != 0 => {
                errors.push(format!("{attempt} reported unprocessed but ran {n} times"))
            }
            "failed" if n > 1 => errors.push(format!("{attempt} failed and ran {n} times")),
            _ => {}
        }
    }
    for (id, n) in &per_call {
        if *n > 1 {
            errors.push(format!("call {id} ran {n} times"));
        }
    }
    if calls < 1000 {
        errors.push(format!("only {calls} attempts recorded: no real load"));
    }
    for p in phases {
        let calm = matches!(
            p.name.as_str(),
            "baseline" | "s1-serving" | "s4-restarted" | "s3-delay-loss" | "steady"
        );
        if calm && p.failed > 0 {
            errors.push(format!("{} calls failed in phase {}", p.failed, p.name));
        }
        if p.ok + p.failed > 0 && p.failed * 5 > p.ok + p.failed {
            errors.push(format!(
                "phase {}: {} of {} failed",
                p.name,
                p.failed,
                p.ok + p.failed
            ));
        }
        if p.name == "s1-not-serving" {
            let s1 = p.per_server.get("s1").copied().unwrap_or(0);
            if s1 * 10 > p.ok {
                errors.push(format!("s1 was not serving but got {s1} of {} calls", p.ok));
            }
        }
        if p.name == "s2-link-up" && p.per_server.get("s2").copied().unwrap_or(0) == 0 {
            errors.push("s2 got no call after its link came back".into());
        }
        if p.name == "s4-restarted" && p.per_server.get("s4").copied().unwrap_or(0) == 0 {
            errors.push("s4 got no call after its restart".into());
        }
    }
    if endpoints.contains("10.77.4.2") {
        errors.push(format!(
            "s4's namespace is gone but the channel still has it: {endpoints}"
        ));
    }
    if errors.is_empty() {
        println!(
            "checked {calls} attempts against the servers' logs: none lost that the policy \
             forbids, none ran twice"
        );
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// The client: balances over `dns:///svc.topspin.test:50051` under bounded load and answers
/// the orchestrator's commands on stdin.
mod client {
    use super::*;
    use bytes::Bytes;
    use topspin::codec::RawCodec;
    use topspin::resolve::DnsResolver;
    use topspin::{Balancing, Config, Endpoint, Request};

    /// Concurrent callers (each one call at a time).
    const WORKERS: usize = 16;

    #[derive(Default)]
    struct Stats {
        phase: String,
        since: Option<Instant>,
        ok: u64,
        failed: u64,
        retried: u64,
        last_failed_start: Option<Instant>,
        per_server: BTreeMap<String, u64>,
        records: Vec<String>,
    }

    impl Stats {
        fn line(&self) -> String {
            let failover = match (self.since, self.last_failed_start) {
                (Some(s), Some(f)) => format!(
                    " failover_ms={}",
                    f.saturating_duration_since(s).as_millis()
                ),
                _ => String::new(),
            };
            let per: Vec<String> = self
                .per_server
                .iter()
                .map(|(s, n)| format!("{s}:{n}"))
                .collect();
            format!(
                "PHASE {} ok={} failed={} retried={}{failover} per={}",
                self.phase,
                self.ok,
                self.failed,
                self.retried,
                per.join(",")
            )
        }
    }

    pub(super) fn main(dir: std::path::PathBuf) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| {
                eprintln!("runtime: {e}");
                std::process::exit(1)
            });
        rt.block_on(run(dir));
    }

    async fn run(dir: std::path::PathBuf) {
        let proxy = Arc::new(Proxy::default());
        tokio::spawn(proxy.clone().serve());
        let resolver = DnsResolver::new(format!("{NAME}:{PORT}"))
            .interval(Duration::from_secs(2))
            .min_interval(Duration::from_millis(200));
        let config = Config::default()
            .with_keepalive_interval(Some(Duration::from_millis(250)))
            .with_keepalive_timeout(Duration::from_secs(1))
            .with_handshake_timeout(Duration::from_secs(1));
        let channel = Endpoint::with_resolver(resolver)
            .config(config)
            .backoff(Duration::from_millis(50), Duration::from_millis(500))
            .balancing(Balancing::default().health_check(""))
            .connect_lazy();
        let stats = Arc::new(Mutex::new(Stats::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicU64::new(0));
        let mut workers = Vec::new();
        let mut lines = BufReader::new(std::io::stdin()).lines();
        let mut out = std::io::stdout();
        let reply = |out: &mut std::io::Stdout, s: &str| {
            let _ = writeln!(out, "{s}");
            let _ = out.flush();
        };
        loop {
            let line = tokio::task::block_in_place(|| lines.next());
            let Some(Ok(line)) = line else { break };
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["ready"] => {
                    // Bounded load: WORKERS callers, until "stop".
                    for _ in 0..WORKERS {
                        let (ch, st, stop, next) =
                            (channel.clone(), stats.clone(), stop.clone(), next.clone());
                        workers.push(tokio::spawn(worker(ch, st, stop, next)));
                    }
                    reply(&mut out, "READY");
                }
                ["phase", name] => {
                    let mut st = stats.lock().unwrap_or_else(|e| e.into_inner());
                    let done = st.line();
                    let had = st.since.is_some();
                    let records = std::mem::take(&mut st.records);
                    *st = Stats {
                        phase: (*name).to_owned(),
                        since: Some(Instant::now()),
                        records,
                        ..Stats::default()
                    };
                    drop(st);
                    reply(&mut out, if had { &done } else { "STARTED" });
                }
                ["proxy", delay, loss] => {
                    proxy
                        .delay_ms
                        .store(delay.parse().unwrap_or(0), Ordering::Relaxed);
                    let loss: f64 = loss.parse().unwrap_or(0.0);
                    proxy.loss_ppm.store((loss * 1e6) as u64, Ordering::Relaxed);
                    reply(&mut out, "OK");
                }
                ["endpoints"] => {
                    let eps: Vec<String> =
                        channel.endpoints().iter().map(|a| a.to_string()).collect();
                    reply(&mut out, &format!("ENDPOINTS {}", eps.join(",")));
                }
                ["stop"] => {
                    stop.store(true, Ordering::Relaxed);
                    for w in workers.drain(..) {
                        let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
                    }
                    let st = stats.lock().unwrap_or_else(|e| e.into_inner());
                    let _ = std::fs::write(dir.join("client.txt"), st.records.join("\n"));
                    reply(
                        &mut out,
                        &format!("{} attempts by {WORKERS} callers", st.records.len()),
                    );
                    return;
                }
                _ => reply(&mut out, &format!("UNKNOWN {line}")),
            }
        }
    }

    async fn worker(
        ch: topspin::Channel,
        stats: Arc<Mutex<Stats>>,
        stop: Arc<AtomicBool>,
        next: Arc<AtomicU64>,
    ) {
        // Bounded: at most 1,000,000 calls per caller, and only until "stop".
        for _ in 0..1_000_000 {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let id = next.fetch_add(1, Ordering::Relaxed);
            for attempt in 0..4 {
                let tag = format!("{id}.{attempt}");
                let start = Instant::now();
                let r = ch
                    .unary(
                        RawCodec,
                        "/netns.Replica/Call",
                        Request::new(Bytes::from(tag.clone())).with_timeout(Duration::from_secs(2)),
                    )
                    .await;
                // true: the call is over (answered or failed); false: send it again.
                let (over, pause) = {
                    let mut st = stats.lock().unwrap_or_else(|e| e.into_inner());
                    match r {
                        Ok(reply) => {
                            st.ok += 1;
                            let server = String::from_utf8_lossy(reply.get_ref()).into_owned();
                            *st.per_server.entry(server).or_default() += 1;
                            st.records.push(format!("{tag} ok"));
                            (true, false)
                        }
                        // Never processed: sent again at once, as a transparent retry would.
                        Err(e) if e.is_unprocessed() && attempt < 3 => {
                            st.retried += 1;
                            st.records.push(format!("{tag} unprocessed"));
                            (false, false)
                        }
                        Err(e) => {
                            st.failed += 1;
                            if st.since.is_some_and(|s| start >= s) {
                                st.last_failed_start =
                                    Some(st.last_failed_start.map_or(start, |l| l.max(start)));
                            }
                            let outcome = if e.is_unprocessed() {
                                "unprocessed"
                            } else {
                                "failed"
                            };
                            st.records.push(format!("{tag} {outcome}"));
                            (true, true)
                        }
                    }
                };
                if pause {
                    // A failed call does not spin: its caller pauses a little.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                if over {
                    break;
                }
            }
        }
    }

    /// A fault-injecting TCP proxy for replica 3: each chunk waits `delay_ms`, and with
    /// probability `loss_ppm`/10⁶ another 200 ms — what a lost segment costs TCP (a byte stream
    /// cannot lose bytes; its losses show as retransmission stalls).
    #[derive(Default)]
    struct Proxy {
        delay_ms: AtomicU64,
        loss_ppm: AtomicU64,
    }

    impl Proxy {
        async fn serve(self: Arc<Self>) {
            let listen = format!("10.77.{PROXIED}.3:{PORT}");
            let Ok(listener) = tokio::net::TcpListener::bind(&listen).await else {
                eprintln!("proxy: cannot bind {listen}");
                return;
            };
            while let Ok((down, _)) = listener.accept().await {
                let me = self.clone();
                tokio::spawn(async move {
                    let upstream = format!("10.77.{PROXIED}.2:{PORT}");
                    let Ok(Ok(up)) = tokio::time::timeout(
                        Duration::from_secs(1),
                        tokio::net::TcpStream::connect(&upstream),
                    )
                    .await
                    else {
                        return;
                    };
                    let _ = (down.set_nodelay(true), up.set_nodelay(true));
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    tokio::spawn(me.clone().pump(dr, uw));
                    me.pump(ur, dw).await;
                });
            }
        }

        async fn pump(
            self: Arc<Self>,
            mut from: tokio::net::tcp::OwnedReadHalf,
            mut to: tokio::net::tcp::OwnedWriteHalf,
        ) {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            // One 16 KiB buffer per direction: what a peer can make the proxy hold.
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match from.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let delay = self.delay_ms.load(Ordering::Relaxed);
                let mut wait = Duration::from_millis(delay);
                let loss = self.loss_ppm.load(Ordering::Relaxed);
                if loss > 0 && fastrand::u64(..1_000_000) < loss {
                    wait += Duration::from_millis(200);
                }
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = to.shutdown().await;
        }
    }
}
