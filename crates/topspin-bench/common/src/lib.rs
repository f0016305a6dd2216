//! What every topspin-bench peer shares: the benchmark messages, the data every server returns,
//! the driver <-> peer command protocol, the measuring loops and the counting allocator.
//!
//! A peer is a process hosting one system's server (on its own runtime/threads, or in a child
//! process: [`placement`]) and client (on the main thread). It prints `ready <system>` on stdout, then answers one [`Cmd`] per stdin
//! line with one [`Outcome`] per stdout line, until stdin closes.

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};
use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::hint::black_box;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The messages of `proto/bench/v1/bench.proto` (prost; `bytes` fields are [`Bytes`]).
#[allow(missing_docs, clippy::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/bench.v1.rs"));
}

// ---------------------------------------------------------------- counting allocator

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static ALLOC_BYTES: AtomicU64 = AtomicU64::new(0);

/// The system allocator, counting allocations (and reallocations) while counting is on.
pub struct CountingAlloc;

// SAFETY: every method forwards to `System` unchanged; the counters are plain atomics.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            ALLOCS.fetch_add(1, Relaxed);
            ALLOC_BYTES.fetch_add(layout.size() as u64, Relaxed);
        }
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            ALLOCS.fetch_add(1, Relaxed);
            ALLOC_BYTES.fetch_add(layout.size() as u64, Relaxed);
        }
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            ALLOCS.fetch_add(1, Relaxed);
            ALLOC_BYTES.fetch_add(new_size as u64, Relaxed);
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Turns allocation counting on or off (process-wide: client and server threads; and in the
/// server process too when it is a separate one).
pub fn count_allocations(on: bool) {
    // Ordered so that talking to a server process is never counted.
    if on {
        placement::server_count_allocations(true);
        COUNTING.store(true, Relaxed);
    } else {
        COUNTING.store(false, Relaxed);
        placement::server_count_allocations(false);
    }
}

/// Allocations and bytes counted so far (client + server).
pub fn allocations() -> (u64, u64) {
    let (a, b) = local_allocations();
    let (c, d) = placement::server_allocations();
    (a + c, b + d)
}

fn local_allocations() -> (u64, u64) {
    (ALLOCS.load(Relaxed), ALLOC_BYTES.load(Relaxed))
}

pub mod placement;

// ---------------------------------------------------------------- process figures

/// CPU time (user + system) of the whole process so far, in µs — plus that of the server
/// process when the server runs in a child process (`--separate-processes`), so that CPU per
/// call is always client + server.
pub fn cpu_us() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 * 1e6 + tv.tv_usec as f64;
    t(ru.ru_utime) + t(ru.ru_stime) + placement::server_cpu_us()
}

// ---------------------------------------------------------------- data

/// Students per `GetStructs` reply and the length of their lists.
pub const K: usize = 34;
/// Size of the pre-generated random blob every server slices `GetBlob` replies from.
pub const BLOB_POOL: usize = 16 << 20;

/// 16 MiB of pseudo-random bytes (fixed seed: every process has the same).
pub fn blob_pool() -> &'static Bytes {
    static POOL: OnceLock<Bytes> = OnceLock::new();
    POOL.get_or_init(|| {
        let mut rng = fastrand::Rng::with_seed(0x70b5_0123);
        let mut v = vec![0u8; BLOB_POOL];
        rng.fill(&mut v);
        Bytes::from(v)
    })
}

/// Echo and blob payloads: the first `n` bytes of a second random buffer.
pub fn payload(n: usize) -> Bytes {
    static P: OnceLock<Bytes> = OnceLock::new();
    let p = P.get_or_init(|| {
        let mut rng = fastrand::Rng::with_seed(0xec40);
        let mut v = vec![0u8; BLOB_POOL];
        rng.fill(&mut v);
        Bytes::from(v)
    });
    assert!(n <= p.len(), "payload larger than 16 MiB");
    p.slice(0..n)
}

fn alnum(rng: &mut fastrand::Rng, n: usize) -> String {
    (0..n).map(|_| rng.alphanumeric()).collect()
}

fn address(rng: &mut fastrand::Rng) -> pb::Address {
    pb::Address {
        city: alnum(rng, 12),
        zipcode: rng.i32(10000..99999),
        street: alnum(rng, 16),
        number: rng.i32(1..i16::MAX as i32),
    }
}

fn date(rng: &mut fastrand::Rng) -> pb::Date {
    pb::Date {
        year: rng.i32(1900..2030),
        month: rng.i32(1..13),
        day: rng.i32(1..29),
    }
}

/// The `GetStructs` reply: K students of the published shape, fixed seed.
pub fn students() -> &'static [pb::Student] {
    static S: OnceLock<Vec<pb::Student>> = OnceLock::new();
    S.get_or_init(|| {
        let mut rng = fastrand::Rng::with_seed(0x57d);
        (0..K)
            .map(|_| pb::Student {
                name: alnum(&mut rng, 43),
                friends: rng.i32(0..1000),
                home_address: Some(address(&mut rng)),
                birth_place: Some(address(&mut rng)),
                birth: Some(date(&mut rng)),
                favorite_subjects: (0..K)
                    .map(|_| pb::Subject {
                        id: rng.i32(0..100000),
                        title: alnum(&mut rng, 22),
                        code: alnum(&mut rng, 16),
                    })
                    .collect(),
                email_addresses: (0..K).map(|_| alnum(&mut rng, 37)).collect(),
                schools: (0..K)
                    .map(|_| pb::School {
                        name: alnum(&mut rng, 36),
                        address: Some(address(&mut rng)),
                        foundation: Some(date(&mut rng)),
                        email_addresses: (0..K).map(|_| alnum(&mut rng, 37)).collect(),
                    })
                    .collect(),
            })
            .collect()
    })
}

/// Reads the bytes a client got the way an application would glance at them: one byte per
/// page plus the last one (so the pages are really there), without copying.
pub fn touch(b: &[u8]) -> u64 {
    let mut s = 0u64;
    let mut i = 0;
    while i < b.len() {
        s = s.wrapping_add(b[i] as u64);
        i += 4096;
    }
    if let Some(l) = b.last() {
        s = s.wrapping_add(*l as u64);
    }
    black_box(s)
}

/// `Ok` when `got` equals `want`, else a short description of the difference.
pub fn same_bytes(what: &str, got: &[u8], want: &[u8]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: got {} bytes, want {}",
            got.len(),
            want.len()
        ));
    }
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        return Err(format!("{what}: bytes differ at offset {i}"));
    }
    Ok(())
}

/// Checks a decoded `GetStructs` reply.
pub fn check_students(got: &[pb::Student]) -> Result<(), String> {
    if got == students() {
        Ok(())
    } else {
        Err(format!(
            "structs: {} students received, content differs from the {} sent",
            got.len(),
            K
        ))
    }
}

// ---------------------------------------------------------------- commands

/// One measured series, sent by the driver.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cmd {
    /// `echo`, `answer`, `blob`, `structs`, `nymph_uint32`, `nymph_double`, `nymph_array`,
    /// `nymph_blob`, `throughput`, `burst`, `allocs_echo`, `allocs_answer`.
    pub workload: String,
    /// Payload bytes (echo, blob, nymph_blob) or elements (nymph_array).
    pub size: u64,
    /// Connections (throughput).
    pub connections: usize,
    /// Calls in flight per connection (throughput).
    pub in_flight: usize,
    /// Most warm-up calls (the first one is checked for correct content).
    pub warmup: u32,
    /// Warm-up time bound, ms.
    pub warmup_ms: u64,
    /// Most measured calls.
    pub iters: u32,
    /// Measured-series time bound, ms.
    pub max_ms: u64,
}

/// What one series measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// Measured calls.
    pub calls: u64,
    /// Median wall-clock µs per call.
    pub median_us: Option<f64>,
    /// 99th percentile wall-clock µs per call.
    pub p99_us: Option<f64>,
    /// Process CPU µs (client + server) per call.
    pub cpu_us_per_call: Option<f64>,
    /// Calls per second over the series.
    pub calls_per_s: Option<f64>,
    /// Heap allocations per call, client + server (allocs workloads only).
    pub allocs_per_call: Option<f64>,
    /// Heap bytes allocated per call, client + server (allocs workloads only).
    pub bytes_alloc_per_call: Option<f64>,
    /// The system does not offer this workload (e.g. calls in flight on a blocking client).
    pub unsupported: bool,
    /// A call failed or returned wrong data.
    pub error: Option<String>,
}

impl Outcome {
    /// An outcome for a workload the system cannot run.
    pub fn unsupported() -> Outcome {
        Outcome {
            unsupported: true,
            ..Outcome::default()
        }
    }
    /// A failed series.
    pub fn failed(e: String) -> Outcome {
        Outcome {
            error: Some(e),
            ..Outcome::default()
        }
    }
}

/// The input of one call, built once per series.
#[derive(Clone, Debug)]
pub enum Input {
    /// Echo these bytes.
    Echo(Bytes),
    /// GetAnswer(n).
    Answer(i32),
    /// GetBlob(size).
    Blob(u32),
    /// GetStructs().
    Structs,
    /// NymphUint32(v).
    U32(u32),
    /// NymphDouble(v).
    F64(f64),
    /// NymphArray(values).
    Array(Vec<u32>),
    /// NymphBlob(bytes).
    NBlob(Bytes),
}

/// The value GetAnswer is called with (the reply must be 41 + it).
pub const ANSWER_N: i32 = 1;
/// The NymphUint32 value.
pub const NYMPH_U32: u32 = 0xdead_beef;
/// The NymphDouble value.
pub const NYMPH_F64: f64 = std::f64::consts::PI;

impl Input {
    /// The input of a command's calls.
    pub fn of(cmd: &Cmd) -> Result<Input, String> {
        let n = cmd.size as usize;
        Ok(match cmd.workload.as_str() {
            "echo" => Input::Echo(payload(n)),
            "throughput" | "burst" | "allocs_echo" => Input::Echo(payload(20)),
            "answer" | "allocs_answer" => Input::Answer(ANSWER_N),
            "blob" => Input::Blob(n as u32),
            "structs" => Input::Structs,
            "nymph_uint32" => Input::U32(NYMPH_U32),
            "nymph_double" => Input::F64(NYMPH_F64),
            "nymph_array" => {
                Input::Array((0..n as u32).map(|i| i.wrapping_mul(2654435761)).collect())
            }
            "nymph_blob" => Input::NBlob(payload(n)),
            w => return Err(format!("unknown workload {w}")),
        })
    }
}

/// Checks a blob reply of `size` bytes against the pool (or touches it when `check` is false).
pub fn check_blob(got: &[u8], size: u32, check: bool) -> Result<(), String> {
    if got.len() != size as usize {
        return Err(format!("blob: got {} bytes, want {size}", got.len()));
    }
    if check {
        same_bytes("blob", got, &blob_pool()[..size as usize])
    } else {
        touch(got);
        Ok(())
    }
}

/// Checks an echo-style reply (or only its length when `check` is false, touching it).
pub fn check_echo(got: &[u8], want: &[u8], check: bool) -> Result<(), String> {
    if check {
        same_bytes("echo", got, want)
    } else if got.len() != want.len() {
        Err(format!(
            "echo: got {} bytes, want {}",
            got.len(),
            want.len()
        ))
    } else {
        touch(got);
        Ok(())
    }
}

/// Checks a NymphArray reply.
pub fn check_array(got: &[u32], want: &[u32]) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "nymph_array: {} values back, want {} (or content differs)",
            got.len(),
            want.len()
        ))
    }
}

/// Checks a scalar reply.
pub fn check_eq<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, want {want:?}"))
    }
}

/// Runs the peer's command loop: prints `ready <system>`, then answers each stdin line.
pub fn serve_commands(system: &str, mut run: impl FnMut(&Cmd) -> Outcome) {
    let stdout = std::io::stdout();
    {
        let mut o = stdout.lock();
        let _ = writeln!(o, "ready {system}");
        let _ = o.flush();
    }
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        if line.trim() == "quit" {
            break;
        }
        let out = match serde_json::from_str::<Cmd>(&line) {
            Ok(cmd) => run(&cmd),
            Err(e) => Outcome::failed(format!("bad command: {e}")),
        };
        let mut o = stdout.lock();
        let _ = writeln!(
            o,
            "{}",
            serde_json::to_string(&out).expect("outcome serialises")
        );
        let _ = o.flush();
    }
}

// ---------------------------------------------------------------- measuring

fn is_allocs(cmd: &Cmd) -> bool {
    cmd.workload.starts_with("allocs")
}

/// Per-call samples plus process counters around a measured series.
pub struct Series {
    samples: Vec<u64>,
    cpu0: f64,
    alloc0: (u64, u64),
    counting: bool,
    t0: Instant,
}

impl Series {
    /// Starts a series (samples storage is allocated before counting starts).
    pub fn start(cmd: &Cmd) -> Series {
        let samples = Vec::with_capacity(cmd.iters as usize + 1);
        let counting = is_allocs(cmd);
        let cpu0 = cpu_us();
        let alloc0 = allocations();
        if counting {
            count_allocations(true);
        }
        Series {
            samples,
            cpu0,
            alloc0,
            counting,
            t0: Instant::now(),
        }
    }

    /// Records one call's duration.
    #[inline]
    pub fn push(&mut self, d: Duration) {
        if self.samples.len() < self.samples.capacity() {
            self.samples.push(d.as_nanos() as u64);
        }
    }

    /// Ends the series: `calls` calls were made.
    pub fn finish(mut self, calls: u64) -> Outcome {
        let wall = self.t0.elapsed();
        count_allocations(false);
        let cpu = cpu_us() - self.cpu0;
        let a = allocations();
        let mut o = Outcome {
            calls,
            ..Outcome::default()
        };
        if calls == 0 {
            o.error = Some("no call completed".into());
            return o;
        }
        let c = calls as f64;
        o.cpu_us_per_call = Some(cpu / c);
        o.calls_per_s = Some(c / wall.as_secs_f64());
        if !self.samples.is_empty() {
            self.samples.sort_unstable();
            let n = self.samples.len();
            o.median_us = Some(self.samples[n / 2] as f64 / 1000.0);
            let i99 = ((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1;
            o.p99_us = Some(self.samples[i99] as f64 / 1000.0);
        }
        if self.counting {
            o.allocs_per_call = Some((a.0 - self.alloc0.0) as f64 / c);
            o.bytes_alloc_per_call = Some((a.1 - self.alloc0.1) as f64 / c);
        }
        o
    }
}

/// A blocking client: one call of `input`, checking the reply fully when `check`.
pub trait SyncCall {
    /// Makes one call.
    fn call(&mut self, input: &Input, check: bool) -> Result<(), String>;
}

/// Runs a latency series (echo, answer, blob, structs, nymph_*, allocs_*) on a blocking client.
pub fn run_sync<C: SyncCall>(client: &mut C, cmd: &Cmd) -> Outcome {
    let input = match Input::of(cmd) {
        Ok(i) => i,
        Err(e) => return Outcome::failed(e),
    };
    let r = (|| {
        let wd = Instant::now() + Duration::from_millis(cmd.warmup_ms);
        for i in 0..cmd.warmup.max(1) {
            client.call(&input, i == 0)?;
            if Instant::now() >= wd {
                break;
            }
        }
        let mut s = Series::start(cmd);
        let deadline = Instant::now() + Duration::from_millis(cmd.max_ms);
        let mut calls = 0;
        for _ in 0..cmd.iters.max(1) {
            let t = Instant::now();
            if let Err(e) = client.call(&input, false) {
                count_allocations(false);
                return Err(e);
            }
            let e = Instant::now();
            s.push(e - t);
            calls += 1;
            if e >= deadline {
                break;
            }
        }
        Ok(s.finish(calls))
    })();
    r.unwrap_or_else(Outcome::failed)
}

/// An async client: one call of `input`, checking the reply fully when `check`.
#[allow(async_fn_in_trait)]
pub trait AsyncCall {
    /// Makes one call.
    async fn call(&self, input: &Input, check: bool) -> Result<(), String>;
}

/// Runs any workload on async clients (`clients[0]` for one-at-a-time calls; throughput uses the
/// first `connections` of them, `in_flight` calls each, all polled from the calling task).
pub async fn run_async<C: AsyncCall>(clients: &[C], cmd: &Cmd) -> Outcome {
    let input = match Input::of(cmd) {
        Ok(i) => i,
        Err(e) => return Outcome::failed(e),
    };
    let r = async {
        let c0 = &clients[0];
        let wd = Instant::now() + Duration::from_millis(cmd.warmup_ms);
        for i in 0..cmd.warmup.max(1) {
            c0.call(&input, i == 0).await?;
            if Instant::now() >= wd {
                break;
            }
        }
        match cmd.workload.as_str() {
            "throughput" => throughput(clients, cmd, &input).await,
            "burst" => burst(c0, cmd, &input).await,
            _ => {
                let mut s = Series::start(cmd);
                let deadline = Instant::now() + Duration::from_millis(cmd.max_ms);
                let mut calls = 0;
                for _ in 0..cmd.iters.max(1) {
                    let t = Instant::now();
                    if let Err(e) = c0.call(&input, false).await {
                        count_allocations(false);
                        return Err(e);
                    }
                    let e = Instant::now();
                    s.push(e - t);
                    calls += 1;
                    if e >= deadline {
                        break;
                    }
                }
                Ok(s.finish(calls))
            }
        }
    };
    r.await.unwrap_or_else(Outcome::failed)
}

async fn burst<C: AsyncCall>(c: &C, cmd: &Cmd, input: &Input) -> Result<Outcome, String> {
    let one = || c.call(input, false);
    let mut s = Series::start(cmd);
    let deadline = Instant::now() + Duration::from_millis(cmd.max_ms);
    let mut calls = 0;
    for _ in 0..cmd.iters.max(1) {
        let t = Instant::now();
        futures_join8(one).await?;
        let e = Instant::now();
        s.push((e - t) / 8);
        calls += 8;
        if e >= deadline {
            break;
        }
    }
    Ok(s.finish(calls))
}

/// Eight calls issued at once, then awaited together.
async fn futures_join8<F, Fut>(f: F) -> Result<(), String>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let (a, b, c, d, e, g, h, i) = futures_util::join!(f(), f(), f(), f(), f(), f(), f(), f());
    a.and(b).and(c).and(d).and(e).and(g).and(h).and(i)
}

async fn throughput<C: AsyncCall>(
    clients: &[C],
    cmd: &Cmd,
    input: &Input,
) -> Result<Outcome, String> {
    let conns = cmd.connections.clamp(1, clients.len());
    let per = cmd.in_flight.max(1);
    // Warm-up with the same shape, then the measured run.
    let mut out = Outcome::default();
    for (phase, ms, cap) in [
        (0, cmd.warmup_ms, cmd.warmup as u64 * (conns * per) as u64),
        (1, cmd.max_ms, cmd.iters as u64 * (conns * per) as u64),
    ] {
        let done = std::cell::Cell::new(0u64);
        let err: std::cell::RefCell<Option<String>> = std::cell::RefCell::new(None);
        let deadline = Instant::now() + Duration::from_millis(ms);
        let s = if phase == 1 {
            Some(Series::start(cmd))
        } else {
            None
        };
        let mut lanes = FuturesUnordered::new();
        for c in clients.iter().take(conns) {
            for _ in 0..per {
                lanes.push(lane(c, input, &done, &err, cap, deadline));
            }
        }
        while lanes.next().await.is_some() {}
        drop(lanes);
        if let Some(e) = err.into_inner() {
            return Err(e);
        }
        if let Some(s) = s {
            out = s.finish(done.get());
            out.median_us = None;
            out.p99_us = None;
        }
    }
    Ok(out)
}

async fn lane<C: AsyncCall>(
    c: &C,
    input: &Input,
    done: &std::cell::Cell<u64>,
    err: &std::cell::RefCell<Option<String>>,
    cap: u64,
    deadline: Instant,
) {
    loop {
        if done.get() >= cap || err.borrow().is_some() || Instant::now() >= deadline {
            break;
        }
        done.set(done.get() + 1);
        if let Err(e) = c.call(input, false).await {
            *err.borrow_mut() = Some(e);
            break;
        }
    }
}
