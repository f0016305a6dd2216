//! The shared-memory transport (`shm://name`, Linux): one ring per direction in a mapping
//! that both processes share, set up over a Unix socket that then stays open as the liveness
//! and wake-up channel. `docs/protocol.md` (§ "Shared memory") is the normative description;
//! this file follows it.
//!
//! - **Handshake** (version 2). The server listens on the abstract Unix socket
//!   `topspin-shm:<name>`. The client creates a memfd of `4096 + 2 × ring` bytes, seals it
//!   (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`: neither side can truncate it under the other,
//!   which would make the other's accesses fault with SIGBUS), maps it and sends the 16-byte
//!   hello (magic, ring size) with the memfd attached (`SCM_RIGHTS`). The server charges the
//!   largest rings to its memory budget at accept (or refuses), then, within the handshake
//!   timeout, checks the magic, the ring size (a power of two in [`MIN_RING`, `RING`]), that the
//!   memfd is sealed against shrinking and further seals and large enough, maps it and answers
//!   with the same 16 bytes and no descriptor. The client checks the answer. The topspin
//!   protocol then runs over the two rings exactly as over a socket. *Why the client passes
//!   the memfd:* a descriptor in flight is charged to its sender's user until the receiver
//!   reads it; a server that passed one to every client would let clients that never read
//!   fill its user's limit (`ETOOMANYREFS` for everyone after). Passed this way, what a client
//!   leaves in flight is its own.
//! - **Rings.** Each direction has a `head` (bytes ever written, written by the producer only)
//!   and a `tail` (bytes ever read, written by the consumer only), 64-bit and free-running;
//!   bytes live at `index mod ring`. Each side keeps its own index privately and never reads
//!   it back; the other side's index is **untrusted**: it is accepted only if the distance to
//!   ours is at most the ring size, otherwise the connection fails (`InvalidData`). Every
//!   offset into the ring is computed from our private index, so no value a peer writes into
//!   the mapping can make us read or write outside it; ring bytes are copied out exactly once
//!   (into the connection's read buffer) before anything parses them.
//! - **Wake-ups.** A side spins for up to [`SPIN`] after its last progress — cooperatively:
//!   its task asks to be polled again once the thread has nothing else to run (tokio's
//!   `yield_now` deferral), so other tasks of the thread are never delayed, and not at all
//!   while the CPUs are contended (see `spin`); from a spin's second check on, a reader also
//!   watches the ring on its thread for up to 3 µs before yielding (a scheduler turn costs
//!   1–2 µs: echo 20 B 2.6 → 2.1 µs) — then announces that it sleeps (`reader_waiting` / `writer_waiting` in the header), re-checks the ring and
//!   waits on the socket's readiness. The other side, after publishing an index, checks the
//!   flag and — only if it is set — clears it and sends one byte on the socket. Both sides
//!   order "store my index / flag; full fence; load the other's flag / index" (Dekker), so at
//!   least one of them sees the other's store: either the sleeper sees the new index and does
//!   not sleep, or the publisher sees the flag and wakes it.
//! - **Why the socket, not an eventfd, carries wake-ups.** An eventfd passed with `SCM_RIGHTS`
//!   shares its open file description, so a hostile peer could clear `O_NONBLOCK` on it and
//!   make our reads or writes of it block a runtime thread. The two ends of a socket are
//!   separate descriptions and `MSG_DONTWAIT` applies per call. The socket also reports the
//!   peer's death (EOF when its process exits, even after `kill -9`), so one descriptor is
//!   watched for both.
//! - **Peer death.** On EOF (or any error) of the socket, what the peer had published is still
//!   read, then the connection ends as on a socket's EOF (calls fail `UNAVAILABLE`); writes
//!   fail with `BrokenPipe`. The mapping is unmapped when the transport is dropped.

use super::{PeerAddr, PeerCredentials, Transport};
use bytes::BytesMut;
use std::future::Future;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The abstract socket name of `shm://<name>` is this prefix followed by the name.
pub(crate) const SOCKET_PREFIX: &str = "topspin-shm:";
/// The first 8 bytes of the client's hello and of the server's answer (version 2).
const MAGIC: [u8; 8] = *b"TSSHM\0\0\x02";
/// The hello and the answer: magic, ring size (u32 little-endian), 4 reserved bytes (zero).
const HELLO_LEN: usize = 16;
/// The ring size a client asks for in each direction. 2 MiB: a 2 MB message then crosses in
/// about one ring (measured: echo 2 MB took 1.25× as long with 1 MiB rings, about the same with
/// 4 MiB), at 4 MiB of memory per connection once the rings have gone round (pages are
/// allocated as first touched). It is also the largest ring a server accepts: a client cannot
/// make a server map or charge more.
pub(crate) const RING: usize = 1 << 21;
/// The smallest ring a server accepts.
const MIN_RING: usize = 4096;
/// The header in front of the two rings (one page).
const HEADER: usize = 4096;
/// The direction blocks in the header: client → server, server → client.
const C2S: usize = 0;
const S2C: usize = 1024;
/// Fields of a direction block: the producer's two words share a 128-byte line, the others have
/// one each (no false sharing between the producer's and the consumer's words, adjacent-line
/// prefetch included).
const HEAD: usize = 0; // u64, producer
const CLOSED: usize = 8; // u32, producer: no more bytes after `head`
const TAIL: usize = 128; // u64, consumer
const READER_WAITING: usize = 256; // u32, consumer sleeps until `head` moves
const WRITER_WAITING: usize = 384; // u32, producer sleeps until `tail` moves
/// How long a side spins (re-polling the ring) after its last progress before it sleeps: about
/// the cost of one cross-CPU wake-up on the VMs we measure on (~40 µs), so a reply that comes
/// within it costs no wake-up and one that does not costs at most twice the wake-up.
pub(crate) const SPIN: Duration = Duration::from_micros(50);
/// [`SPIN`], or `TOPSPIN_SHM_SPIN_US` (microseconds; `0` never spins) read once per process.
fn spin_time() -> Duration {
    static S: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *S.get_or_init(|| {
        std::env::var("TOPSPIN_SHM_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_micros)
            .unwrap_or(SPIN)
    })
}
/// Two checks of one spin further apart than this mean the thread was preempted (or busy): the
/// spin fails (see `ShmTransport::spin`; [`SPIN_BACKOFF`] is the first pause after a failure). A check costs ~1–2 µs (a turn of the scheduler with a
/// non-blocking poll of the I/O driver). Measured on the loaded 2-CPU VM (load average 5–9),
/// echo 20 B median: 9.5 µs with 10 µs here, 11 µs with 20 µs, 18–73 µs with 50 µs, 59 µs
/// with no back-off at all.
const SPIN_GAP: Duration = Duration::from_micros(25);
/// Longest a reader watches the ring on its thread per spin check (see `rx_busy_wait`).
const INLINE_SPIN: Duration = Duration::from_micros(3);
const SPIN_BACKOFF: Duration = Duration::from_millis(2);

/// Asks to be polled again soon. Polled once, `yield_now` hands the waker to the scheduler,
/// which wakes the task only after it ran every other ready task and polled the I/O driver:
/// a spin takes no turn from other tasks of the thread (nor from a current-thread runtime's
/// `block_on` future), and costs nothing when the thread has other work.
fn yield_once(cx: &mut Context<'_>) {
    let yielded = std::pin::pin!(tokio::task::yield_now());
    let _ = yielded.poll(cx);
}
/// Wake bytes drained per readiness check (a peer that floods them only costs us reads).
const DRAIN: usize = 256;

fn corrupt(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("shared-memory transport: {what} (peer is corrupt or hostile)"),
    )
}

/// A shared mapping, unmapped when dropped.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; every access to it goes through atomics (header) or
// copies at offsets computed from private indices (rings).
#[allow(unsafe_code)]
unsafe impl Send for Mapping {}

#[allow(unsafe_code)]
impl Mapping {
    fn new(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        use rustix::mm::{mmap, MapFlags, ProtFlags};
        // SAFETY: a fresh shared mapping of `len` bytes of `fd` at an address the kernel picks;
        // it aliases no Rust object. The caller made sure the file is at least `len` long and
        // cannot shrink (sealed), so no access within it faults.
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap: null"))?;
        Ok(Mapping { ptr, len })
    }

    /// The 64-bit word at `off` of the header.
    #[inline]
    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= HEADER && off % 8 == 0);
        // SAFETY: `off` is a constant offset inside the header (page-aligned mapping, 8-aligned
        // offset); the word is only ever accessed atomically, by both processes.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() }
    }

    #[inline]
    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= HEADER && off % 4 == 0);
        // SAFETY: as `u64_at`.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// Copies `src` into the ring at `base` (of size `ring`, a power of two), starting at
    /// `index mod ring`, wrapping around.
    #[inline]
    fn write_ring(&self, base: usize, ring: usize, index: u64, src: &[u8]) {
        let off = (index as usize) & (ring - 1);
        let first = src.len().min(ring - off);
        assert!(src.len() <= ring && base + ring <= self.len);
        // SAFETY: `off + first <= ring` and `src.len() - first <= off` (it wraps to the ring's
        // start), both inside `[base, base + ring)`, which is inside the mapping (asserted).
        // The producer owns these bytes until it publishes `head`; a hostile peer writing them
        // concurrently only changes what it receives.
        unsafe {
            let dst = self.ptr.as_ptr().add(base);
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst.add(off), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), dst, src.len() - first);
        }
    }

    /// Copies `dst.len()` bytes out of the ring at `base`, starting at `index mod ring`.
    #[inline]
    fn read_ring(&self, base: usize, ring: usize, index: u64, dst: &mut [MaybeUninit<u8>]) {
        let off = (index as usize) & (ring - 1);
        let first = dst.len().min(ring - off);
        assert!(dst.len() <= ring && base + ring <= self.len);
        // SAFETY: as `write_ring`; `dst` is private memory that the bytes are copied into once
        // (they are parsed only there, so a peer changing the ring meanwhile cannot make us
        // see two different values of one byte).
        let len = dst.len();
        unsafe {
            let src = self.ptr.as_ptr().add(base);
            let dst = dst.as_mut_ptr().cast::<u8>();
            std::ptr::copy_nonoverlapping(src.add(off), dst, first);
            std::ptr::copy_nonoverlapping(src, dst.add(first), len - first);
        }
    }
}

#[allow(unsafe_code)]
impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `Mapping::new` with this length and is unmapped once;
        // no reference into it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Where a side is in its spin before sleeping.
#[derive(Debug, Default)]
struct SpinState {
    /// When the current spin began (the first wait since the last progress).
    start: Option<Instant>,
    /// The previous check of the current spin.
    last: Option<Instant>,
    /// The spin ran out (or was cut short): sleep until the next progress.
    expired: bool,
    /// No spinning until then: recent spins failed.
    off_until: Option<Instant>,
    /// Spins that failed in a row (at most 7).
    fails: u32,
    /// Our last write had to wake the peer (it slept).
    peer_asleep: bool,
}

/// One side of a shared-memory connection.
#[derive(Debug)]
pub(crate) struct ShmTransport {
    map: Mapping,
    /// Ring size (a power of two), as this side decided (server) or checked (client) it.
    ring: usize,
    /// Header offsets of the direction blocks we produce into and consume from.
    tx: usize,
    rx: usize,
    /// Mapping offsets of the two rings.
    tx_base: usize,
    rx_base: usize,
    /// Our private indices: never read back from the mapping.
    tx_head: u64,
    rx_tail: u64,
    /// The liveness and wake-up socket, watched for read readiness only.
    sock: AsyncFd<UnixStream>,
    credentials: Option<PeerCredentials>,
    /// The spin before sleeping.
    spin: SpinState,
    /// We announced sleeping on rx data / tx room (the flag may still be set).
    rx_parked: bool,
    tx_parked: bool,
    /// The socket reported EOF or an error: the peer process is gone.
    peer_gone: bool,
    /// We closed our direction.
    shut: bool,
    /// The server's memfd, emptied when the connection ends, and the rings' charge to the
    /// memory budget.
    owned: Option<(OwnedFd, Charge)>,
}

/// Bytes taken from a memory budget, given back when dropped.
#[derive(Debug)]
struct Charge {
    budget: std::sync::Arc<topspin_proto::MemoryBudget>,
    bytes: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

impl Drop for ShmTransport {
    /// The server frees the memfd's pages (a hole punched over the whole file, size kept):
    /// a client that keeps its mapping (or the descriptor) after the connection pins no memory.
    fn drop(&mut self) {
        if let Some((fd, _)) = &self.owned {
            use rustix::fs::{fallocate, FallocateFlags};
            // The socket ends first, so a client that reads the zeroed pages finds its end of
            // stream and reports the connection closed, not a corrupt peer.
            let _ = rustix::net::shutdown(self.sock.get_ref(), rustix::net::Shutdown::Both);
            let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            let _ = fallocate(fd, flags, 0, self.map.len as u64);
        }
    }
}

fn credentials_of(s: &UnixStream) -> Option<PeerCredentials> {
    rustix::net::sockopt::socket_peercred(s)
        .ok()
        .map(|c| PeerCredentials {
            uid: c.uid.as_raw(),
            gid: c.gid.as_raw(),
            pid: Some(c.pid.as_raw_nonzero().get()),
        })
}

/// Registers the socket with the reactor for read readiness (wake bytes, EOF) only.
#[allow(unsafe_code)]
fn register(sock: UnixStream) -> io::Result<AsyncFd<UnixStream>> {
    // SAFETY: `sock` owns its descriptor, which stays open and the same for as long as the
    // AsyncFd owns `sock` (tokio's registration contract).
    unsafe { AsyncFd::register_with_interest(sock, Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// The abstract socket address of `shm://name`.
pub(crate) fn socket_name(name: &str) -> String {
    format!("{SOCKET_PREFIX}{name}")
}

impl ShmTransport {
    fn new(map: Mapping, ring: usize, server: bool, sock: UnixStream) -> io::Result<ShmTransport> {
        sock.set_nonblocking(true)?;
        let credentials = credentials_of(&sock);
        let (tx, rx) = if server { (S2C, C2S) } else { (C2S, S2C) };
        let base = |dir| HEADER + if dir == C2S { 0 } else { ring };
        Ok(ShmTransport {
            tx_base: base(tx),
            rx_base: base(rx),
            map,
            ring,
            tx,
            rx,
            tx_head: 0,
            rx_tail: 0,
            sock: register(sock)?,
            credentials,
            spin: SpinState::default(),
            rx_parked: false,
            tx_parked: false,
            peer_gone: false,
            shut: false,
            owned: None,
        })
    }

    /// The client side: connect to `shm://name`'s socket, check who serves it, create, seal
    /// and map the memfd, send the hello with it, and wait for the server's answer. The caller
    /// bounds the time (handshake timeout).
    pub(crate) async fn connect(name: &str, users: &crate::LocalUsers) -> io::Result<ShmTransport> {
        let sock = super::socket::connect_abstract(&socket_name(name))?.into_std()?;
        // Whoever bound the name first gets the calls: only a server of an allowed user.
        users.check(&sock, "server")?;
        let (fd, map) = create_rings(name, RING)?;
        send_hello_with(&sock, RING, Some(&fd))?;
        // Ours is not needed past the mapping: the server punches the pages out at the end.
        drop(fd);
        let sock = register(sock)?;
        let (answer, passed) = read_hello(&sock, "the server").await?;
        drop(passed); // a server passes none; one that does has it closed
        if answer[..8] != MAGIC {
            return Err(corrupt(
                "bad answer (not a topspin shm:// server, or another version)",
            ));
        }
        if ring_of(&answer) != RING {
            return Err(corrupt("the server answered another ring size"));
        }
        ShmTransport::new(map, RING, false, sock.into_inner())
    }

    #[inline]
    fn closed_flag(&self, dir: usize) -> &AtomicU32 {
        self.map.u32_at(dir + CLOSED)
    }

    /// Bytes the peer has published and we have not read; checked against the ring size.
    #[inline]
    fn rx_available(&self) -> io::Result<usize> {
        let head = self.map.u64_at(self.rx + HEAD).load(Ordering::Acquire);
        let avail = head.wrapping_sub(self.rx_tail);
        if avail > self.ring as u64 {
            return Err(self.gone_or_corrupt("ring head out of range"));
        }
        Ok(avail as usize)
    }

    /// Free bytes in the ring we write; the peer's tail checked against the ring size.
    #[inline]
    fn tx_room(&self) -> io::Result<usize> {
        let tail = self.map.u64_at(self.tx + TAIL).load(Ordering::Acquire);
        let used = self.tx_head.wrapping_sub(tail);
        if used > self.ring as u64 {
            return Err(self.gone_or_corrupt("ring tail out of range"));
        }
        Ok(self.ring - used as usize)
    }

    /// An index out of range: a corrupt or hostile peer — or a server that went away, which
    /// shuts its socket down and then frees the pages (they read as zeros). The socket tells
    /// them apart: wake bytes are read and dropped (they mean nothing else), and an end of
    /// stream behind them is the peer leaving, reported as such.
    #[cold]
    fn gone_or_corrupt(&self, what: &str) -> io::Error {
        use rustix::net::{recv, RecvFlags};
        let mut b = [0u8; 64];
        for _ in 0..64 {
            match recv(self.sock.get_ref(), &mut b, RecvFlags::DONTWAIT) {
                Ok((0, _)) => {
                    return io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the shared-memory peer closed the connection",
                    )
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        corrupt(what)
    }

    /// Clears the peer's sleep flag at `off` and wakes it if it was set (the caller stored its
    /// index first). The fence pairs with the one in `park`.
    #[inline]
    /// Whether it sent a wake byte.
    fn wake_if_waiting(&self, off: usize) -> bool {
        fence(Ordering::SeqCst);
        let flag = self.map.u32_at(off);
        let asleep = flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::AcqRel) != 0;
        if asleep {
            // EAGAIN: the socket is full of wake bytes the peer has not read yet, so it is
            // awake anyway. Other errors: the peer is gone, which the read side reports.
            let _ = rustix::net::send(
                self.sock.get_ref(),
                &[1],
                rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL,
            );
        }
        asleep
    }

    /// Checks the socket: `Ready` after it woke us or reported the peer gone (the caller looks
    /// at the ring again), `Pending` with the task's waker registered.
    fn poll_sock(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.peer_gone {
            return Poll::Ready(());
        }
        loop {
            let mut guard = match self.sock.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(_)) => {
                    self.peer_gone = true;
                    return Poll::Ready(());
                }
                Poll::Pending => return Poll::Pending,
            };
            let mut buf = [0u8; DRAIN];
            match guard.try_io(|s| {
                rustix::net::recv(s.get_ref(), &mut buf, rustix::net::RecvFlags::DONTWAIT)
                    .map(|(n, _)| n)
                    .map_err(io::Error::from)
            }) {
                // EOF or an error: the peer closed its socket or its process ended.
                Ok(Ok(0)) | Ok(Err(_)) => {
                    self.peer_gone = true;
                    return Poll::Ready(());
                }
                Ok(Ok(_)) => return Poll::Ready(()), // woken
                Err(_would_block) => {}              // readiness cleared: poll again
            }
        }
    }

    /// Spins cooperatively: `true` (the task is polled again soon) while within the spin
    /// window, `false` when the caller should sleep. One window per wait: it starts at the
    /// first wait after progress and is not restarted until the next progress. Spinning only
    /// pays while both processes are on a CPU and the peer answers within the window: a spin
    /// whose checks are more than [`SPIN_GAP`] apart (this thread was preempted, or busy with
    /// other tasks: the CPUs are contended, and a spinner there only takes CPU time from the
    /// peer it waits for), or that runs out although the peer was awake, fails, and after `n` failures in a row no
    /// spin starts for `SPIN_BACKOFF × 2^(n−1)` (at most 64×); a spin that sees progress
    /// resets the count.
    #[inline]
    fn spin(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.may_spin() {
            return false;
        }
        yield_once(cx);
        true
    }

    /// Whether the spin window allows another check (see [`ShmTransport::spin`]); counts it.
    fn may_spin(&mut self) -> bool {
        if self.spin.expired {
            return false;
        }
        let now = Instant::now();
        if let Some(off) = self.spin.off_until {
            if now < off {
                return false;
            }
            self.spin.off_until = None;
        }
        let start = *self.spin.start.get_or_insert(now);
        let preempted = self
            .spin
            .last
            .is_some_and(|last| now.saturating_duration_since(last) > SPIN_GAP);
        let ran_out = now.saturating_duration_since(start) >= spin_time();
        if preempted || ran_out {
            self.spin.expired = true;
            // Running out while the peer had to be woken for what we last wrote says nothing
            // about spinning (its answer includes a wake-up); otherwise it is a failure.
            if preempted || !self.spin.peer_asleep {
                self.spin.fails = (self.spin.fails + 1).min(7);
                self.spin.off_until = Some(now + SPIN_BACKOFF * (1 << (self.spin.fails - 1)));
            }
            return false;
        }
        self.spin.last = Some(now);
        true
    }

    /// Within a spin, from its second check on (the first yielded, so every other task of
    /// the thread that was ready — a caller about to send its next call — has run since):
    /// watches the ring on this thread for at most [`INLINE_SPIN`] before handing the turn
    /// back to the scheduler, whose turn costs 1–2 µs, most of a small call's round trip
    /// here. `true` when bytes or the close arrived. Only when the process may use several
    /// CPUs (on one, the peer cannot run meanwhile).
    fn rx_busy_wait(&self) -> io::Result<bool> {
        if !crate::connection::several_cpus() {
            return Ok(false);
        }
        let start = Instant::now();
        loop {
            for _ in 0..32 {
                if self.rx_available()? > 0
                    || self.closed_flag(self.rx).load(Ordering::Acquire) != 0
                {
                    return Ok(true);
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= INLINE_SPIN {
                return Ok(false);
            }
        }
    }

    /// Bytes moved: the next wait spins again (a spin that was under way succeeded).
    #[inline]
    fn progressed(&mut self) {
        if self.spin.start.is_some() && !self.spin.expired {
            self.spin.fails = 0;
        }
        self.spin.start = None;
        self.spin.last = None;
        self.spin.expired = false;
    }

    /// Waits for bytes to read: `Ready(Ok(n))` with `n > 0` available, `Ready(Ok(0))` at the
    /// end (the peer closed its direction or is gone and everything it sent was read).
    fn poll_rx(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.rx_parked {
            self.rx_parked = false;
            self.map
                .u32_at(self.rx + READER_WAITING)
                .store(0, Ordering::Relaxed);
        }
        for _ in 0..WAKES_PER_POLL {
            // `closed` before `head`: the producer sets it after its last `head`.
            let closed = self.closed_flag(self.rx).load(Ordering::Acquire) != 0;
            let avail = self.rx_available()?;
            if avail > 0 {
                return Poll::Ready(Ok(avail));
            }
            if closed || self.peer_gone {
                return Poll::Ready(Ok(0));
            }
            if self.poll_sock(cx).is_ready() {
                // Woken: the peer's other index is checked too, so garbage there ends the
                // connection now rather than at our next write.
                self.tx_room()?;
                continue;
            }
            let again = self.spin.last.is_some();
            if self.may_spin() {
                if again && self.rx_busy_wait()? {
                    continue;
                }
                yield_once(cx);
                return Poll::Pending;
            }
            let flag = self.map.u32_at(self.rx + READER_WAITING);
            flag.store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.rx_available()? > 0 || self.closed_flag(self.rx).load(Ordering::Acquire) != 0 {
                flag.store(0, Ordering::Relaxed);
                continue;
            }
            self.rx_parked = true;
            return Poll::Pending; // the socket's readiness has the waker
        }
        yield_turn(cx)
    }

    /// Waits for room to write: `Ready(Ok(n))` with `n > 0` free bytes.
    fn poll_tx(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.tx_parked {
            self.tx_parked = false;
            self.map
                .u32_at(self.tx + WRITER_WAITING)
                .store(0, Ordering::Relaxed);
        }
        for _ in 0..WAKES_PER_POLL {
            if self.peer_gone {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "shared-memory peer is gone",
                )));
            }
            let room = self.tx_room()?;
            if room > 0 {
                return Poll::Ready(Ok(room));
            }
            if self.poll_sock(cx).is_ready() {
                continue;
            }
            if self.spin(cx) {
                return Poll::Pending;
            }
            let flag = self.map.u32_at(self.tx + WRITER_WAITING);
            flag.store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.tx_room()? > 0 {
                flag.store(0, Ordering::Relaxed);
                continue;
            }
            self.tx_parked = true;
            return Poll::Pending;
        }
        yield_turn(cx)
    }
}

/// A peer flooding wake bytes (a wake-up that finds nothing to do) gets this many re-checks
/// per poll; then the task yields its turn, so the flood cannot hold the thread.
const WAKES_PER_POLL: usize = 4;

/// Gives the task's turn back (polled again soon) after [`WAKES_PER_POLL`] empty wake-ups.
fn yield_turn<T>(cx: &mut Context<'_>) -> Poll<T> {
    cx.waker().wake_by_ref();
    Poll::Pending
}

impl Transport for ShmTransport {
    fn reads_alone(&self) -> bool {
        true
    }

    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_rx(cx).map_ok(|_| ())
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        let avail = match self.poll_rx(cx) {
            Poll::Ready(Ok(0)) => return Poll::Ready(Ok(0)), // the end: the peer closed or left
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        let spare = buf.spare_capacity_mut();
        let n = avail.min(spare.len());
        if n == 0 {
            // The caller reserves room first; reading nothing here would look like the end.
            return Poll::Ready(Err(io::Error::other("read buffer has no room")));
        }
        self.map
            .read_ring(self.rx_base, self.ring, self.rx_tail, &mut spare[..n]);
        #[allow(unsafe_code)]
        // SAFETY: `read_ring` wrote all `n` bytes of `spare[..n]`.
        unsafe {
            buf.set_len(buf.len() + n)
        };
        self.rx_tail = self.rx_tail.wrapping_add(n as u64);
        self.map
            .u64_at(self.rx + TAIL)
            .store(self.rx_tail, Ordering::Release);
        self.wake_if_waiting(self.rx + WRITER_WAITING);
        self.progressed();
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        if self.shut {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let room = match self.poll_tx(cx) {
            Poll::Ready(Ok(n)) => n,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        };
        let mut left = room.min(total);
        let mut head = self.tx_head;
        for b in bufs {
            if left == 0 {
                break;
            }
            let take = b.len().min(left);
            self.map
                .write_ring(self.tx_base, self.ring, head, &b[..take]);
            head = head.wrapping_add(take as u64);
            left -= take;
        }
        let n = head.wrapping_sub(self.tx_head) as usize;
        self.tx_head = head;
        self.map
            .u64_at(self.tx + HEAD)
            .store(head, Ordering::Release);
        self.spin.peer_asleep = self.wake_if_waiting(self.tx + READER_WAITING);
        self.progressed();
        Poll::Ready(Ok(n))
    }

    fn poll_flush(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(())) // a published `head` is all there is
    }

    fn poll_shutdown(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.shut {
            self.shut = true;
            self.closed_flag(self.tx).store(1, Ordering::Release);
            self.wake_if_waiting(self.tx + READER_WAITING);
        }
        Poll::Ready(Ok(()))
    }

    fn peer_addr(&self) -> PeerAddr {
        PeerAddr::Shm {
            credentials: self.credentials,
        }
    }
}

#[cfg(any(test, fuzzing))]
mod hostile;
#[cfg(any(test, fuzzing))]
pub(crate) use hostile::fuzz_rounds;
mod handshake;
use handshake::*;
pub(crate) use handshake::{dial, PendingShm};

#[cfg(test)]
mod tests;
