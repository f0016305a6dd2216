//! Sockets: TCP (with TCP_NODELAY) and Unix domain sockets behind one type, used through
//! readiness + non-blocking calls so one task can read and write at once.

use crate::address::Address;
use bytes::BytesMut;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::task::{Context, Poll};
use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// The address of the other end of a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerAddr {
    /// A TCP peer.
    Tcp(SocketAddr),
    /// A Unix socket peer (usually unnamed).
    Unix(Option<PathBuf>),
}

impl std::fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerAddr::Tcp(a) => write!(f, "{a}"),
            PeerAddr::Unix(Some(p)) => write!(f, "unix:{}", p.display()),
            PeerAddr::Unix(None) => f.write_str("unix:(unnamed)"),
        }
    }
}

#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(crate) async fn connect(addr: &Address) -> io::Result<Stream> {
        match addr {
            Address::Tcp(hp) => {
                let s = TcpStream::connect(hp.as_str()).await?;
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
            Address::Unix(p) => Ok(Stream::Unix(UnixStream::connect(p).await?)),
        }
    }

    pub(crate) fn peer_addr(&self) -> PeerAddr {
        match self {
            Stream::Tcp(s) => s
                .peer_addr()
                .map(PeerAddr::Tcp)
                .unwrap_or(PeerAddr::Unix(None)),
            Stream::Unix(s) => PeerAddr::Unix(
                s.peer_addr()
                    .ok()
                    .and_then(|a| a.as_pathname().map(|p| p.to_path_buf())),
            ),
        }
    }

    pub(crate) async fn readable(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.readable().await,
            Stream::Unix(s) => s.readable().await,
        }
    }

    /// Read readiness, with the waker kept in the socket's single reader slot (cheaper than
    /// `readable()`, which queues a waiter; only the connection task reads).
    pub(crate) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => s.poll_read_ready(cx),
            Stream::Unix(s) => s.poll_read_ready(cx),
        }
    }

    /// Write readiness, likewise.
    pub(crate) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => s.poll_write_ready(cx),
            Stream::Unix(s) => s.poll_write_ready(cx),
        }
    }

    pub(crate) async fn writable(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.writable().await,
            Stream::Unix(s) => s.writable().await,
        }
    }

    /// Reads into `buf`'s spare capacity. When the read returns less than was offered, the
    /// socket is drained: its readiness is cleared in the same step, which saves the extra
    /// `read` that would otherwise only return `EAGAIN` on every wake-up (measured: one per
    /// call per side). Race-free: tokio snapshots readiness before the closure runs, so data
    /// that arrives after the `recv` raises a new readiness event that is not cleared.
    pub(crate) fn try_read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        let mut got = 0;
        let r = match self {
            Stream::Tcp(s) => s.try_io(Interest::READABLE, || {
                recv_drained(socket2::SockRef::from(s), buf, &mut got)
            }),
            Stream::Unix(s) => s.try_io(Interest::READABLE, || {
                recv_drained(socket2::SockRef::from(s), buf, &mut got)
            }),
        };
        match r {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => Ok(got),
            other => other,
        }
    }

    pub(crate) fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_write_vectored(bufs),
            Stream::Unix(s) => s.try_write_vectored(bufs),
        }
    }

    /// Closes the write side so the peer sees EOF after what was sent.
    pub(crate) fn shutdown_write(&self) {
        let r = match self {
            Stream::Tcp(s) => socket2::SockRef::from(s).shutdown(std::net::Shutdown::Write),
            Stream::Unix(s) => socket2::SockRef::from(s).shutdown(std::net::Shutdown::Write),
        };
        if let Err(e) = r {
            tracing::debug!("shutdown: {e}");
        }
    }
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

#[derive(Debug)]
pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    pub(crate) async fn bind(addr: &Address) -> io::Result<Listener> {
        match addr {
            Address::Tcp(hp) => Ok(Listener::Tcp(TcpListener::bind(hp.as_str()).await?)),
            Address::Unix(p) => {
                // A stale socket file from a previous run would make bind fail.
                if let Ok(meta) = std::fs::symlink_metadata(p) {
                    use std::os::unix::fs::FileTypeExt;
                    if meta.file_type().is_socket() {
                        let _ = std::fs::remove_file(p);
                    }
                }
                Ok(Listener::Unix(UnixListener::bind(p)?, p.clone()))
            }
        }
    }

    pub(crate) fn local_addr(&self) -> io::Result<Address> {
        match self {
            Listener::Tcp(l) => Ok(Address::from(l.local_addr()?)),
            Listener::Unix(_, p) => Ok(Address::Unix(p.clone())),
        }
    }

    pub(crate) async fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept().await?;
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
            Listener::Unix(l, _) => Ok(Stream::Unix(l.accept().await?.0)),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}
