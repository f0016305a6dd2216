//! The socket transport: TCP (with TCP_NODELAY) and Unix domain sockets behind one type, used
//! through readiness and non-blocking calls so one task can read and write at once. The
//! crate's only readiness calls and raw descriptors live here.

use super::{PeerAddr, Transport};
use crate::address::Address;
use bytes::BytesMut;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
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

/// A connection's socket, used through readiness and non-blocking calls so one task can read
/// while its writes wait.
///
/// It is registered with the reactor for **read** readiness only: every write on a TCP or Unix
/// socket later raises an `EPOLLOUT` edge (when the peer acknowledges or reads), and with both
/// interests each of them woke the reactor for nothing — one `epoll_wait` per call and side
/// (more on Unix sockets). Writes go straight to the non-blocking socket; only when one would
/// block is a duplicate descriptor registered for write readiness, and dropped once the queue
/// has drained.
#[derive(Debug)]
pub(crate) struct SocketTransport {
    sock: AsyncFd<Sock>,
    writer: Option<AsyncFd<OwnedFd>>,
    /// Writes that completed without waiting since write readiness was last needed.
    idle_writes: u32,
}

impl SocketTransport {
    #[allow(unsafe_code)]
    fn new(sock: Sock) -> io::Result<SocketTransport> {
        // SAFETY: `sock` owns its descriptor, which stays open and the same for as long as the
        // AsyncFd owns `sock` (tokio's registration contract).
        let sock = unsafe { AsyncFd::register_with_interest(sock, Interest::READABLE) }?;
        Ok(SocketTransport {
            sock,
            writer: None,
            idle_writes: 0,
        })
    }

    pub(crate) fn from_tcp(s: TcpStream) -> io::Result<SocketTransport> {
        s.set_nodelay(true)?;
        // into_std leaves the socket non-blocking.
        SocketTransport::new(Sock::Tcp(s.into_std()?))
    }

    pub(crate) fn from_unix(s: UnixStream) -> io::Result<SocketTransport> {
        SocketTransport::new(Sock::Unix(s.into_std()?))
    }

    pub(crate) async fn connect(addr: &Address) -> io::Result<SocketTransport> {
        match addr {
            Address::Tcp(hp) => SocketTransport::from_tcp(TcpStream::connect(hp.as_str()).await?),
            Address::Unix(p) => SocketTransport::from_unix(UnixStream::connect(p).await?),
            other => Err(super::not_a_socket_address(other)),
        }
    }

    /// Write readiness: registers for it on first use after a write would have blocked.
    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.idle_writes = 0;
        if self.writer.is_none() {
            let fd = self.sock.get_ref().as_fd().try_clone_to_owned()?;
            self.writer = Some(watch_writable(fd)?);
        }
        match &self.writer {
            Some(w) => w.poll_write_ready(cx).map_ok(|_guard| ()),
            None => Poll::Ready(Ok(())),
        }
    }

    /// Reads into `buf`'s spare capacity. When the read returns less than was offered, the
    /// socket is drained: its readiness is cleared in the same step, which saves the extra
    /// `read` that would otherwise only return `EAGAIN` on every wake-up (measured: one per
    /// call per side). Race-free: tokio snapshots readiness before the closure runs, so data
    /// that arrives after the `recv` raises a new readiness event that is not cleared.
    fn try_read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        let mut got = 0;
        let r = self.sock.try_io(Interest::READABLE, |s| {
            recv_drained(socket2::SockRef::from(s), buf, &mut got)
        });
        match r {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => Ok(got),
            other => other,
        }
    }

    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let write = |_: &OwnedFd| socket2::SockRef::from(self.sock.get_ref()).send_vectored(bufs);
        match &self.writer {
            // While write readiness is watched, writes go through it so that a write that
            // would block clears it (and the task waits for the next edge).
            Some(w) => w.try_io(Interest::WRITABLE, write),
            None => socket2::SockRef::from(self.sock.get_ref()).send_vectored(bufs),
        }
    }
}

impl Transport for SocketTransport {
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Dropping the guard leaves the readiness set; `try_read_buf` clears it.
        self.sock.poll_read_ready(cx).map_ok(|_guard| ())
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
            if let Err(e) = ready!(self.sock.poll_read_ready(cx)) {
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
    /// (re-registering costs a dup, two epoll_ctl and a close), one making small calls loses
    /// it and with it the spurious EPOLLOUT wake-ups.
    fn poll_flush(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.writer.is_some() {
            self.idle_writes += 1;
            if self.idle_writes >= 64 {
                self.writer = None;
                self.idle_writes = 0;
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = socket2::SockRef::from(self.sock.get_ref()).shutdown(std::net::Shutdown::Write);
        if let Err(e) = &r {
            tracing::debug!("shutdown: {e}");
        }
        Poll::Ready(Ok(()))
    }

    fn peer_addr(&self) -> PeerAddr {
        match self.sock.get_ref() {
            Sock::Tcp(s) => s
                .peer_addr()
                .map(PeerAddr::Tcp)
                .unwrap_or(PeerAddr::Unix(None)),
            Sock::Unix(s) => PeerAddr::Unix(
                s.peer_addr()
                    .ok()
                    .and_then(|a| a.as_pathname().map(|p| p.to_path_buf())),
            ),
        }
    }
}

/// Registers a duplicate of a socket's descriptor for write readiness only.
#[allow(unsafe_code)]
fn watch_writable(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd owns `fd`, which stays open and the same until it is dropped.
    Ok(unsafe { AsyncFd::register_with_interest(fd, Interest::WRITABLE) }?)
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
