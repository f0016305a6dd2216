//! Peer `raw` / `raw-uds`: the kernel's floor. Blocking std sockets (TCP_NODELAY on TCP), a
//! length-prefixed request/reply, one server thread per connection, the client on the main
//! thread (one thread per connection for throughput). No framework, no allocation per call.
//!
//! Request frame: `u32 LE length` (of what follows) + `u8 op` + body. Reply frame: `u32 LE
//! length` + body. Ops: 0 echo (reply = body), 1 answer (body = i32 n, reply = 41 + n), 2 blob
//! (body = u32 size, reply = the pool's first `size` bytes), 3 structs (reply = the students,
//! protobuf-encoded once at start: the floor moves the same bytes but decodes nothing).
//! NymphRPC calls echo the value's bytes.
//!
//! `--shm` is `raw-shm`: the same frames through a shared-memory ring per direction (a memfd
//! mapped twice, as two processes would) with topspin's `shm://` wake-up protocol — spin up to
//! 50 µs after the last progress, then announce sleeping in the header and block on a Unix
//! socket for a wake byte the other side sends only when it sees the announcement. The floor
//! under `topspin-shm`.
//!
//! Built by the `topspin-bench-layered` package (feature `layered`) as
//! `topspin-bench-raw-layered`: `--tls` is `raw-tls` (the same frames over blocking rustls, ring
//! provider: the TLS floor) and `--ws` is `raw-ws` (the same frames in binary messages of
//! blocking tungstenite, the crate topspin's WebSocket uses: the WebSocket floor).

use bytes::Bytes;
use clap::{CommandFactory, Parser};
use prost::Message;
use std::io::{IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};
use topspin_bench_common::{
    self as common, blob_pool, check_blob, check_echo, check_eq, pb, Cmd, Input, Outcome, Series,
    SyncCall,
};

#[cfg(feature = "layered")]
#[path = "../../peers/layered/src/pki.rs"]
mod pki;

const OP_ECHO: u8 = 0;
const OP_ANSWER: u8 = 1;
const OP_BLOB: u8 = 2;
const OP_STRUCTS: u8 = 3;

trait Stream: Read + Write + Send + 'static {}
impl<T: Read + Write + Send + 'static> Stream for T {}

fn write_all_vectored(s: &mut impl Write, bufs: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    let mut bufs = bufs;
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let n = s.write_vectored(bufs)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

fn structs_encoded() -> &'static Bytes {
    static E: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    E.get_or_init(|| {
        pb::StructsReply {
            students: common::students().to_vec(),
        }
        .encode_to_vec()
        .into()
    })
}

/// One connection's server loop: reads as much as is there, answers every complete request,
/// writes the replies of one read together.
fn serve_conn(mut s: impl Stream) {
    let mut buf = vec![0u8; 64 << 10];
    let mut filled = 0usize;
    let mut out: Vec<u8> = Vec::with_capacity(64 << 10);
    loop {
        if filled == buf.len() {
            let l = buf.len() * 2;
            buf.resize(l, 0);
        }
        let n = match s.read(&mut buf[filled..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        filled += n;
        let mut pos = 0;
        while filled - pos >= 4 {
            let len = u32::from_le_bytes(buf[pos..pos + 4].try_into().unwrap()) as usize;
            if filled - pos - 4 < len {
                if 4 + len > buf.len() {
                    // Make room for the whole frame, so the next reads complete it.
                    buf.copy_within(pos..filled, 0);
                    filled -= pos;
                    pos = 0;
                    buf.resize(4 + len, 0);
                }
                break;
            }
            let op = buf[pos + 4];
            let body = &buf[pos + 5..pos + 4 + len];
            let big: Option<&[u8]> = match op {
                OP_ECHO => {
                    if body.len() > 64 << 10 {
                        Some(body)
                    } else {
                        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
                        out.extend_from_slice(body);
                        None
                    }
                }
                OP_ANSWER => {
                    let n = i32::from_le_bytes(body[..4].try_into().unwrap());
                    out.extend_from_slice(&4u32.to_le_bytes());
                    out.extend_from_slice(&(41 + n).to_le_bytes());
                    None
                }
                OP_BLOB => {
                    let size = u32::from_le_bytes(body[..4].try_into().unwrap()) as usize;
                    Some(&blob_pool()[..size])
                }
                OP_STRUCTS => Some(&structs_encoded()[..]),
                _ => return,
            };
            if let Some(big) = big {
                let hdr = (big.len() as u32).to_le_bytes();
                let r = write_all_vectored(
                    &mut s,
                    &mut [IoSlice::new(&out), IoSlice::new(&hdr), IoSlice::new(big)],
                );
                out.clear();
                if r.is_err() {
                    return;
                }
            }
            pos += 4 + len;
        }
        if !out.is_empty() {
            if s.write_all(&out).is_err() {
                return;
            }
            out.clear();
        }
        buf.copy_within(pos..filled, 0);
        filled -= pos;
    }
}

struct Client<S> {
    s: S,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
}

impl<S: Stream> Client<S> {
    fn new(s: S) -> Self {
        Client {
            s,
            rbuf: Vec::with_capacity(64 << 10),
            wbuf: Vec::with_capacity(64 << 10),
        }
    }

    fn request(&mut self, op: u8, body: &[u8]) -> Result<&[u8], String> {
        let e = |e: std::io::Error| e.to_string();
        let hdr = ((body.len() + 1) as u32).to_le_bytes();
        if body.len() <= 64 << 10 {
            self.wbuf.clear();
            self.wbuf.extend_from_slice(&hdr);
            self.wbuf.push(op);
            self.wbuf.extend_from_slice(body);
            self.s.write_all(&self.wbuf).map_err(e)?;
        } else {
            write_all_vectored(
                &mut self.s,
                &mut [IoSlice::new(&hdr), IoSlice::new(&[op]), IoSlice::new(body)],
            )
            .map_err(e)?;
        }
        // One read takes header and body together when they are there (the floor's 2
        // syscalls per side and call); strictly request/reply, so nothing is left over.
        if self.rbuf.len() < 64 << 10 {
            self.rbuf.resize(64 << 10, 0);
        }
        let mut have = 0;
        let len = loop {
            let n = self.s.read(&mut self.rbuf[have..]).map_err(e)?;
            if n == 0 {
                return Err("server closed the connection".into());
            }
            have += n;
            if have >= 4 {
                let len = u32::from_le_bytes(self.rbuf[..4].try_into().unwrap()) as usize;
                if have >= 4 + len {
                    break len;
                }
                if self.rbuf.len() < 4 + len {
                    self.rbuf.resize(4 + len, 0);
                }
            }
        };
        Ok(&self.rbuf[4..4 + len])
    }

    /// Throughput/burst: keeps `in_flight` 20-byte echoes outstanding until `total` are done
    /// or `deadline`; every read's completed replies are replaced in one write.
    fn pipelined(
        &mut self,
        in_flight: usize,
        total: u64,
        deadline: Instant,
    ) -> Result<u64, String> {
        let e = |e: std::io::Error| e.to_string();
        let payload = common::payload(20);
        let frame_len = 4 + 1 + payload.len();
        let reply_len = 4 + payload.len();
        let fill = |w: &mut Vec<u8>, k: usize| {
            w.clear();
            for _ in 0..k {
                w.extend_from_slice(&((payload.len() + 1) as u32).to_le_bytes());
                w.push(OP_ECHO);
                w.extend_from_slice(&payload);
            }
        };
        let first = (in_flight as u64).min(total) as usize;
        self.wbuf.reserve(frame_len * in_flight);
        fill(&mut self.wbuf, first);
        self.s.write_all(&self.wbuf).map_err(e)?;
        let (mut sent, mut done) = (first as u64, 0u64);
        if self.rbuf.len() < 64 << 10 {
            self.rbuf.resize(64 << 10, 0);
        }
        let mut have = 0usize;
        while done < sent {
            let n = self.s.read(&mut self.rbuf[have..]).map_err(e)?;
            if n == 0 {
                return Err("server closed".into());
            }
            have += n;
            let k = have / reply_len;
            let rest = have % reply_len;
            self.rbuf.copy_within(k * reply_len..have, 0);
            have = rest;
            done += k as u64;
            if sent < total && Instant::now() < deadline {
                let more = (k as u64).min(total - sent) as usize;
                if more > 0 {
                    fill(&mut self.wbuf, more);
                    self.s.write_all(&self.wbuf).map_err(e)?;
                    sent += more as u64;
                }
            }
        }
        Ok(done)
    }
}

impl<S: Stream> SyncCall for Client<S> {
    fn call(&mut self, input: &Input, check: bool) -> Result<(), String> {
        match input {
            Input::Echo(b) | Input::NBlob(b) => {
                let got = self.request(OP_ECHO, b)?;
                check_echo(got, b, check)
            }
            Input::Answer(n) => {
                let got = self.request(OP_ANSWER, &n.to_le_bytes())?;
                let v = i32::from_le_bytes(got.try_into().map_err(|_| "answer: bad length")?);
                check_eq("answer", v, 41 + n)
            }
            Input::Blob(size) => {
                let got = self.request(OP_BLOB, &size.to_le_bytes())?;
                check_blob(got, *size, check)
            }
            Input::Structs => {
                let want = structs_encoded();
                let got = self.request(OP_STRUCTS, &[])?;
                check_echo(got, want, check)
            }
            Input::U32(v) => {
                let got = self.request(OP_ECHO, &v.to_le_bytes())?;
                let g = u32::from_le_bytes(got.try_into().map_err(|_| "u32: bad length")?);
                check_eq("nymph_uint32", g, *v)
            }
            Input::F64(v) => {
                let got = self.request(OP_ECHO, &v.to_le_bytes())?;
                let g = f64::from_le_bytes(got.try_into().map_err(|_| "f64: bad length")?);
                check_eq("nymph_double", g, *v)
            }
            Input::Array(vals) => {
                // The values as they sit in memory (little-endian on this machine).
                let mut body = Vec::with_capacity(vals.len() * 4);
                for v in vals {
                    body.extend_from_slice(&v.to_le_bytes());
                }
                let got = self.request(OP_ECHO, &body)?;
                let back: Vec<u32> = got
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                common::check_array(&back, vals)
            }
        }
    }
}

fn run_pipelined<S: Stream>(clients: &mut [Client<S>], cmd: &Cmd) -> Outcome {
    let conns = cmd.connections.clamp(1, clients.len());
    let per = cmd.in_flight.max(1);
    if cmd.workload == "burst" {
        // 8 calls written at once, then the 8 replies read.
        let c = &mut clients[0];
        if let Err(e) = c.call(&Input::Echo(common::payload(20)), true) {
            return Outcome::failed(e);
        }
        let wd = Instant::now() + Duration::from_millis(cmd.warmup_ms);
        for _ in 0..cmd.warmup {
            if let Err(e) = c.pipelined(8, 8, wd + Duration::from_secs(60)) {
                return Outcome::failed(e);
            }
            if Instant::now() >= wd {
                break;
            }
        }
        let mut s = Series::start(cmd);
        let deadline = Instant::now() + Duration::from_millis(cmd.max_ms);
        let mut calls = 0;
        for _ in 0..cmd.iters.max(1) {
            let t = Instant::now();
            match c.pipelined(8, 8, deadline + Duration::from_secs(60)) {
                Ok(n) => calls += n,
                Err(e) => return Outcome::failed(e),
            }
            let e = Instant::now();
            s.push((e - t) / 8);
            if e >= deadline {
                break;
            }
        }
        return s.finish(calls);
    }
    if let Err(e) = clients[0].call(&Input::Echo(common::payload(20)), true) {
        return Outcome::failed(e);
    }
    let mut out = Outcome::default();
    for phase in 0..2 {
        let (ms, cap) = if phase == 0 {
            (cmd.warmup_ms, cmd.warmup as u64 * per as u64)
        } else {
            (cmd.max_ms, cmd.iters as u64 * per as u64)
        };
        let deadline = Instant::now() + Duration::from_millis(ms);
        let series = (phase == 1).then(|| Series::start(cmd));
        let results: Vec<Result<u64, String>> = std::thread::scope(|sc| {
            let hs: Vec<_> = clients
                .iter_mut()
                .take(conns)
                .map(|c| sc.spawn(move || c.pipelined(per, cap, deadline)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("client thread"))
                .collect()
        });
        let mut total = 0;
        for r in results {
            match r {
                Ok(n) => total += n,
                Err(e) => return Outcome::failed(e),
            }
        }
        if let Some(s) = series {
            out = s.finish(total);
        }
    }
    out
}

fn run<S: Stream>(clients: &mut [Client<S>], cmd: &Cmd) -> Outcome {
    match cmd.workload.as_str() {
        "throughput" | "burst" => run_pipelined(clients, cmd),
        _ => common::run_sync(&mut clients[0], cmd),
    }
}

const CONNS: usize = 4;

/// `raw-shm`: a blocking byte stream over two shared-memory rings, with the wake-up protocol of
/// topspin's `shm://` transport (docs/protocol.md, "Shared memory"): the floor under
/// `topspin-shm`. Both ends are in this process (as every raw system's are); each maps the memfd
/// on its own, as two processes would.
#[cfg(not(feature = "layered"))]
mod shm {
    use std::io::{self, Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    const HEADER: usize = 4096;
    const C2S: usize = 0;
    const S2C: usize = 1024;
    const HEAD: usize = 0;
    const CLOSED: usize = 8;
    const TAIL: usize = 128;
    const READER_WAITING: usize = 256;
    const WRITER_WAITING: usize = 384;
    /// As topspin's `shm::SPIN`, `SPIN_GAP`, `SPIN_BACKOFF`.
    const SPIN: Duration = Duration::from_micros(50);
    const SPIN_GAP: Duration = Duration::from_micros(10);
    const SPIN_BACKOFF: Duration = Duration::from_millis(2);
    /// As topspin's `shm::RING`.
    pub const RING: usize = 1 << 21;

    pub struct ShmStream {
        map: *mut u8,
        len: usize,
        ring: usize,
        tx: usize,
        rx: usize,
        tx_base: usize,
        rx_base: usize,
        tx_head: u64,
        rx_tail: u64,
        sock: UnixStream,
        spin_off_until: Option<Instant>,
        spin_fails: u32,
        peer_asleep: bool,
    }

    // SAFETY: the mapping is owned by the stream and accessed through atomics and copies.
    unsafe impl Send for ShmStream {}

    fn map(fd: &std::os::fd::OwnedFd, len: usize) -> *mut u8 {
        // SAFETY: a fresh shared mapping of the memfd, which is `len` long.
        unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                fd,
                0,
            )
        }
        .expect("mmap")
        .cast()
    }

    /// A connected pair: (client, server).
    pub fn pair() -> (ShmStream, ShmStream) {
        let len = HEADER + 2 * RING;
        let fd =
            rustix::fs::memfd_create("raw-shm", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd");
        rustix::fs::ftruncate(&fd, len as u64).expect("ftruncate");
        let (a, b) = UnixStream::pair().expect("socketpair");
        let end = |sock, server: bool| {
            let (tx, rx) = if server { (S2C, C2S) } else { (C2S, S2C) };
            let base = |d| HEADER + if d == C2S { 0 } else { RING };
            ShmStream {
                map: map(&fd, len),
                len,
                ring: RING,
                tx,
                rx,
                tx_base: base(tx),
                rx_base: base(rx),
                tx_head: 0,
                rx_tail: 0,
                sock,
                spin_off_until: None,
                spin_fails: 0,
                peer_asleep: false,
            }
        };
        (end(a, false), end(b, true))
    }

    impl ShmStream {
        fn u64_at(&self, off: usize) -> &AtomicU64 {
            // SAFETY: an aligned word of the header, accessed atomically by both ends.
            unsafe { &*self.map.add(off).cast::<AtomicU64>() }
        }
        fn u32_at(&self, off: usize) -> &AtomicU32 {
            // SAFETY: as above.
            unsafe { &*self.map.add(off).cast::<AtomicU32>() }
        }
        fn wake_if_waiting(&self, off: usize) -> bool {
            fence(Ordering::SeqCst);
            let f = self.u32_at(off);
            let asleep = f.load(Ordering::Relaxed) != 0 && f.swap(0, Ordering::AcqRel) != 0;
            if asleep {
                let _ = rustix::net::send(
                    &self.sock,
                    &[1],
                    rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL,
                );
            }
            asleep
        }
        /// Spins up to SPIN, then sleeps until woken, while `ready` is false. `Ok(false)`:
        /// the other end is gone. As topspin's transport: a spin that runs out, or whose checks
        /// are more than SPIN_GAP apart (this thread was preempted: the CPUs are contended),
        /// fails; after `n` failures in a row no spin starts for SPIN_BACKOFF × 2^(n−1) (at
        /// most 64×); a spin that sees the other end's progress resets the count.
        fn wait(&mut self, flag: usize, ready: impl Fn(&Self) -> bool) -> io::Result<bool> {
            let start = Instant::now();
            let mut last = start;
            let mut spinning = self.spin_off_until.is_none_or(|t| start >= t);
            loop {
                if ready(self) {
                    if spinning {
                        self.spin_fails = 0;
                    }
                    return Ok(true);
                }
                if spinning {
                    let now = Instant::now();
                    if now - last <= SPIN_GAP && now - start < SPIN {
                        last = now;
                        std::hint::spin_loop();
                        continue;
                    }
                    spinning = false;
                    // Running out while the peer had to be woken is no failure (as topspin's).
                    if now - last > SPIN_GAP || !self.peer_asleep {
                        self.spin_fails = (self.spin_fails + 1).min(7);
                        self.spin_off_until =
                            Some(now + SPIN_BACKOFF * (1 << (self.spin_fails - 1)));
                    }
                }
                let f = self.u32_at(flag);
                f.store(1, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                if ready(self) {
                    f.store(0, Ordering::Relaxed);
                    return Ok(true);
                }
                let mut b = [0u8; 64];
                let (n, _) =
                    rustix::net::recv(&self.sock, &mut b, rustix::net::RecvFlags::empty())?;
                if n == 0 {
                    return Ok(false);
                }
            }
        }

        fn avail(&self) -> usize {
            let h = self.u64_at(self.rx + HEAD).load(Ordering::Acquire);
            h.wrapping_sub(self.rx_tail) as usize
        }
        fn room(&self) -> usize {
            let t = self.u64_at(self.tx + TAIL).load(Ordering::Acquire);
            self.ring - self.tx_head.wrapping_sub(t) as usize
        }
    }

    impl Read for ShmStream {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let closed = |s: &Self| s.u32_at(s.rx + CLOSED).load(Ordering::Acquire) != 0;
            if !self.wait(self.rx + READER_WAITING, |s| s.avail() > 0 || closed(s))? {
                return Ok(0);
            }
            let n = self.avail().min(buf.len());
            let off = (self.rx_tail as usize) & (self.ring - 1);
            let first = n.min(self.ring - off);
            // SAFETY: offsets within the receive ring (a power of two), inside the mapping.
            unsafe {
                let src = self.map.add(self.rx_base);
                std::ptr::copy_nonoverlapping(src.add(off), buf.as_mut_ptr(), first);
                std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr().add(first), n - first);
            }
            self.rx_tail += n as u64;
            self.u64_at(self.rx + TAIL)
                .store(self.rx_tail, Ordering::Release);
            self.wake_if_waiting(self.rx + WRITER_WAITING);
            Ok(n)
        }
    }

    impl Write for ShmStream {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if buf.is_empty() {
                return Ok(0);
            }
            if !self.wait(self.tx + WRITER_WAITING, |s| s.room() > 0)? {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            let n = self.room().min(buf.len());
            let off = (self.tx_head as usize) & (self.ring - 1);
            let first = n.min(self.ring - off);
            // SAFETY: offsets within the send ring, inside the mapping.
            unsafe {
                let dst = self.map.add(self.tx_base);
                std::ptr::copy_nonoverlapping(buf.as_ptr(), dst.add(off), first);
                std::ptr::copy_nonoverlapping(buf.as_ptr().add(first), dst, n - first);
            }
            self.tx_head += n as u64;
            self.u64_at(self.tx + HEAD)
                .store(self.tx_head, Ordering::Release);
            self.wake_if_waiting(self.tx + READER_WAITING);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Drop for ShmStream {
        fn drop(&mut self) {
            self.u32_at(self.tx + CLOSED).store(1, Ordering::Release);
            self.wake_if_waiting(self.tx + READER_WAITING);
            let _ = rustix::net::shutdown(&self.sock, rustix::net::Shutdown::Write);
            // SAFETY: unmaps this end's own mapping, once; nothing refers into it any more.
            let _ = unsafe { rustix::mm::munmap(self.map.cast(), self.len) };
        }
    }
}

/// A blocking WebSocket as a byte stream: each write is one binary message (from a buffer
/// reclaimed in place, so no allocation per message), reads concatenate the messages.
#[cfg(feature = "layered")]
struct WsIo {
    ws: tungstenite::WebSocket<TcpStream>,
    pending: Bytes,
    out: bytes::BytesMut,
}

#[cfg(feature = "layered")]
impl WsIo {
    fn config() -> tungstenite::protocol::WebSocketConfig {
        tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(None)
            .max_frame_size(None)
    }
}

#[cfg(feature = "layered")]
impl Read for WsIo {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use tungstenite::{Error, Message};
        while self.pending.is_empty() {
            match self.ws.read() {
                Ok(Message::Binary(b)) => self.pending = b,
                Ok(Message::Close(_)) | Err(Error::ConnectionClosed | Error::AlreadyClosed) => {
                    return Ok(0)
                }
                Ok(_) => {}
                Err(Error::Io(e)) => return Err(e),
                Err(e) => return Err(std::io::Error::other(e)),
            }
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        bytes::Buf::advance(&mut self.pending, n);
        Ok(n)
    }
}

#[cfg(feature = "layered")]
impl Write for WsIo {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        for b in bufs {
            self.out.extend_from_slice(b);
        }
        let msg = self.out.split().freeze();
        let n = msg.len();
        self.ws
            .send(tungstenite::Message::Binary(msg))
            .map_err(std::io::Error::other)?;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.ws.flush().map_err(std::io::Error::other)
    }
}

/// `raw-tls` / `raw-ws`: the floor under topspin-tls and topspin-ws.
#[cfg(feature = "layered")]
fn layered_main(tls: bool) {
    use std::sync::Arc;
    let pki = pki::make();
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let server_cfg = Arc::new(pki.server_config(b"raw"));
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            s.set_nodelay(true).expect("nodelay");
            let cfg = server_cfg.clone();
            std::thread::spawn(move || {
                if tls {
                    let conn = rustls::ServerConnection::new(cfg).expect("TLS server");
                    serve_conn(rustls::StreamOwned::new(conn, s));
                } else if let Ok(ws) = tungstenite::accept_with_config(s, Some(WsIo::config())) {
                    serve_conn(WsIo {
                        ws,
                        pending: Bytes::new(),
                        out: bytes::BytesMut::new(),
                    });
                }
            });
        }
    });
    let tcp = || {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        s
    };
    if tls {
        let cfg = Arc::new(pki.client_config(b"raw"));
        let mut clients: Vec<_> = (0..CONNS)
            .map(|_| {
                let name = "localhost".try_into().expect("name");
                let conn = rustls::ClientConnection::new(cfg.clone(), name).expect("TLS client");
                Client::new(rustls::StreamOwned::new(conn, tcp()))
            })
            .collect();
        common::serve_commands("raw-tls", |cmd| run(&mut clients, cmd));
    } else {
        let mut clients: Vec<_> = (0..CONNS)
            .map(|_| {
                let (ws, _) = tungstenite::client::client_with_config(
                    "ws://localhost/",
                    tcp(),
                    Some(WsIo::config()),
                )
                .expect("WebSocket handshake");
                Client::new(WsIo {
                    ws,
                    pending: Bytes::new(),
                    out: bytes::BytesMut::new(),
                })
            })
            .collect();
        common::serve_commands("raw-ws", |cmd| run(&mut clients, cmd));
    }
}

/// The raw-socket floor: length-prefixed frames over blocking sockets, no framework (peer `raw`
/// over TCP by default). A topspin-bench peer: started by topspin-bench, it prints `ready NAME`,
/// then answers one JSON command per line of stdin until `quit`.
#[derive(Parser, Debug)]
#[command(name = env!("CARGO_BIN_NAME"))]
struct Cli {
    /// Over a Unix socket (`raw-uds`)
    #[arg(long)]
    uds: bool,
    /// Through a shared-memory ring per direction (`raw-shm`)
    #[arg(long, hide = cfg!(feature = "layered"))]
    shm: bool,
    /// Over blocking rustls (`raw-tls`; the topspin-bench-raw-layered build)
    #[arg(long, hide = cfg!(not(feature = "layered")))]
    tls: bool,
    /// In binary messages of blocking tungstenite (`raw-ws`; the topspin-bench-raw-layered
    /// build)
    #[arg(long, hide = cfg!(not(feature = "layered")))]
    ws: bool,
    #[command(flatten)]
    placement: common::placement::Placement,
}

fn main() {
    let cli = Cli::parse();
    let (build, unbuilt) = if cfg!(feature = "layered") {
        ("topspin-bench-raw-layered", [("--shm", cli.shm)])
    } else {
        ("topspin-bench-raw", [("--tls or --ws", cli.tls || cli.ws)])
    };
    if let Some((flag, _)) = unbuilt.iter().find(|f| f.1) {
        Cli::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                format!("{flag} is not in the {build} build"),
            )
            .exit();
    }
    common::placement::init(cli.placement);
    #[cfg(feature = "layered")]
    if cli.tls || cli.ws {
        return layered_main(cli.tls);
    }
    let uds = cli.uds;
    common::blob_pool();
    structs_encoded();
    #[cfg(not(feature = "layered"))]
    if cli.shm {
        let mut clients: Vec<_> = (0..CONNS)
            .map(|_| {
                let (c, s) = shm::pair();
                std::thread::spawn(move || serve_conn(s));
                Client::new(c)
            })
            .collect();
        common::serve_commands("raw-shm", |cmd| run(&mut clients, cmd));
        return;
    }
    // The server: its threads in this process, or a child process of its own
    // (`--separate-processes`, see common::placement).
    let separate = common::placement::separate_server();
    if uds {
        let path = match separate {
            Some(p) => std::path::PathBuf::from(p),
            None => {
                let path = std::env::temp_dir()
                    .join(format!("topspin-bench-raw-{}.sock", std::process::id()));
                let _ = std::fs::remove_file(&path);
                let l = UnixListener::bind(&path).expect("bind unix socket");
                std::thread::spawn(move || {
                    for s in l.incoming().flatten() {
                        std::thread::spawn(move || serve_conn(s));
                    }
                });
                common::placement::server_only(&path.display().to_string());
                path
            }
        };
        let mut clients: Vec<_> = (0..CONNS)
            .map(|_| Client::new(UnixStream::connect(&path).expect("connect")))
            .collect();
        common::serve_commands("raw-uds", |cmd| run(&mut clients, cmd));
        let _ = std::fs::remove_file(&path);
    } else {
        let addr: std::net::SocketAddr = match separate {
            Some(a) => a.parse().expect("server address"),
            None => {
                let l = TcpListener::bind("127.0.0.1:0").expect("bind");
                let addr = l.local_addr().expect("addr");
                std::thread::spawn(move || {
                    for s in l.incoming().flatten() {
                        s.set_nodelay(true).expect("nodelay");
                        std::thread::spawn(move || serve_conn(s));
                    }
                });
                common::placement::server_only(&addr.to_string());
                addr
            }
        };
        let mut clients: Vec<_> = (0..CONNS)
            .map(|_| {
                let s = TcpStream::connect(addr).expect("connect");
                s.set_nodelay(true).expect("nodelay");
                Client::new(s)
            })
            .collect();
        common::serve_commands("raw", |cmd| run(&mut clients, cmd));
    }
}
