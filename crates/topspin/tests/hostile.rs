//! Hostile peers and slow readers, over real TCP sockets: an attacker written at the frame level
//! (`topspin_proto::frame` encoders, never the topspin client) against a real `Server`. Each
//! test asserts on the server's own gauges (`Server::gauges`) that what the attacker can make the
//! server hold stays bounded, that a well-behaved `Channel` on another connection is served
//! during and after the attack, and that once the attacker is gone the gauges come back to the
//! good client's alone (one connection, no open call, nothing reserved).
//!
//! The tests run one at a time (they measure the process's memory), each in well under 10 s.
//! Bounds are generous: the machine is shared.

mod common;

use bytes::{BufMut, Bytes, BytesMut};
use common::*;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use topspin::codec::RawCodec;
use topspin::{Channel, Config, GaugeSnapshot, Gauges, MemoryBudget, Request, Response};
use topspin_proto::frame::{
    encode_call, encode_cancel, encode_credit, encode_message_head, encode_ping, encode_settings,
    FrameType, Header,
};
use topspin_proto::preface::PREFACE;
use topspin_proto::{CallId, Code, Metadata, Settings, MAX_WINDOW};

/// A unary method answering every call with 1 MiB (one shared buffer, so the test's own memory
/// stays small; the server's gauges count every queued copy).
const BIG: &str = "/test.Echo/Big";
const MIB: usize = 1 << 20;

/// The tests measure the process's memory: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------------------------------------
// The server under attack and the good client.

struct Target {
    /// `host:port` for raw sockets.
    tcp: String,
    gauges: Gauges,
    good: Channel,
    server: TestServer,
}

/// Starts the test service (plus `BIG`) with `config` and connects the good client.
async fn start(config: Config) -> Target {
    let big = Bytes::from(vec![0x5a; MIB]);
    let b = builder(Probe::default())
        .unary(BIG, RawCodec, move |_req: Request<Bytes>| {
            let big = big.clone();
            async move { Ok(Response::new(big)) }
        })
        .config(config);
    let server = b.bind(listen_addr(Transport::Tcp)).await.expect("bind");
    let gauges = server.gauges();
    let addr = server.local_addr().clone();
    let tcp = match &addr {
        topspin::Address::Tcp(hp) => hp.clone(),
        other => panic!("not tcp: {other}"),
    };
    let server = started(server, Transport::Tcp);
    let good = server.channel().await;
    served(&good, "warm-up").await;
    Target {
        tcp,
        gauges,
        good,
        server,
    }
}

/// A config with a memory budget of its own (so the gauges see only this server's reservations).
fn config(budget: usize) -> Config {
    Config::default().with_memory_budget(MemoryBudget::new(budget))
}

/// The good client gets an answer within a generous time.
async fn served(ch: &Channel, tag: &str) {
    let req = Request::new(bytes(tag)).with_timeout(Duration::from_secs(10));
    let reply = tokio::time::timeout(Duration::from_secs(15), ch.unary(RawCodec, UNARY, req))
        .await
        .unwrap_or_else(|_| panic!("good client's call {tag:?} timed out"))
        .unwrap_or_else(|e| panic!("good client's call {tag:?} failed: {e}"));
    assert_eq!(reply.into_inner(), bytes(tag));
}

/// The good client calling every 50 ms in the background; `stop` returns how many calls
/// succeeded and panics on any failure.
struct Prober {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Result<usize, String>>,
}

impl Prober {
    fn start(ch: &Channel) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let ch = ch.clone();
        let s = stop.clone();
        let task = tokio::spawn(async move {
            let mut ok = 0;
            while !s.load(Ordering::Relaxed) {
                let req = Request::new(bytes("probe")).with_timeout(Duration::from_secs(10));
                match ch.unary(RawCodec, UNARY, req).await {
                    Ok(r) if r.get_ref() == &bytes("probe") => ok += 1,
                    Ok(_) => return Err("wrong answer".to_string()),
                    Err(e) => return Err(format!("call {ok} failed: {e}")),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(ok)
        });
        Prober { stop, task }
    }

    async fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let ok = within(20, self.task)
            .await
            .expect("prober task")
            .unwrap_or_else(|e| panic!("the good client was not served: {e}"));
        assert!(ok > 0, "the good client made no call");
        ok
    }
}

/// Polls the gauges until `ok` holds (deadline: `secs`); returns the snapshot that passed.
async fn settle(
    gauges: &Gauges,
    secs: u64,
    what: &str,
    ok: impl Fn(&GaugeSnapshot) -> bool,
) -> GaugeSnapshot {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let s = gauges.snapshot();
        if ok(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "gauges never reached {what}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// After the attack: only the good client's connection is left, with no open call and nothing
/// reserved; the good client is still served; the server stops cleanly.
async fn after_attack(t: Target) {
    settle(&t.gauges, 20, "only the good client", |s| {
        s.connections == 1 && s.open_calls == 0 && s.reserved_bytes == 0
    })
    .await;
    served(&t.good, "after").await;
    let s = t.gauges.snapshot();
    assert_eq!((s.open_calls, s.reserved_bytes), (0, 0), "{s:?}");
    drop(t.good);
    t.server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The attacker's frames.

/// Preface and SETTINGS (defaults).
fn hello() -> BytesMut {
    let mut b = BytesMut::new();
    b.put_slice(&PREFACE);
    encode_settings(&mut b, &Settings::default());
    b
}

/// CALL with the method by name.
fn call(b: &mut BytesMut, id: u32, method: &str) {
    encode_call(b, CallId(id), 0, Some(method), 1, 0, &Metadata::new());
}

/// A whole MESSAGE.
fn message(b: &mut BytesMut, id: u32, end_stream: bool, body: &[u8]) {
    encode_message_head(b, CallId(id), end_stream, None, body.len());
    b.put_slice(body);
}

/// A unary call: CALL and the one MESSAGE with END_STREAM.
fn unary_call(b: &mut BytesMut, id: u32, method: &str, body: &[u8]) {
    call(b, id, method);
    message(b, id, true, body);
}

/// A header announcing `len` bytes of payload of type `ty`; the caller sends (some of) them.
fn header(b: &mut BytesMut, len: u32, ty: FrameType, flags: u8, id: u32) {
    Header {
        length: len,
        ty: ty.0,
        flags,
        call_id: CallId(id),
    }
    .encode(b);
}

async fn connect(t: &Target) -> TcpStream {
    let s = TcpStream::connect(&t.tcp).await.expect("attacker connects");
    let _ = s.set_nodelay(true);
    s
}

/// Writes `bytes` unless the server stops taking them for `secs` (it may stop reading a
/// hostile peer); whether all were written.
async fn send(sock: &mut TcpStream, bytes: &[u8], secs: u64) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(secs), sock.write_all(bytes)).await,
        Ok(Ok(()))
    )
}

/// Reads and discards everything the server sends, until it closes; the bytes read.
fn drain(mut r: tokio::net::tcp::OwnedReadHalf) -> JoinHandle<usize> {
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0;
        while let Ok(n) = r.read(&mut buf).await {
            if n == 0 {
                break;
            }
            total += n;
        }
        total
    })
}

/// The server closes this socket within `secs` (whatever it sends first is read and dropped).
async fn closed_by_server(mut sock: TcpStream, secs: u64) {
    let mut sink = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(secs), sock.read_to_end(&mut sink)).await;
    assert!(r.is_ok(), "the server did not close the connection");
}

/// Memory of this process (`VmRSS`, `VmSize`), in bytes.
fn proc_status(field: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map(|kb| kb * 1024)
        .expect("a memory figure in /proc/self/status")
}

fn rss() -> usize {
    proc_status("VmRSS")
}

fn vm_size() -> usize {
    proc_status("VmSize")
}

/// Runs the test body against a fresh server, one test at a time, within 40 s.
async fn serial<F: Future<Output = ()>>(f: F) {
    let _one_at_a_time = SERIAL.lock().await;
    within(40, f).await;
}

// ---------------------------------------------------------------------------------------------
// (a) A client that never reads.

/// Thousands of calls for 1 MiB answers, never reading one: the server stops reading that
/// connection once `max_send_buffer` (4 MiB) is unsent, so what it holds stays within the
/// buffer plus one answer, and stops growing.
///
/// 1000 calls: within `max_concurrent_calls` (1024), so none is refused (past it, refused
/// calls would soon close the connection: `refused_call_rate`).
///
/// Failed before the fix: one read of the socket (64 KiB) holds ~1000 such calls, and the
/// server polled every one's handler inline as its request completed, whatever was unsent;
/// `max_send_buffer` was only checked before the next read. Measured: 1,069,923,516 unsent
/// bytes (1020 answers) from one read. Now calls that arrive while the buffer is full wait
/// to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_held_to_the_send_buffer() {
    never_reading_client(thousand_big_answers).await;
}

/// The same calls from a client whose INITIAL_CALL_WINDOW is 0 (it never grants credit): the
/// answers wait in the server for credit, out of the engine's transmit queue; they count
/// against the send buffer all the same, so the server stops taking calls.
///
/// Failed before the fix: answers kept back for credit were not counted, so the server read
/// and answered every call (1,000 answers of 1 MiB held, RSS +1 GiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_grants_no_credit_is_held_to_the_send_buffer() {
    let settings = Settings::default().with_initial_call_window(0);
    never_reading_client_with(settings, thousand_big_answers).await;
}

/// The same with the smallest MAX_FRAME_SIZE and a 64 KiB window: each answer is split, its
/// rest waits in the engine for credit; that counts too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_answers_waiting_for_credit_are_held_to_the_send_buffer() {
    let settings = Settings::default()
        .with_max_frame_size(16 * 1024)
        .with_initial_call_window(64 * 1024);
    never_reading_client_with(settings, thousand_big_answers).await;
}

/// 1000 unary calls for 1 MiB answers.
fn thousand_big_answers(b: &mut BytesMut) {
    for id in 1..=1000u32 {
        unary_call(b, id * 2 - 1, BIG, b"x");
    }
}

/// A server stream of 1000 messages of 1 MiB to a client that grants all the flow-control
/// credit it may (2 GiB) and never reads: the handler's sends wait once `max_send_buffer` is
/// unsent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_a_stream_is_held_to_the_send_buffer() {
    never_reading_client(|b| streams(b, 1)).await;
}

/// The same with 64 streams at once: still at most one message over the buffer.
///
/// Failed before the fix: the server applied up to 257 queued handler commands per turn
/// (`COMMANDS_PER_TURN` in server/conn.rs) without checking the buffer between them, so each
/// stream with a send waiting added its message past the bound (measured: 62,195,316 bytes
/// unsent with 64 streams, for a bound of 5.06 MiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_many_streams_is_held_to_the_send_buffer() {
    never_reading_client(|b| streams(b, 64)).await;
}

/// `n` server streams of 1000 messages of 1 MiB, with all the credit a call may have.
fn streams(b: &mut BytesMut, n: u32) {
    let window = Settings::default().initial_call_window();
    for i in 0..n {
        let id = 2 * i + 1;
        unary_call(b, id, SERVER_STREAM, format!("1000:{MIB}").as_bytes());
        encode_credit(b, CallId(id), MAX_WINDOW - window);
    }
}

/// The attack of (a): `calls` asks for large answers, and none is ever read.
async fn never_reading_client(calls: impl FnOnce(&mut BytesMut)) {
    never_reading_client_with(Settings::default(), calls).await;
}

/// The same, from a client that announces `settings`.
async fn never_reading_client_with(settings: Settings, calls: impl FnOnce(&mut BytesMut)) {
    serial(async {
        let t = start(config(64 * MIB)).await;
        let max_send = Config::default().max_send_buffer();
        let prober = Prober::start(&t.good);

        let mut sock = connect(&t).await;
        let mut b = BytesMut::new();
        b.put_slice(&PREFACE);
        encode_settings(&mut b, &settings);
        calls(&mut b);
        // The server stops reading before it has taken everything: give up after 2 s.
        let writer = tokio::spawn(async move {
            let _ = send(&mut sock, &b, 2).await;
            sock
        });
        // The bound: the buffer, plus one answer that went over it, plus frame headers.
        let bound = max_send + MIB + 64 * 1024;
        settle(&t.gauges, 10, "unsent bytes piling up", |s| {
            s.unsent_bytes >= max_send
        })
        .await;
        // Let the kernel's socket buffers fill: from then on nothing may move.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut first = None;
        let mut peak = 0;
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            let s = t.gauges.snapshot();
            assert!(s.unsent_bytes <= bound, "unsent over the bound: {s:?}");
            first.get_or_insert(s.unsent_bytes);
            peak = peak.max(s.unsent_bytes);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let first = first.unwrap_or(0);
        assert!(
            peak <= first + 64 * 1024,
            "unsent kept growing while the client did not read: {first} then {peak}"
        );
        served(&t.good, "during").await;
        let ok = prober.stop().await;
        eprintln!("never-reading client: unsent held at {peak} bytes; good client {ok} calls");

        // The attacker leaves without reading.
        let sock = within(10, writer).await.expect("writer");
        drop(sock);
        after_attack(t).await;
    })
    .await;
}

/// A client that never reads, against a server with a 1 s `write_timeout`: once the socket
/// takes none of the server's bytes for that long, the connection is closed (its calls and
/// unsent answers dropped), though the client is still connected and sending nothing wrong.
///
/// Failed before `write_timeout` existed: the connection, its unsent answers and its calls
/// stayed for as long as the client kept the socket open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_cut_at_the_write_timeout() {
    serial(async {
        let cfg = config(64 * MIB).with_write_timeout(Some(Duration::from_secs(1)));
        let t = start(cfg).await;
        let mut sock = connect(&t).await;
        let mut b = BytesMut::new();
        b.put_slice(&PREFACE);
        encode_settings(&mut b, &Settings::default());
        thousand_big_answers(&mut b);
        let _ = send(&mut sock, &b, 2).await;
        settle(&t.gauges, 10, "unsent bytes piling up", |s| {
            s.unsent_bytes > 0
        })
        .await;
        // Closed within the timeout plus a second or two, while the socket is still open.
        let s = settle(&t.gauges, 5, "the stalled connection closed", |s| {
            s.connections == 1 && s.unsent_bytes == 0
        })
        .await;
        eprintln!("after the write timeout: {s:?}");
        served(&t.good, "after").await;
        drop(sock);
        after_attack(t).await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// (b) Frames announced and never sent.

/// 50 connections each announce a 16 MiB frame (the largest allowed) and send 1 byte of it:
/// the server reserves whole frames only within its memory budget (64 MiB here), and its
/// memory grows by far less than 50 × 16 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announced_frames_that_never_come_stay_within_the_memory_budget() {
    serial(async {
        const N: usize = 50;
        let budget = 64 * MIB;
        let t = start(config(budget)).await;
        let max_frame = Config::default().max_frame_size();
        let prober = Prober::start(&t.good);
        let rss_before = rss();

        let mut socks = Vec::new();
        for i in 0..N {
            let mut sock = connect(&t).await;
            let mut b = hello();
            call(&mut b, 1, CLIENT_STREAM);
            header(&mut b, max_frame, FrameType::MESSAGE, 0, 1);
            b.put_u8(i as u8);
            assert!(send(&mut sock, &b, 5).await, "attacker {i} could not write");
            socks.push(sock);
        }
        // A second byte each, in a read of its own: the server now sizes its buffer for the
        // announced frame (reserving it whole only while the budget has room).
        tokio::time::sleep(Duration::from_millis(100)).await;
        for sock in &mut socks {
            assert!(send(sock, &[1], 5).await, "attacker could not write");
        }
        // Every attacker is connected and its call open (the frame is still waiting).
        let s = settle(&t.gauges, 10, "every attacker's call open", |s| {
            s.connections == N + 1 && s.open_calls >= N
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let s2 = t.gauges.snapshot();
        let grown = rss().saturating_sub(rss_before);
        eprintln!(
            "{N} announced {max_frame}-byte frames: reserved {} / {budget}, RSS +{} KiB",
            s2.reserved_bytes,
            grown / 1024
        );
        for s in [s, s2] {
            assert!(s.reserved_bytes <= budget, "over the budget: {s:?}");
            assert_eq!(s.memory_budget, budget);
        }
        assert!(
            grown < 128 * MIB,
            "RSS grew by {grown} bytes for {N} announced frames of {max_frame} bytes"
        );
        served(&t.good, "during").await;
        prober.stop().await;

        drop(socks);
        after_attack(t).await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// (c) Split messages announced and never sent.

/// 1000 calls on 4 connections each start a split message announcing 63 MiB (under the 64 MiB
/// `max_message_size`) and send 1 byte of it. Nothing may be reserved up front beyond the
/// memory budget: not in the gauges, and not in the process's address space (before the fix the
/// engine allocated `total_len` per call: 1000 × 63 MiB of address space).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announced_split_messages_that_never_come_stay_within_the_memory_budget() {
    serial(async {
        const CONNS: usize = 4;
        const CALLS: u32 = 250;
        let budget = 64 * MIB;
        let total = 63 * MIB as u32;
        let t = start(config(budget)).await;
        let prober = Prober::start(&t.good);
        let (rss_before, vm_before) = (rss(), vm_size());

        let mut socks = Vec::new();
        for _ in 0..CONNS {
            let mut sock = connect(&t).await;
            let mut b = hello();
            for i in 0..CALLS {
                let id = 2 * i + 1;
                call(&mut b, id, CLIENT_STREAM);
                encode_message_head(&mut b, CallId(id), false, Some(total), 1);
                b.put_u8(7);
            }
            assert!(send(&mut sock, &b, 5).await, "attacker could not write");
            socks.push(sock);
        }
        // Every call open — or, with the budget short, some refused (RESOURCE_EXHAUSTED):
        // either way the server has read everything after a few seconds.
        let until = Instant::now() + Duration::from_secs(5);
        let mut s = t.gauges.snapshot();
        while s.open_calls < CONNS * CALLS as usize && Instant::now() < until {
            assert!(s.reserved_bytes <= budget, "over the budget: {s:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
            s = t.gauges.snapshot();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let s2 = t.gauges.snapshot();
        let rss_grown = rss().saturating_sub(rss_before);
        let vm_grown = vm_size().saturating_sub(vm_before);
        eprintln!(
            "{} split messages of {total} bytes announced: reserved {}, RSS +{} KiB, VmSize +{} MiB",
            CONNS * CALLS as usize,
            s2.reserved_bytes,
            rss_grown / 1024,
            vm_grown / MIB
        );
        for s in [s, s2] {
            assert!(s.reserved_bytes <= budget, "over the budget: {s:?}");
        }
        assert!(rss_grown < 256 * MIB, "RSS grew by {rss_grown} bytes");
        assert!(
            vm_grown < 4096 * MIB,
            "{vm_grown} bytes of address space taken for messages that never came"
        );
        served(&t.good, "during").await;
        prober.stop().await;

        drop(socks);
        after_attack(t).await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// (d) Handshakes that never complete.

/// Connections that send nothing, or half a preface, are closed by `handshake_timeout`; the
/// gauges come back to the good client's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_that_never_complete_are_closed_by_the_handshake_timeout() {
    serial(async {
        let t = start(config(64 * MIB).with_handshake_timeout(Duration::from_millis(300))).await;
        let mut socks = Vec::new();
        for i in 0..40 {
            let mut sock = connect(&t).await;
            match i % 3 {
                0 => {}                                                // nothing at all
                1 => assert!(send(&mut sock, &PREFACE[..4], 5).await), // half a preface
                _ => assert!(send(&mut sock, &PREFACE, 5).await),      // a preface, no SETTINGS
            }
            socks.push(sock);
        }
        settle(&t.gauges, 10, "every attacker accepted", |s| {
            s.connections > 1
        })
        .await;
        served(&t.good, "during").await;
        for sock in socks {
            closed_by_server(sock, 10).await;
        }
        after_attack(t).await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// (e) Floods.

/// PINGs as fast as the socket takes them, with the answers never read: the PONGs stay within
/// the send buffer (the server stops reading), and the good client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_that_never_reads_the_pongs_is_bounded() {
    serial(async {
        let t = start(config(64 * MIB)).await;
        let max_send = Config::default().max_send_buffer();
        let prober = Prober::start(&t.good);
        let mut sock = connect(&t).await;
        let mut b = hello();
        for i in 0..400_000u64 {
            encode_ping(&mut b, false, &i.to_le_bytes());
        }
        // 8 MB of PINGs: 8 MB of PONGs is more than the send buffer; the server stops reading.
        let writer = tokio::spawn(async move {
            let _ = send(&mut sock, &b, 3).await;
            sock
        });
        let bound = max_send + 64 * 1024;
        let until = Instant::now() + Duration::from_secs(2);
        let mut peak = 0;
        while Instant::now() < until {
            let s = t.gauges.snapshot();
            assert!(s.unsent_bytes <= bound, "unsent over the bound: {s:?}");
            peak = peak.max(s.unsent_bytes);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        served(&t.good, "during").await;
        prober.stop().await;
        eprintln!("ping flood: unsent peak {peak} bytes");
        drop(within(10, writer).await.expect("writer"));
        after_attack(t).await;
    })
    .await;
}

/// Floods a connection for about `secs` with batches of frames written by `batch` (after
/// `setup`) while reading and dropping what the server sends, checking the gauges after each
/// write; returns the frames written and whether the server closed the connection.
async fn flood(
    t: &Target,
    setup: BytesMut,
    mut batch: impl FnMut(&mut BytesMut, u64),
    secs: f64,
) -> (u64, bool) {
    let sock = connect(t).await;
    let (r, mut w) = sock.into_split();
    let reader = drain(r);
    let mut b = setup;
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    let mut closed = false;
    while Instant::now() < until {
        for _ in 0..1000 {
            batch(&mut b, n);
            n += 1;
        }
        let wrote = tokio::time::timeout(Duration::from_secs(2), w.write_all(&b.split())).await;
        match wrote {
            Ok(Ok(())) if !reader.is_finished() => {}
            Ok(_) => {
                closed = true;
                break;
            }
            Err(_) => break, // the server stopped reading: bounded, nothing more to show
        }
        let s = t.gauges.snapshot();
        assert!(
            s.unsent_bytes <= t_bound() && s.reserved_bytes == 0,
            "flood made the server hold too much: {s:?}"
        );
    }
    drop(w);
    let _ = within(10, reader).await;
    (n, closed)
}

fn t_bound() -> usize {
    Config::default().max_send_buffer() + MIB
}

/// CREDIT frames on an open call, PINGs read back, and CANCELs of calls just started (Rapid
/// Reset): each flood lasts ~1.5 s; the server's open calls, unsent and reserved bytes stay
/// bounded and the good client is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credit_ping_and_rapid_reset_floods_leave_the_server_responsive() {
    serial(async {
        let t = start(config(64 * MIB)).await;
        let prober = Prober::start(&t.good);

        // PINGs, answers read.
        let (pings, _) = flood(
            &t,
            hello(),
            |b, n| encode_ping(b, false, &n.to_le_bytes()),
            1.5,
        )
        .await;
        served(&t.good, "after pings").await;

        // CREDIT of 1 byte, again and again, on a call waiting in its handler.
        let mut setup = hello();
        unary_call(&mut setup, 1, SLOW, b"credit");
        let (credits, _) = flood(&t, setup, |b, _| encode_credit(b, CallId(1), 1), 1.5).await;
        served(&t.good, "after credits").await;

        // Rapid Reset: a call started and cancelled at once, again and again.
        let max_calls = Config::default().max_concurrent_calls() as usize;
        let gauges = t.gauges.clone();
        let peak_calls = Arc::new(AtomicUsize::new(0));
        let peak = peak_calls.clone();
        let watcher = tokio::spawn(async move {
            loop {
                let s = gauges.snapshot();
                peak.fetch_max(s.open_calls, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let (resets, _) = flood(
            &t,
            hello(),
            |b, n| {
                let id = (2 * n + 1) as u32;
                unary_call(b, id, SLOW, b"reset");
                encode_cancel(b, CallId(id), Code::Cancelled);
            },
            1.5,
        )
        .await;
        watcher.abort();
        let peak_calls = peak_calls.load(Ordering::Relaxed);
        assert!(
            peak_calls <= max_calls + 1,
            "open calls {peak_calls} over max_concurrent_calls"
        );
        served(&t.good, "after resets").await;
        let ok = prober.stop().await;
        eprintln!(
            "floods: {pings} PINGs, {credits} CREDITs, {resets} start+cancel (peak {peak_calls} open calls); good client {ok} calls"
        );
        after_attack(t).await;
    })
    .await;
}

/// Once the engine caps control frames per connection, a peer that floods PINGs (reading the
/// answers) is disconnected instead of being answered for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_is_disconnected_by_the_engine_caps() {
    serial(async {
        let t = start(config(64 * MIB)).await;
        let (_, closed) = flood(
            &t,
            hello(),
            |b, n| encode_ping(b, false, &n.to_le_bytes()),
            10.0,
        )
        .await;
        assert!(closed, "a PING flood went on for 10 s");
        served(&t.good, "after").await;
        after_attack(t).await;
    })
    .await;
}
