//! Transports: what a connection's bytes travel over.
//!
//! The connection loop (`crate::connection`) reads and writes through the small [`Transport`]
//! trait and never touches a socket itself. Two implementations:
//!
//! - [`socket`]: TCP and Unix sockets through readiness and non-blocking calls — one `recv`
//!   that also clears readiness when it drains the socket, one vectored `sendmsg` per turn, no
//!   write-readiness registration unless a write would block. This is the fast path; every
//!   readiness call and raw descriptor of the crate is in that file.
//! - [`stream`]: any `AsyncRead + AsyncWrite` byte stream (TLS, WebSocket, user streams,
//!   in-memory pipes such as `tokio::io::duplex`).
//! - `shm` (Linux): `shm://name`, a ring per direction in a memfd shared by two processes of
//!   one host, set up over a Unix socket that stays open for liveness and wake-ups.
//!
//! Layers over TCP: `tls` (rustls), `ws` (WebSocket binary messages as a byte stream), and
//! `sniff`, which sets up an accepted connection's layers — or tells them apart by its first
//! byte — on the connection's own task.
//!
//! A new transport is one file here implementing [`Transport`] (or an `AsyncRead + AsyncWrite`
//! for the stream transport).

mod listener;
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) mod shm;
#[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
pub(crate) mod sniff;
pub(crate) mod socket;
pub(crate) mod stream;
#[cfg(feature = "tls")]
pub mod tls;
#[cfg(feature = "websocket")]
pub mod ws;

pub(crate) use listener::{Accepted, Listener};

use bytes::BytesMut;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::task::{Context, Poll};

/// The address of the other end of a connection.
///
/// ```
/// use topspin::PeerAddr;
/// let p: PeerAddr = "127.0.0.1:9".parse::<std::net::SocketAddr>().map(PeerAddr::Tcp).unwrap();
/// assert_eq!(p.to_string(), "127.0.0.1:9");
/// assert!(p.credentials().is_none());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PeerAddr {
    /// A TCP peer.
    Tcp(SocketAddr),
    /// A Unix socket peer.
    #[non_exhaustive]
    Unix {
        /// The peer's socket path, if it bound one (usually not: client sockets are unnamed).
        path: Option<PathBuf>,
        /// Who the peer process is, as the kernel saw it when it connected (`SO_PEERCRED`).
        credentials: Option<PeerCredentials>,
    },
    /// A connection over a byte stream whose peer has no socket address.
    Stream,
    /// A shared-memory peer (`shm://`) on this host.
    #[non_exhaustive]
    Shm {
        /// Who the peer process is, as the kernel saw it when it connected to the server's
        /// Unix socket (`SO_PEERCRED`).
        credentials: Option<PeerCredentials>,
    },
}

impl PeerAddr {
    /// The peer process's credentials: on a Unix socket or shared memory, the user, group and process that
    /// connected (as the kernel recorded them at `connect`); `None` for other transports.
    /// Servers can use them to authorise local clients without any secret.
    pub fn credentials(&self) -> Option<&PeerCredentials> {
        match self {
            PeerAddr::Unix { credentials, .. } | PeerAddr::Shm { credentials } => {
                credentials.as_ref()
            }
            _ => None,
        }
    }
}

/// The credentials of the process at the other end of a Unix socket (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PeerCredentials {
    /// The peer's effective user id.
    pub uid: u32,
    /// The peer's effective group id.
    pub gid: u32,
    /// The peer's process id, when the kernel reports it.
    pub pid: Option<i32>,
}

/// Which local users may be at the other end of a socket that has no file permissions: the
/// Linux abstract sockets of `unix:@name` and `shm://name`, which every user in the network
/// namespace can reach — and the first to bind a name receives every client's calls.
///
/// A server accepts a connection from these users only (checked with `SO_PEERCRED` before
/// anything is read or sent, so a refused `shm://` client's hello and memfd are never looked at);
/// a `shm://` client connects only to a server run by them. Default: this process's own user.
///
/// ```
/// use topspin::{Config, LocalUsers};
/// let c = Config::default().with_local_users(LocalUsers::own_and([1001, 1002]));
/// assert!(c.local_users().allows(1001));
/// assert!(Config::default().local_users().allows(LocalUsers::own_uid()));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LocalUsers {
    /// This process's own user only.
    #[default]
    Own,
    /// This process's own user and these.
    OwnAnd(std::sync::Arc<[u32]>),
    /// Any local user (the checks are off).
    Any,
}

impl LocalUsers {
    /// This process's own user and `uids`.
    pub fn own_and(uids: impl IntoIterator<Item = u32>) -> LocalUsers {
        LocalUsers::OwnAnd(uids.into_iter().collect())
    }

    /// The user id this process runs as (effective).
    pub fn own_uid() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    /// Whether a peer running as `uid` is allowed.
    pub fn allows(&self, uid: u32) -> bool {
        match self {
            LocalUsers::Any => true,
            LocalUsers::Own => uid == LocalUsers::own_uid(),
            LocalUsers::OwnAnd(more) => uid == LocalUsers::own_uid() || more.contains(&uid),
        }
    }

    /// Checks the peer of a connected Unix socket: `PermissionDenied` naming the peer's user
    /// when it is not allowed (or when the kernel does not say who it is).
    pub(crate) fn check(&self, sock: &impl std::os::fd::AsFd, role: &str) -> io::Result<()> {
        if *self == LocalUsers::Any {
            return Ok(());
        }
        let uid = rustix::net::sockopt::socket_peercred(sock)
            .map(|c| c.uid.as_raw())
            .map_err(io::Error::from)?;
        if self.allows(uid) {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the {role} runs as uid {uid}, not an allowed local user (this process is uid {}; Config::with_local_users)",
                LocalUsers::own_uid()
            ),
        ))
    }
}

impl std::fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerAddr::Tcp(a) => write!(f, "{a}"),
            PeerAddr::Unix { path: Some(p), .. } => write!(f, "unix:{}", p.display()),
            PeerAddr::Unix {
                path: None,
                credentials: Some(c),
            } => match c.pid {
                Some(pid) => write!(f, "unix:(pid {pid}, uid {})", c.uid),
                None => write!(f, "unix:(uid {})", c.uid),
            },
            PeerAddr::Unix { path: None, .. } => f.write_str("unix:(unnamed)"),
            PeerAddr::Stream => f.write_str("stream"),
            PeerAddr::Shm {
                credentials: Some(c),
            } => match c.pid {
                Some(pid) => write!(f, "shm:(pid {pid}, uid {})", c.uid),
                None => write!(f, "shm:(uid {})", c.uid),
            },
            PeerAddr::Shm { credentials: None } => f.write_str("shm:(unknown)"),
        }
    }
}

/// The error for connecting a plain socket to an address of a layered transport.
pub(crate) fn not_a_socket_address(a: &crate::Address) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{a} is not a tcp:// or unix:// address"),
    )
}

/// A connected, bidirectional byte transport, used by exactly one connection task.
///
/// Reads and writes are poll-based and non-blocking: `Pending` means the task's waker is
/// registered and the task will be woken when the transport can make progress, so one task
/// reads while its writes wait (and two peers both sending large messages never deadlock).
pub(crate) trait Transport: Send + 'static {
    /// Whether a read may find something, cheaply: `Pending` (waker registered) when it
    /// certainly would not. Transports without readiness say `Ready` and let `poll_read` tell.
    fn poll_readable(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Whether reading never leaves something for the writing side to send or flush (a TLS
    /// record to answer, a WebSocket pong): only then may a caller read its own reply from
    /// outside the connection's task (`Driver::read_inline`), which does not flush.
    fn reads_alone(&self) -> bool {
        false
    }

    /// Reads into `buf`'s spare capacity (the caller reserves room first). `Ok(0)` is the end
    /// of the stream.
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>>;

    /// Writes a prefix of `bufs` (as much as the transport takes now, in one system call for
    /// sockets); returns how many bytes were taken.
    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>>;

    /// Everything queued was handed over: flush any buffering of the transport's own.
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// Closes the write direction so the peer sees the end of the stream after what was sent.
    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// The other end.
    fn peer_addr(&self) -> PeerAddr;

    /// What a TLS handshake established about the other end (servers, TLS transports only).
    #[cfg(feature = "tls")]
    fn tls_peer(&self) -> Option<std::sync::Arc<tls::TlsPeer>> {
        None
    }
}
