//! Listening sockets: TCP, Unix (a file, bound under a lock file), Linux abstract Unix
//! sockets (a name, no file), and the abstract socket of a shared-memory (`shm://`) server; a
//! TCP listener with faces beyond the native protocol (TLS, WebSocket, sniffing: `sniff.rs`).
//! What an accepted connection needs before it is served (`Accepted::serve`) is its
//! transport's accept.

use super::socket::SocketTransport;
use super::{FaceSettings, Serve};
use crate::address::Address;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, UnixListener};

#[derive(Debug)]
pub(crate) enum Listener {
    Tcp(TcpListener),
    /// The listener, its path, and the socket file's identity (device, inode) so that only
    /// this server's own file is removed when it stops.
    Unix(UnixListener, PathBuf, (u64, u64)),
    /// A Linux abstract socket: nothing on the file system; peers checked against the users.
    UnixAbstract(UnixListener, String, crate::LocalUsers),
    /// A shared-memory server (`shm://name`): the abstract socket `topspin-shm:<name>`; each
    /// connection's rings are charged to the budget.
    Shm(
        UnixListener,
        String,
        crate::LocalUsers,
        std::sync::Arc<topspin_proto::MemoryBudget>,
    ),
    /// A TCP listener whose connections are sniffed or layered (TLS, WebSocket, the gRPC
    /// face) on their own tasks.
    #[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
    Layered(TcpListener, std::sync::Arc<super::Faces>),
}

/// Why a listener was not bound.
#[derive(Debug)]
pub(crate) enum BindError {
    /// The address needs settings the server was not given, or a feature this build lacks.
    Transport(String),
    /// Binding failed.
    Io(io::Error),
}

/// An accepted connection's transport.
#[derive(Debug)]
pub(crate) enum Accepted {
    /// TCP or Unix socket.
    Socket(SocketTransport),
    /// Shared memory, its rings charged, its handshake (the client's hello) still to come:
    /// done on the connection's own task, within the handshake timeout.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    Shm(super::shm::PendingShm),
    /// A TCP connection of a [`Listener::Layered`]: sniffed and set up on its own task.
    #[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
    Layered(
        std::sync::Arc<super::Faces>,
        tokio::net::TcpStream,
        std::net::SocketAddr,
    ),
}

impl Accepted {
    /// Sets the connection up — a shared-memory client's hello, a layered port's sniffing,
    /// TLS handshake or WebSocket upgrade — within `timeout`, then hands it to `serve`; a
    /// connection that fails its setup ends there (logged). `shutdown` drops one still in a
    /// TLS or WebSocket handshake.
    #[allow(unused_variables)]
    pub(crate) async fn serve<S: Serve>(
        self,
        serve: S,
        timeout: Duration,
        shutdown: &tokio_util::sync::CancellationToken,
    ) {
        match self {
            Accepted::Socket(t) => serve.native(t).await,
            #[cfg(any(target_os = "linux", target_os = "android"))]
            Accepted::Shm(pending) => pending.accept(timeout, serve).await,
            #[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
            Accepted::Layered(faces, tcp, addr) => {
                if let Err(why) = faces.accept(tcp, addr, timeout, shutdown, serve).await {
                    tracing::debug!(peer = %addr, "connection refused: {why}");
                }
            }
        }
    }

    /// Hands a connection over `max_connections` to `refuse` (which tells a native client
    /// why): a shared-memory client after its hello; a layered port's client only when the
    /// port is plain TCP and the client does not speak HTTP/2 (first byte awaited up to
    /// `wait`); others are closed at once.
    #[allow(unused_variables)]
    pub(crate) async fn refuse<S: Serve>(self, refuse: S, timeout: Duration, wait: Duration) {
        match self {
            Accepted::Socket(t) => refuse.native(t).await,
            #[cfg(any(target_os = "linux", target_os = "android"))]
            Accepted::Shm(pending) => pending.accept(timeout, refuse).await,
            #[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
            Accepted::Layered(faces, tcp, _) => faces.refuse(tcp, wait, refuse).await,
        }
    }
}

/// The (device, inode) of the file at `p`.
fn file_id(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Makes way for binding a Unix socket at `p`: a socket file that nothing answers on (left by
/// a server that died) is removed; one a live server answers on is "address in use" — never
/// taken over. Called with the path's [`BindLock`] held.
fn clear_stale_socket(p: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(p) else {
        return Ok(()); // nothing there
    };
    if !meta.file_type().is_socket() {
        return Ok(()); // bind will say what is wrong
    }
    match std::os::unix::net::UnixStream::connect(p) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("address in use: another server answers on {}", p.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            let _ = std::fs::remove_file(p);
            Ok(())
        }
        Err(_) => Ok(()),
    }
}

/// How long a server waits for another one binding the same Unix socket path to finish.
const BIND_LOCK_WAIT: Duration = Duration::from_secs(2);

/// An exclusive lock (`flock`, through rustix: std's `File::lock` is newer than the MSRV) on `<socket path>.lock`, held while a server checks for a stale
/// socket file, removes it and binds: two servers starting at once on a stale path cannot
/// both decide it is stale, and one cannot delete the socket the other just bound. The lock
/// file is removed when the lock is released.
struct BindLock {
    file: File,
    path: PathBuf,
}

impl BindLock {
    /// Takes the lock, waiting up to [`BIND_LOCK_WAIT`] for another server that holds it.
    async fn acquire(socket: &Path) -> io::Result<BindLock> {
        let mut path = socket.as_os_str().to_owned();
        path.push(".lock");
        let path = PathBuf::from(path);
        let until = Instant::now() + BIND_LOCK_WAIT;
        loop {
            if let Some(lock) = BindLock::try_acquire(&path)? {
                return Ok(lock);
            }
            if Instant::now() >= until {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "address in use: another server is binding {} (it holds {} for more than {BIND_LOCK_WAIT:?})",
                        socket.display(),
                        path.display()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// One attempt: `None` while another process holds the lock.
    fn try_acquire(path: &Path) -> io::Result<Option<BindLock>> {
        use std::os::unix::fs::MetadataExt;
        let file = match File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
        {
            Ok(f) => f,
            // A lock file of another user that we may read: flock needs no write access.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => File::open(path)?,
            Err(e) => return Err(e),
        };
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        // The holder before us removes the file as it releases the lock: if it did so between
        // our open and our lock, we hold a lock on a file nobody else will open. Try again.
        let ours = file.metadata()?;
        if file_id(path) != Some((ours.dev(), ours.ino())) {
            return Ok(None);
        }
        Ok(Some(BindLock {
            file,
            path: path.to_owned(),
        }))
    }
}

impl Drop for BindLock {
    fn drop(&mut self) {
        // Removed while still locked (the lock goes with the descriptor, right after), so a
        // server that opened this file in between sees that it is gone and tries again.
        let _ = std::fs::remove_file(&self.path);
        let _ = rustix::fs::flock(&self.file, rustix::fs::FlockOperation::Unlock);
    }
}

/// Binds a Unix socket file at `p` with permission bits `mode`, under the path's lock.
async fn bind_unix(p: &Path, mode: u32) -> io::Result<Listener> {
    use std::os::unix::fs::PermissionsExt;
    let _lock = BindLock::acquire(p).await?;
    clear_stale_socket(p)?;
    let l = UnixListener::bind(p)?;
    let id = file_id(p).unwrap_or_default();
    // The listener owns the file from here: dropped on error, it removes it.
    let listener = Listener::Unix(l, p.to_owned(), id);
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode & 0o7777))?;
    Ok(listener)
}

/// Binds a Linux abstract Unix socket (no file, so no lock, no permissions, nothing to remove).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn bind_abstract(name: &str) -> io::Result<UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let l = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    l.set_nonblocking(true)?;
    UnixListener::from_std(l)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn bind_abstract(_name: &str) -> io::Result<UnixListener> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract Unix socket addresses (unix:@name, shm://name) exist on Linux only",
    ))
}

impl Listener {
    /// Binds `addr` with the faces `faces` give it (none: the plain socket fast path). A
    /// Unix socket file gets the permission bits of
    /// [`Config::unix_socket_mode`](crate::Config::unix_socket_mode); an abstract socket
    /// (which has none) accepts peers of [`Config::local_users`](crate::Config::local_users)
    /// only; shared-memory rings are charged to the config's memory budget.
    pub(crate) async fn bind(
        addr: &Address,
        config: &crate::Config,
        faces: &FaceSettings,
    ) -> Result<Listener, BindError> {
        #[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
        if let Some(faces) = faces.faces(addr, config).map_err(BindError::Transport)? {
            let hp = addr.host_port().unwrap_or_default();
            let l = TcpListener::bind(hp).await.map_err(BindError::Io)?;
            return Ok(Listener::Layered(l, std::sync::Arc::new(faces)));
        }
        #[cfg(not(any(feature = "tls", feature = "websocket", feature = "grpc")))]
        if !matches!(
            addr,
            Address::Tcp(_) | Address::Unix(_) | Address::UnixAbstract(_) | Address::Shm(_)
        ) {
            let _ = faces;
            return Err(BindError::Transport(
                "this build lacks the `tls` and `websocket` features".into(),
            ));
        }
        Listener::bind_plain(addr, config)
            .await
            .map_err(BindError::Io)
    }

    /// Binds `addr` for the native protocol alone.
    async fn bind_plain(addr: &Address, config: &crate::Config) -> io::Result<Listener> {
        let users = config.local_users();
        match addr {
            Address::Tcp(hp) => Ok(Listener::Tcp(TcpListener::bind(hp.as_str()).await?)),
            Address::Unix(p) => bind_unix(p, config.unix_socket_mode()).await,
            Address::UnixAbstract(name) => Ok(Listener::UnixAbstract(
                bind_abstract(name)?,
                name.to_owned(),
                users.clone(),
            )),
            Address::Shm(name) => Ok(Listener::Shm(
                bind_abstract(&format!("topspin-shm:{name}"))?,
                name.to_owned(),
                users.clone(),
                config.memory_budget(),
            )),
            // TLS and WebSocket listen on TCP; the server adds the layers per connection.
            Address::Tls(hp) | Address::Ws(hp, _) | Address::Wss(hp, _) => {
                Ok(Listener::Tcp(TcpListener::bind(hp.as_str()).await?))
            }
            Address::Grpc(_) | Address::Grpcs(_) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{addr} names a gRPC server to call: a server binds tcp:// or tls://"),
            )),
            Address::Dns(_) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a dns:/// address names servers to connect to; a server binds tcp://host:port",
            )),
        }
    }

    pub(crate) fn local_addr(&self) -> io::Result<Address> {
        match self {
            Listener::Tcp(l) => Ok(Address::from(l.local_addr()?)),
            #[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
            Listener::Layered(l, _) => Ok(Address::from(l.local_addr()?)),
            Listener::Unix(_, p, _) => Ok(Address::Unix(p.clone())),
            Listener::UnixAbstract(_, name, _) => Ok(Address::UnixAbstract(name.clone())),
            Listener::Shm(_, name, ..) => Ok(Address::Shm(name.clone())),
        }
    }

    /// Accepts a connection. The outer error is the listener's (out of file descriptors and
    /// the like: worth a pause before trying again); the inner one is that connection's alone
    /// (it was reset before it could be set up).
    pub(crate) async fn accept(&self) -> io::Result<io::Result<Accepted>> {
        Ok(match self {
            Listener::Tcp(l) => {
                SocketTransport::from_tcp(l.accept().await?.0).map(Accepted::Socket)
            }
            Listener::Unix(l, _, _) => {
                SocketTransport::from_unix(l.accept().await?.0).map(Accepted::Socket)
            }
            Listener::UnixAbstract(l, _, users) => {
                let s = l.accept().await?.0;
                users
                    .check(&s, "client")
                    .and_then(|()| SocketTransport::from_unix(s))
                    .map(Accepted::Socket)
            }
            #[cfg(any(target_os = "linux", target_os = "android"))]
            Listener::Shm(l, _, users, budget) => {
                // Checked before anything is read: a refused client's hello (and its memfd)
                // is dropped with the socket.
                let s = l.accept().await?.0;
                users
                    .check(&s, "client")
                    .and_then(|()| s.into_std())
                    .and_then(|s| super::shm::PendingShm::new(s, budget))
                    .map(Accepted::Shm)
            }
            #[cfg(not(any(target_os = "linux", target_os = "android")))]
            Listener::Shm(..) => return Err(io::ErrorKind::Unsupported.into()),
            #[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
            Listener::Layered(l, faces) => {
                let (tcp, addr) = l.accept().await?;
                Ok(Accepted::Layered(faces.clone(), tcp, addr))
            }
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Only this server's own socket file: if another server has bound the path since,
        // the file there is that server's.
        if let Listener::Unix(_, p, id) = self {
            if file_id(p) == Some(*id) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}
