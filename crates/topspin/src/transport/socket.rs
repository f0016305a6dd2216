//! The socket transport: TCP (with TCP_NODELAY) and Unix domain sockets behind one type, used
//! through readiness and non-blocking calls so one task can read and write at once. The
//! crate's only readiness calls and raw descriptors live here.

use super::{PeerAddr, PeerCredentials, Transport};
use crate::address::Address;
use bytes::BytesMut;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::task::{ready, Context, Poll};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};

/// A connected socket, TCP or Unix.
#[derive(Debug)]
enum Sock {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl AsRawFd for Sock {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Sock::Tcp(s) => s.as_raw_fd(),
            Sock::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl AsFd for Sock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Sock::Tcp(s) => s.as_fd(),
            Sock::Unix(s) => s.as_fd(),
        }
    }
}

/// The send buffer a TCP connection to a peer on this host (loopback) asks for; Linux doubles
/// it for its bookkeeping, so at most ~512 KiB of a connection's data is in the kernel at once.
///
/// On loopback the sender's copy into the kernel and the receiver's copy out of it run on the
/// same machine, and when both fit in the CPU's cache together the second copy reads from the
/// cache. With the kernel's autotuned buffer (up to `tcp_wmem`'s 4 MiB) a large message went
/// into the kernel whole before the receiver copied any of it, and the receiver then read it
/// from memory; whether that happened varied per connection (measured here: a 1 MiB response
/// took either ~130 or ~300 µs for the whole life of a connection, pinned to one CPU, with
/// twice the kernel time and ~9 receive-queue coalesces per call in the slow case). With this
/// buffer, echo 2 MB took 0.57–0.65× the time of the autotuned one and blob 1–8 MiB about half,
/// while messages up to 512 KiB and small calls measured the same. Across a network the
/// buffer must cover the path's bandwidth × delay, so only loopback peers get it.
const LOOPBACK_SEND_BUFFER: usize = 256 * 1024;

/// Whether `ip` is this host: 127.0.0.0/8, `::1`, or an IPv4-mapped loopback address.
fn is_loopback(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
        std::net::IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// A connection's socket, used through readiness and non-blocking calls so one task can read
/// while its writes wait.
///
/// It is registered with the reactor for **read** readiness only while writes go through at
/// once: every write on a TCP or Unix socket later raises an `EPOLLOUT` edge (when the peer
/// acknowledges or reads), and with both interests each of them woke the reactor for nothing —
/// one `epoll_wait` per call and side (more on Unix sockets). Writes go straight to the
/// non-blocking socket; only when one would block is the same descriptor re-registered for
/// read and write readiness (two `epoll_ctl`, no new descriptor: a connection never needs a
/// second file descriptor, so it keeps working when the process is out of them), and back to
/// read only once writes have stopped waiting.
#[derive(Debug)]
pub(crate) struct SocketTransport {
    /// The registered socket; `None` only if re-registering it failed (the connection then
    /// reports that error and ends).
    sock: Option<AsyncFd<Sock>>,
    /// Whether the registration includes write readiness.
    write_watched: bool,
    /// Writes that completed without waiting since write readiness was last needed.
    idle_writes: u32,
    /// The peer's credentials (Unix sockets), read once when the connection is made.
    credentials: Option<PeerCredentials>,
}

/// Registers `sock` with the reactor for `interest`; on failure the socket is dropped (closed).
#[allow(unsafe_code)]
fn register(sock: Sock, interest: Interest) -> io::Result<AsyncFd<Sock>> {
    // SAFETY: `sock` owns its descriptor, which stays open and the same for as long as the
    // AsyncFd owns `sock` (tokio's registration contract).
    unsafe { AsyncFd::register_with_interest(sock, interest) }.map_err(|e| e.into_parts().1)
}

fn gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the socket could not be re-registered with the reactor",
    )
}

impl SocketTransport {
    fn new(sock: Sock, credentials: Option<PeerCredentials>) -> io::Result<SocketTransport> {
        Ok(SocketTransport {
            sock: Some(register(sock, Interest::READABLE)?),
            write_watched: false,
            idle_writes: 0,
            credentials,
        })
    }

    pub(crate) fn from_tcp(s: TcpStream) -> io::Result<SocketTransport> {
        s.set_nodelay(true)?;
        if s.peer_addr().is_ok_and(|a| is_loopback(a.ip())) {
            // Best effort: a socket that refuses the size keeps the kernel's autotuning.
            let _ = socket2::SockRef::from(&s).set_send_buffer_size(LOOPBACK_SEND_BUFFER);
        }
        // into_std leaves the socket non-blocking.
        SocketTransport::new(Sock::Tcp(s.into_std()?), None)
    }

    pub(crate) fn from_unix(s: UnixStream) -> io::Result<SocketTransport> {
        let credentials = s.peer_cred().ok().map(|c| PeerCredentials {
            uid: c.uid(),
            gid: c.gid(),
            pid: c.pid(),
        });
        SocketTransport::new(Sock::Unix(s.into_std()?), credentials)
    }

    pub(crate) async fn connect(addr: &Address) -> io::Result<SocketTransport> {
        match addr {
            Address::Tcp(hp) => SocketTransport::from_tcp(TcpStream::connect(hp.as_str()).await?),
            Address::Unix(p) => SocketTransport::from_unix(UnixStream::connect(p).await?),
            Address::UnixAbstract(name) => SocketTransport::from_unix(connect_abstract(name)?),
            other => Err(super::not_a_socket_address(other)),
        }
    }

    #[inline]
    fn fd(&self) -> io::Result<&AsyncFd<Sock>> {
        self.sock.as_ref().ok_or_else(gone)
    }

    /// Re-registers the socket's one descriptor with `interest` (deregister, register: two
    /// `epoll_ctl`). Readiness that was already there is reported again by the new
    /// registration (epoll reports a ready descriptor when it is added). The waker the old
    /// registration held for read readiness goes with it, so the task's (`cx`) is registered
    /// with the new one at once — or, if the socket is readable already, the task is woken:
    /// the loop need not poll the read side again after a write re-registered (and a write
    /// made outside the task, `Driver::act_outside`, cannot leave the task deaf).
    fn reregister(&mut self, interest: Interest, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(fd) = self.sock.take() else {
            return Err(gone());
        };
        self.write_watched = interest.is_writable();
        let fd = self.sock.insert(register(fd.into_inner(), interest)?);
        if let Poll::Ready(r) = fd.poll_read_ready(cx) {
            drop(r?); // readable now: the readiness stays set, and the task looks again
            cx.waker().wake_by_ref();
        }
        Ok(())
    }

    /// Write readiness: the registration takes it on first use after a write would have
    /// blocked.
    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.idle_writes = 0;
        if !self.write_watched {
            self.reregister(Interest::READABLE | Interest::WRITABLE, cx)?;
        }
        self.fd()?.poll_write_ready(cx).map_ok(|_guard| ())
    }

    /// Reads into `buf`'s spare capacity. When the read returns less than was offered, the
    /// socket is drained: its readiness is cleared in the same step, which saves the extra
    /// `read` that would otherwise only return `EAGAIN` on every wake-up (measured: one per
    /// call per side). Race-free: tokio snapshots readiness before the closure runs, so data
    /// that arrives after the `recv` raises a new readiness event that is not cleared.
    #[inline]
    fn try_read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        let mut got = 0;
        let r = self.fd()?.try_io(Interest::READABLE, |s| {
            recv_drained(socket2::SockRef::from(s), buf, &mut got)
        });
        match r {
            // `got` is set only with the short read's `WouldBlock` (no need to ask its kind).
            Err(_) if got > 0 => Ok(got),
            other => other,
        }
    }

    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let fd = self.fd()?;
        let write = |s: &Sock| socket2::SockRef::from(s).send_vectored(bufs);
        if self.write_watched {
            // While write readiness is watched, writes go through it so that a write that
            // would block clears it (and the task waits for the next edge).
            fd.try_io(Interest::WRITABLE, write)
        } else {
            write(fd.get_ref())
        }
    }
}

impl Transport for SocketTransport {
    fn reads_alone(&self) -> bool {
        true
    }

    #[inline]
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Dropping the guard leaves the readiness set; `try_read_buf` clears it.
        self.fd()?.poll_read_ready(cx).map_ok(|_guard| ())
    }

    /// Reads at once (the caller polled readiness first); only when the socket turns out
    /// empty does it wait for readiness.
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        loop {
            match self.try_read_buf(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return Poll::Ready(r),
            }
            // Dropping the guard leaves the readiness set; `try_read_buf` clears it.
            if let Err(e) = ready!(self.fd()?.poll_read_ready(cx)) {
                return Poll::Ready(Err(e));
            }
        }
    }

    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            match self.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.poll_write_ready(cx))?;
                }
                r => return Poll::Ready(r),
            }
        }
    }

    /// Everything queued was written. Write readiness stops being watched once 64 writes in a
    /// row have not needed it: a connection moving large messages keeps its registration
    /// (re-registering costs two epoll_ctl), one making small calls loses it and with it the
    /// spurious EPOLLOUT wake-ups.
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.write_watched {
            self.idle_writes += 1;
            if self.idle_writes >= 64 {
                self.idle_writes = 0;
                self.reregister(Interest::READABLE, cx)?;
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Ok(fd) = self.fd() else {
            return Poll::Ready(Ok(()));
        };
        let r = socket2::SockRef::from(fd.get_ref()).shutdown(std::net::Shutdown::Write);
        if let Err(e) = &r {
            tracing::debug!("shutdown: {e}");
        }
        Poll::Ready(Ok(()))
    }

    fn peer_addr(&self) -> PeerAddr {
        let unix = |path| PeerAddr::Unix {
            path,
            credentials: self.credentials,
        };
        match self.sock.as_ref().map(AsyncFd::get_ref) {
            Some(Sock::Tcp(s)) => s.peer_addr().map(PeerAddr::Tcp).unwrap_or(unix(None)),
            Some(Sock::Unix(s)) => unix(
                s.peer_addr()
                    .ok()
                    .and_then(|a| a.as_pathname().map(|p| p.to_path_buf())),
            ),
            None => PeerAddr::Stream,
        }
    }
}

/// Connects to a Linux abstract Unix socket address (no file): non-blocking, so a full
/// backlog is an error rather than a blocked thread.
pub(crate) fn connect_abstract(name: &str) -> io::Result<UnixStream> {
    let sock = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    sock.set_nonblocking(true)?;
    let mut path = Vec::with_capacity(name.len() + 1);
    path.push(0);
    path.extend_from_slice(name.as_bytes());
    let addr = socket2::SockAddr::unix(std::ffi::OsStr::from_bytes(&path))?;
    sock.connect(&addr)?;
    UnixStream::from_std(std::os::unix::net::UnixStream::from(OwnedFd::from(sock)))
}

/// One `recv` into the spare capacity of `buf`. A short read (the socket had less than we
/// offered) reports `WouldBlock` after recording the bytes in `got`, so `try_io` clears the
/// readiness; the caller turns it back into `Ok(got)`.
#[allow(unsafe_code)]
fn recv_drained(
    sock: socket2::SockRef<'_>,
    buf: &mut BytesMut,
    got: &mut usize,
) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    let offered = spare.len();
    let n = sock.recv(spare)?;
    // SAFETY: `recv` initialised the first `n` bytes of the spare capacity (it returns how many
    // bytes it wrote, at most `spare.len()`), so they may become part of the buffer.
    unsafe { buf.set_len(buf.len() + n) };
    if n > 0 && n < offered {
        *got = n;
        return Err(io::ErrorKind::WouldBlock.into());
    }
    Ok(n)
}

/// The socket transport's dial (`tcp://`, `unix://`, `unix:@name`): connect within the handshake
/// timeout, then the native protocol on the socket fast path.
pub(crate) async fn dial<S: super::Start>(
    d: &super::Dial<'_>,
    start: S,
) -> Result<S::Conn, crate::Status> {
    let transport = d
        .within("connect", SocketTransport::connect(d.address))
        .await?;
    start.native(transport).await
}

/// `grpc://`: a TCP connection (Nagle off) and the gRPC client mode's HTTP/2 handshake, each
/// within the handshake timeout.
pub(crate) async fn dial_grpc<S: super::Start>(
    d: &super::Dial<'_>,
    hp: &str,
    start: S,
) -> Result<S::Conn, crate::Status> {
    let tcp = d.within("connect", super::tcp_connect(hp)).await?;
    let start = start.grpc(tcp, http::uri::Scheme::HTTP);
    d.within("HTTP/2 handshake", async {
        start.await.map_err(super::Failed)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::CountingWaker;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn loopback_addresses_are_told_apart() {
        for (ip, want) in [
            ("127.0.0.1", true),
            ("127.8.9.10", true),
            ("::1", true),
            ("::ffff:127.0.0.1", true),
            ("10.0.0.1", false),
            ("192.168.1.2", false),
            ("::ffff:10.0.0.1", false),
            ("2001:db8::1", false),
        ] {
            assert_eq!(is_loopback(ip.parse().expect("ip")), want, "{ip}");
        }
    }

    /// Both ends of a loopback TCP connection send through the bounded buffer (see
    /// [`LOOPBACK_SEND_BUFFER`]); Linux reports the doubled size it keeps.
    #[tokio::test]
    async fn a_loopback_tcp_connection_gets_the_bounded_send_buffer() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        let (c, s) = tokio::join!(TcpStream::connect(addr), l.accept());
        for t in [
            SocketTransport::from_tcp(c.expect("connect")).expect("client"),
            SocketTransport::from_tcp(s.expect("accept").0).expect("server"),
        ] {
            let sock = t.sock.as_ref().expect("registered").get_ref();
            let Sock::Tcp(tcp) = sock else {
                panic!("a TCP transport holds a TCP socket")
            };
            let size = socket2::SockRef::from(tcp)
                .send_buffer_size()
                .expect("SO_SNDBUF");
            assert_eq!(size, 2 * LOOPBACK_SEND_BUFFER);
        }
    }

    /// Regression: a task whose read had returned `Pending` and whose write then re-registered
    /// the descriptor (write readiness taken, or dropped after idle writes) lost its read
    /// waker with the old registration and slept through the reply (a pinned benchmark hung
    /// after a 2 MB echo over a Unix socket).
    #[tokio::test]
    async fn a_reregistration_keeps_the_task_listening_for_reads() {
        for interest in [Interest::READABLE | Interest::WRITABLE, Interest::READABLE] {
            let (a, mut b) = tokio::net::UnixStream::pair().expect("pair");
            let mut t = SocketTransport::from_unix(a).expect("transport");
            let (woken, waker) = CountingWaker::new();
            let mut cx = Context::from_waker(&waker);
            let mut buf = BytesMut::with_capacity(64);
            assert!(t.poll_read(&mut cx, &mut buf).is_pending());
            t.reregister(interest, &mut cx).expect("reregister");
            let before = woken.count();
            b.write_all(b"x").await.expect("write");
            tokio::time::timeout(std::time::Duration::from_secs(10), async {
                while woken.count() == before {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            })
            .await
            .expect("the task is woken for the reply after the re-registration");
            assert!(matches!(t.poll_read(&mut cx, &mut buf), Poll::Ready(Ok(1))));
        }
    }
}
