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
//! Each transport file also owns how its connections are made: its **dial** (connect, then
//! its handshakes, within the handshake timeout; the table of schemes is [`dial`]) and its
//! **accept** (what the server does with an accepted connection of its kind). Both end by
//! handing the connection to a face: [`Start`] on the client (the native engine, or the gRPC
//! client mode), [`Serve`] on the server (the native engine, or the gRPC face), so each
//! transport's type reaches its own monomorphised connection loop without an enum of them all.
//!
//! A new transport is one file here implementing [`Transport`] (or an `AsyncRead + AsyncWrite`
//! for the stream transport), its dial and its accept.

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

pub(crate) use listener::{Accepted, BindError, Listener};

use crate::{Address, Config, Status};
use bytes::BytesMut;
use std::future::Future;
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
pub(crate) fn not_a_socket_address(a: &Address) -> io::Error {
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

/// What a client dials with: the address, the limits and the settings of its layers (TLS and
/// WebSocket, as the endpoint was given them).
pub(crate) struct Dial<'a> {
    pub(crate) address: &'a Address,
    pub(crate) config: &'a Config,
    #[cfg_attr(not(any(feature = "tls", feature = "websocket")), allow(dead_code))]
    pub(crate) layers: &'a Layers,
}

/// The settings of a client's layered transports (`Endpoint::tls`, `Endpoint::websocket`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Layers {
    /// TLS settings of `tls://`, `wss://` and `grpcs://` addresses (default: the webpki roots).
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<tls::ClientTls>,
    /// WebSocket settings of `ws://` and `wss://` addresses.
    #[cfg(feature = "websocket")]
    pub(crate) websocket: ws::WebSocketSettings,
}

/// What a dialled connection is handed to once its transport is set up: the client's native
/// engine, or its gRPC client mode (HTTP/2 over a byte stream). Both run their own handshake
/// and return the connection's handle.
pub(crate) trait Start: Send + Sized {
    /// The handle of a started connection.
    type Conn;

    /// Starts the native protocol over `transport`.
    fn native<T: Transport>(
        self,
        transport: T,
    ) -> impl Future<Output = Result<Self::Conn, Status>> + Send;

    /// Starts the gRPC client mode over `io` (TCP, or TLS that negotiated `h2`).
    fn grpc<S>(
        self,
        io: S,
        scheme: http::uri::Scheme,
    ) -> impl Future<Output = Result<Self::Conn, Status>> + Send
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static;
}

/// Opens one connection to the dial's address and hands it to `start`: the table of schemes,
/// each the dial of its transport's file. Connecting and the handshakes share the handshake
/// timeout.
pub(crate) async fn dial<S: Start>(d: &Dial<'_>, start: S) -> Result<S::Conn, Status> {
    match d.address {
        Address::Tcp(_) | Address::Unix(_) | Address::UnixAbstract(_) => {
            socket::dial(d, start).await
        }
        Address::Grpc(hp) => socket::dial_grpc(d, hp, start).await,
        #[cfg(any(target_os = "linux", target_os = "android"))]
        Address::Shm(name) => shm::dial(d, name, start).await,
        #[cfg(feature = "tls")]
        Address::Tls(hp) => tls::dial(d, hp, start).await,
        #[cfg(feature = "tls")]
        Address::Grpcs(hp) => tls::dial_grpc(d, hp, start).await,
        #[cfg(feature = "websocket")]
        Address::Ws(hp, _) => ws::dial(d, hp, start).await,
        #[cfg(all(feature = "tls", feature = "websocket"))]
        Address::Wss(hp, _) => tls::dial_ws(d, hp, start).await,
        #[allow(unreachable_patterns)]
        other => Err(d.failed(&format!(
            "{other} needs the topspin crate's `tls` or `websocket` feature"
        ))),
    }
}

impl Dial<'_> {
    /// Connecting failed because of `e`.
    pub(crate) fn failed(&self, e: &dyn std::fmt::Display) -> Status {
        Status::unavailable(format!("could not connect to {}: {e}", self.address))
    }

    /// `step` within the handshake timeout; past it, "`steps` timed out".
    pub(crate) async fn within<T, E: DialError>(
        &self,
        steps: &str,
        step: impl Future<Output = Result<T, E>>,
    ) -> Result<T, Status> {
        match tokio::time::timeout(self.config.handshake_timeout(), step).await {
            Ok(r) => r.map_err(|e| e.into_status(self)),
            Err(_) => Err(self.failed(&format!("{steps} timed out"))),
        }
    }
}

/// A failure that is already a [`Status`] (as the gRPC client mode's start returns).
pub(crate) struct Failed(pub(crate) Status);

/// Why a step of dialling failed, as the connection's status.
pub(crate) trait DialError {
    /// The status a call sees.
    fn into_status(self, dial: &Dial<'_>) -> Status;
}

impl DialError for Failed {
    fn into_status(self, _: &Dial<'_>) -> Status {
        self.0
    }
}

impl DialError for io::Error {
    fn into_status(self, dial: &Dial<'_>) -> Status {
        dial.failed(&self)
    }
}

impl DialError for String {
    fn into_status(self, dial: &Dial<'_>) -> Status {
        dial.failed(&self)
    }
}

/// A TCP connection with Nagle off.
pub(crate) async fn tcp_connect(hp: &str) -> io::Result<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(hp).await?;
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

/// The peer address of a TCP stream under a layered transport.
#[cfg(any(feature = "tls", feature = "websocket"))]
pub(crate) fn peer_of(s: &tokio::net::TcpStream) -> PeerAddr {
    s.peer_addr().map(PeerAddr::Tcp).unwrap_or(PeerAddr::Stream)
}

/// What an accepted connection is handed to once its transport is set up: the server's native
/// engine or its gRPC face — or, past `max_connections`, its refusal. Each transport's accept
/// ends in one of these calls.
pub(crate) trait Serve: Send + Sized + 'static {
    /// Serves the native protocol over `transport`.
    fn native<T: Transport>(self, transport: T) -> impl Future<Output = ()> + Send;

    /// Serves a native client that sent nothing within the handshake timeout (a plain port's
    /// sniff): its engine says `TIMEOUT` at once.
    #[cfg_attr(
        not(any(feature = "tls", feature = "websocket", feature = "grpc")),
        allow(dead_code)
    )]
    fn silent<T: Transport>(self, transport: T) -> impl Future<Output = ()> + Send {
        self.native(transport)
    }

    /// Serves gRPC (HTTP/2 with prior knowledge) over `io`. By default it is closed.
    #[cfg(feature = "grpc")]
    fn grpc<S>(self, io: S, peer: PeerAddr) -> impl Future<Output = ()> + Send
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        drop((io, peer));
        std::future::ready(())
    }

    /// Serves gRPC over TLS (ALPN `h2`), whose handshake established `tls`. By default it is
    /// closed.
    #[cfg(all(feature = "grpc", feature = "tls"))]
    fn grpc_tls<S>(
        self,
        io: S,
        peer: PeerAddr,
        tls: std::sync::Arc<tls::TlsPeer>,
    ) -> impl Future<Output = ()> + Send
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        drop((io, peer, tls));
        std::future::ready(())
    }
}

/// The bounds of an accepted connection's handshakes: one deadline for all its layers (the
/// handshake timeout, from when they begin), and the server's shutdown, which drops a
/// connection still in them (`None`: let them finish).
#[cfg(any(feature = "tls", feature = "websocket"))]
pub(crate) struct Handshake<'a> {
    pub(crate) deadline: tokio::time::Instant,
    pub(crate) shutdown: Option<&'a tokio_util::sync::CancellationToken>,
}

#[cfg(any(feature = "tls", feature = "websocket"))]
impl Handshake<'_> {
    /// `step` by the deadline and unless the server shuts down first; errors say which.
    pub(crate) async fn within<T>(
        &self,
        step: impl Future<Output = Result<T, String>>,
    ) -> Result<T, String> {
        let step = async {
            match tokio::time::timeout_at(self.deadline, step).await {
                Ok(r) => r,
                Err(_) => Err("the TLS or WebSocket handshake timed out".into()),
            }
        };
        cancellable(self.shutdown, step).await
    }
}

/// `step`, unless `shutdown` (when there is one) comes first: then "the server is shutting
/// down".
#[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
pub(crate) async fn cancellable<T>(
    shutdown: Option<&tokio_util::sync::CancellationToken>,
    step: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    let Some(shutdown) = shutdown else {
        return step.await;
    };
    tokio::select! {
        r = step => r,
        _ = shutdown.cancelled() => Err("the server is shutting down".into()),
    }
}

/// What a server's TCP listeners may serve besides the native protocol: the builder's TLS,
/// WebSocket, sniffing and gRPC settings (`ServerBuilder::tls` and the rest).
/// `transport/sniff.rs` works out each listener's [`Faces`] from them.
#[derive(Debug, Default)]
pub(crate) struct FaceSettings {
    /// TLS settings: needed by `tls://` and `wss://`, accepted on a sniffing port.
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<tls::ServerTls>,
    /// A sniffing port with mutual TLS serves plaintext faces too.
    #[cfg(feature = "tls")]
    pub(crate) plaintext_beside_mtls: bool,
    /// WebSocket settings of `ws://` and `wss://` (and of a sniffing port).
    #[cfg(feature = "websocket")]
    pub(crate) websocket: ws::WebSocketSettings,
    /// `ServerBuilder::sniff_transports`: how long a client has to send its first byte.
    #[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
    pub(crate) sniff: Option<std::time::Duration>,
    /// The gRPC face is off (it is on by default).
    #[cfg(feature = "grpc")]
    pub(crate) no_grpc: bool,
}

/// How a server's TCP connections are served (all but plain TCP, which stays on the socket
/// fast path without it): worked out once per listener, shared by its connections.
#[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
#[derive(Clone, Debug)]
pub(crate) struct Faces {
    /// TLS: the only face of a `tls://` listener, or accepted when sniffed.
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<tls::ServerTls>,
    /// A sniffing port that serves TLS clients only (mutual TLS, no plaintext opt-in).
    #[cfg(feature = "tls")]
    pub(crate) tls_only: bool,
    /// WebSocket settings and path: the face of a `ws://` (`wss://` with `tls`) listener.
    #[cfg(feature = "websocket")]
    pub(crate) ws: Option<(ws::WebSocketSettings, String)>,
    /// Tell the faces apart by the first byte (plain topspin accepted too).
    pub(crate) sniff: bool,
    /// How long a sniffing server waits for a client's first byte.
    pub(crate) sniff_timeout: std::time::Duration,
    /// The gRPC face: `P` (HTTP/2 prior knowledge) and ALPN `h2` go to it.
    #[cfg(feature = "grpc")]
    pub(crate) grpc: bool,
    /// A plain `tcp://` port that sniffs only for gRPC: a client silent for the sniff timeout
    /// (the handshake timeout) is handed to the native engine, which tells it `TIMEOUT`.
    pub(crate) plain: bool,
}

#[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
impl Faces {
    /// Whether the gRPC face is on.
    pub(crate) fn grpc(&self) -> bool {
        #[cfg(feature = "grpc")]
        return self.grpc;
        #[cfg(not(feature = "grpc"))]
        false
    }
}
