//! A soak test: a server and several clients in one process, making mixed calls for a given
//! time — unary and streaming, calls dropped midway (cancelled), short deadlines, messages over
//! `max_message_size`, channels dropped with calls open and raw sockets aborted mid-frame —
//! while a line of gauges is printed every second. At the end it waits for the server to be
//! quiet and exits non-zero unless no call is left open and no byte reserved, or if a call
//! that should have succeeded failed.
//!
//! `cargo run --release -p topspin --example soak -- --seconds 60 --clients 4 --csv soak.csv`
//! (or `scripts/soak.sh`). Every second: elapsed s, RSS of the process (server and clients;
//! VmRSS), the server's gauges (connections, open calls, unsent and reserved bytes) and the
//! calls finished so far, ok and failed by status code. The CSV has the same columns.

use bytes::Bytes;
use futures_util::stream;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use topspin::codec::RawCodec;
use topspin::{
    Channel, Code, Config, GaugeSnapshot, Gauges, MemoryBudget, Request, Response, Server, Status,
    Streaming,
};

const ECHO: &str = "/soak.S/Echo";
const SLOW: &str = "/soak.S/Slow";
const DOWN: &str = "/soak.S/Down";
const UP: &str = "/soak.S/Up";
const BIDI: &str = "/soak.S/Bidi";
/// The server's `max_message_size`; the oversize calls send one byte more.
const MAX_MESSAGE: usize = 1 << 20;

/// A soak test: a server and several clients in one process making mixed calls (unary,
/// streaming, cancelled, past their deadline, oversized, dropped mid-call, aborted mid-frame)
/// while a line of gauges is printed every second; exits non-zero if a call or a reserved byte
/// is left over at the end, or a call that should have succeeded failed.
#[derive(clap::Parser, Debug)]
#[command(name = "soak")]
struct Args {
    /// How long the clients keep calling
    #[arg(long, value_name = "N", default_value_t = 60)]
    seconds: u64,
    /// Client tasks, each with channels of its own
    #[arg(long, value_name = "N", default_value_t = 4)]
    clients: usize,
    /// Where the per-second gauges go (CSV, the printed columns)
    #[arg(long, value_name = "PATH", default_value = "soak.csv")]
    csv: String,
}

/// Outcomes by name ("ok", a status code's name, or "unexpected").
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    /// Calls that failed although they should have succeeded.
    unexpected: AtomicU64,
    failed: Mutex<BTreeMap<&'static str, u64>>,
    /// The first few unexpected failures, for the report.
    examples: Mutex<Vec<String>>,
}

impl Tally {
    fn ok(&self) {
        self.ok.fetch_add(1, Ordering::Relaxed);
    }

    fn failed(&self, code: Code) {
        let mut f = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        *f.entry(code.name()).or_default() += 1;
    }

    /// A call that should have succeeded.
    fn expect_ok<T>(&self, what: &str, r: Result<T, Status>) {
        match r {
            Ok(_) => self.ok(),
            Err(e) => {
                self.failed(e.code());
                self.unexpected(format!("{what}: {e}"));
            }
        }
    }

    /// A call that should fail with `code`.
    fn expect_err<T>(&self, what: &str, code: Code, r: Result<T, Status>) {
        match r {
            Err(e) if e.code() == code => self.failed(code),
            Err(e) => {
                self.failed(e.code());
                self.unexpected(format!("{what}: expected {code:?}, got {e}"));
            }
            Ok(_) => self.unexpected(format!("{what}: expected {code:?}, got OK")),
        }
    }

    fn unexpected(&self, why: String) {
        self.unexpected.fetch_add(1, Ordering::Relaxed);
        let mut ex = self.examples.lock().unwrap_or_else(|e| e.into_inner());
        if ex.len() < 10 {
            ex.push(why);
        }
    }

    fn failed_text(&self) -> String {
        let f = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        f.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn server_builder() -> topspin::ServerBuilder {
    Server::builder()
        .config(
            Config::default()
                .with_max_message_size(MAX_MESSAGE as u32)
                .with_memory_budget(MemoryBudget::new(256 << 20))
                .with_handshake_timeout(Duration::from_secs(2))
                .with_frame_timeout(Duration::from_secs(2)),
        )
        .unary(ECHO, RawCodec, |req: Request<Bytes>| async move {
            Ok(Response::new(req.into_inner()))
        })
        .unary(SLOW, RawCodec, |req: Request<Bytes>| async move {
            let ms = fastrand::u64(0..300);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(Response::new(req.into_inner()))
        })
        // "N:SIZE": N messages of SIZE bytes.
        .server_streaming(DOWN, RawCodec, |req: Request<Bytes>| async move {
            let spec = String::from_utf8_lossy(req.get_ref()).into_owned();
            let (n, size) = spec.split_once(':').unwrap_or(("0", "0"));
            let (n, size) = (n.parse().unwrap_or(0usize), size.parse().unwrap_or(0usize));
            let chunk = Bytes::from(vec![1u8; size.min(MAX_MESSAGE)]);
            Ok(Response::new(stream::iter(
                (0..n.min(10_000)).map(move |_| Ok(chunk.clone())),
            )))
        })
        .client_streaming(UP, RawCodec, |req: Request<Streaming<Bytes>>| async move {
            let mut s = req.into_inner();
            let mut total = 0usize;
            while let Some(m) = s.message().await? {
                total += m.len();
            }
            Ok(Response::new(Bytes::from(total.to_string())))
        })
        .streaming(
            BIDI,
            RawCodec,
            |req: Request<Streaming<Bytes>>| async move { Ok(Response::new(req.into_inner())) },
        )
}

fn body(n: usize) -> Bytes {
    Bytes::from(vec![b'x'; n])
}

fn req<T>(m: T, timeout_ms: u64) -> Request<T> {
    Request::new(m).with_timeout(Duration::from_millis(timeout_ms))
}

/// One client: its own channel, a random mix of calls until `stop`.
async fn client(
    addr: topspin::Address,
    tcp: Option<String>,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) {
    let mut ch = match Channel::connect(addr.clone()).await {
        Ok(c) => c,
        Err(e) => return tally.unexpected(format!("connect: {e}")),
    };
    while !stop.load(Ordering::Relaxed) {
        match fastrand::u32(0..100) {
            // Unary echo, small or large.
            0..=34 => {
                let n = if fastrand::u8(0..10) == 0 {
                    256 * 1024
                } else {
                    64
                };
                let r = ch.unary(RawCodec, ECHO, req(body(n), 10_000)).await;
                tally.expect_ok("unary", r);
            }
            // A deadline shorter than the handler takes (mostly).
            35..=44 => {
                let r = ch.unary(RawCodec, SLOW, req(body(8), 1)).await;
                match r {
                    Ok(_) => tally.ok(),
                    Err(e) if e.code() == Code::DeadlineExceeded => tally.failed(e.code()),
                    Err(e) => {
                        tally.expect_err("short deadline", Code::DeadlineExceeded, Err::<(), _>(e))
                    }
                }
            }
            // Cancelled: the caller drops the call midway.
            45..=54 => {
                let call = ch.unary(RawCodec, SLOW, req(body(8), 10_000));
                let wait = Duration::from_millis(fastrand::u64(0..100));
                match tokio::time::timeout(wait, call).await {
                    Ok(r) => tally.expect_ok("slow", r),
                    Err(_) => tally.failed(Code::Cancelled),
                }
            }
            // Over max_message_size.
            55..=59 => {
                let r = ch
                    .unary(RawCodec, ECHO, req(body(MAX_MESSAGE + 1), 10_000))
                    .await;
                tally.expect_err("oversize", Code::ResourceExhausted, r);
            }
            // Server streaming, read whole or dropped midway.
            60..=71 => {
                let n = fastrand::usize(1..200);
                let spec = Bytes::from(format!("{n}:{}", fastrand::usize(0..32 * 1024)));
                let whole = fastrand::bool();
                let r = async {
                    let mut s = ch
                        .server_streaming(RawCodec, DOWN, req(spec, 10_000))
                        .await?
                        .into_inner();
                    let mut got = 0;
                    while let Some(_m) = s.message().await? {
                        got += 1;
                        if !whole && got == n / 2 {
                            return Err(Status::cancelled("dropped midway"));
                        }
                    }
                    if got == n {
                        Ok(())
                    } else {
                        Err(Status::internal(format!("{got} of {n} messages")))
                    }
                }
                .await;
                match r {
                    Err(e) if e.code() == Code::Cancelled => tally.failed(Code::Cancelled),
                    r => tally.expect_ok("server stream", r),
                }
            }
            // Client streaming.
            72..=81 => {
                let parts: Vec<Bytes> = (0..fastrand::usize(0..50)).map(|_| body(1024)).collect();
                let want = parts.len() * 1024;
                let r = ch
                    .client_streaming(RawCodec, UP, req(stream::iter(parts), 10_000))
                    .await
                    .and_then(|r| {
                        if r.get_ref() == &Bytes::from(want.to_string()) {
                            Ok(())
                        } else {
                            Err(Status::internal("wrong total"))
                        }
                    });
                tally.expect_ok("client stream", r);
            }
            // Bidirectional, 20 round trips.
            82..=91 => {
                let r = async {
                    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
                    let requests =
                        stream::unfold(
                            rx,
                            |mut rx| async move { rx.recv().await.map(|b| (b, rx)) },
                        );
                    let mut replies = ch
                        .streaming(RawCodec, BIDI, req(requests, 10_000))
                        .await?
                        .into_inner();
                    for i in 0..20 {
                        let m = Bytes::from(format!("m{i}"));
                        tx.send(m.clone())
                            .await
                            .map_err(|_| Status::internal("request stream closed"))?;
                        if replies.message().await? != Some(m) {
                            return Err(Status::internal("wrong echo"));
                        }
                    }
                    drop(tx);
                    match replies.message().await? {
                        None => Ok(()),
                        Some(_) => Err(Status::internal("an extra reply")),
                    }
                }
                .await;
                tally.expect_ok("bidi", r);
            }
            // A connection killed with a call open: a fresh channel dropped mid-call.
            92..=95 => {
                if let Ok(doomed) = Channel::connect(addr.clone()).await {
                    let call = doomed.unary(RawCodec, SLOW, req(body(8), 10_000));
                    let _ = tokio::time::timeout(Duration::from_millis(20), call).await;
                    drop(doomed);
                    tally.failed(Code::Cancelled);
                }
            }
            // A raw socket aborted mid-frame (TCP only).
            96..=97 => {
                if let Some(hp) = &tcp {
                    if let Ok(mut s) = tokio::net::TcpStream::connect(hp).await {
                        let mut b = topspin_proto::preface::PREFACE.to_vec();
                        b.extend_from_slice(&[0, 0, 1, 0, 0x03, 0, 0, 0, 1, 0, 0, 0, 1, 2]);
                        let _ = s.write_all(&b).await;
                        let _ = s.set_zero_linger(); // abort: RST
                        drop(s);
                    }
                }
            }
            // This client's own channel replaced.
            _ => {
                if let Ok(c) = Channel::connect(addr.clone()).await {
                    ch = c;
                }
            }
        }
    }
}

fn line(start: Instant, g: &GaugeSnapshot, tally: &Tally) -> (String, String) {
    let t = start.elapsed().as_secs_f64();
    let rss = rss_kib();
    let ok = tally.ok.load(Ordering::Relaxed);
    let failed = tally.failed_text();
    let unexpected = tally.unexpected.load(Ordering::Relaxed);
    let text = format!(
        "t={t:6.1}s rss={:7.1}MiB conns={:4} open_calls={:5} unsent={:9} reserved={:9} ok={ok} unexpected={unexpected} failed: {failed}",
        rss as f64 / 1024.0,
        g.connections,
        g.open_calls,
        g.unsent_bytes,
        g.reserved_bytes
    );
    let csv = format!(
        "{t:.1},{rss},{},{},{},{},{ok},{unexpected},\"{failed}\"",
        g.connections, g.open_calls, g.unsent_bytes, g.reserved_bytes
    );
    (text, csv)
}

async fn quiet(gauges: &Gauges, within: Duration) -> GaugeSnapshot {
    let until = Instant::now() + within;
    loop {
        let g = gauges.snapshot();
        if (g.connections == 0 && g.open_calls == 0 && g.reserved_bytes == 0 && g.unsent_bytes == 0)
            || Instant::now() >= until
        {
            return g;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Args = clap::Parser::parse();
    let server = server_builder().bind("tcp://127.0.0.1:0").await?;
    let addr = server.local_addr().clone();
    let tcp = match &addr {
        topspin::Address::Tcp(hp) => Some(hp.clone()),
        _ => None,
    };
    let gauges = server.gauges();
    let handle = server.shutdown_handle();
    let serving = tokio::spawn(server.serve());
    println!(
        "soak: server on {addr}, {} clients, {} s",
        a.clients, a.seconds
    );

    let mut csv = std::io::BufWriter::new(std::fs::File::create(&a.csv)?);
    writeln!(csv, "elapsed_s,rss_kib,connections,open_calls,unsent_bytes,reserved_bytes,ok,unexpected,failed_by_code")?;

    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..a.clients)
        .map(|_| {
            tokio::spawn(client(
                addr.clone(),
                tcp.clone(),
                tally.clone(),
                stop.clone(),
            ))
        })
        .collect();

    let start = Instant::now();
    let end = start + Duration::from_secs(a.seconds);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    while Instant::now() < end {
        tick.tick().await;
        let (text, row) = line(start, &gauges.snapshot(), &tally);
        println!("{text}");
        writeln!(csv, "{row}")?;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        // A client finishes its current call (each has a deadline of at most 10 s).
        if tokio::time::timeout(Duration::from_secs(20), c)
            .await
            .is_err()
        {
            tally.unexpected("a client did not stop within 20 s".into());
        }
    }
    let g = quiet(&gauges, Duration::from_secs(15)).await;
    let (text, row) = line(start, &g, &tally);
    println!("final: {text}");
    writeln!(csv, "{row}")?;
    csv.flush()?;
    handle.shutdown(Duration::from_secs(1)).await;
    let _ = serving.await;

    let unexpected = tally.unexpected.load(Ordering::Relaxed);
    for e in tally
        .examples
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
    {
        eprintln!("soak: unexpected: {e}");
    }
    if g.open_calls != 0 || g.reserved_bytes != 0 || g.connections != 0 || g.unsent_bytes != 0 {
        eprintln!("soak: FAILED: the server did not quiesce: {g:?}");
        std::process::exit(1);
    }
    if unexpected > 0 {
        eprintln!("soak: FAILED: {unexpected} calls that should have succeeded failed");
        std::process::exit(1);
    }
    println!(
        "soak: ok ({} calls ok; CSV in {})",
        tally.ok.load(Ordering::Relaxed),
        a.csv
    );
    Ok(())
}
