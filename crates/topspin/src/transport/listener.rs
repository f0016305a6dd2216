//! Listening sockets: TCP and Unix.

use super::socket::SocketTransport;
use crate::address::Address;
use std::io;
use std::path::{Path, PathBuf};
use tokio::net::{TcpListener, UnixListener};

#[derive(Debug)]
pub(crate) enum Listener {
    Tcp(TcpListener),
    /// The listener, its path, and the socket file's identity (device, inode) so that only
    /// this server's own file is removed when it stops.
    Unix(UnixListener, PathBuf, (u64, u64)),
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
/// taken over.
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

impl Listener {
    pub(crate) async fn bind(addr: &Address) -> io::Result<Listener> {
        match addr {
            Address::Tcp(hp) => Ok(Listener::Tcp(TcpListener::bind(hp.as_str()).await?)),
            // TLS and WebSocket listen on TCP; the server adds the layers per connection.
            Address::Tls(hp) | Address::Ws(hp, _) | Address::Wss(hp, _) => {
                Ok(Listener::Tcp(TcpListener::bind(hp.as_str()).await?))
            }
            Address::Unix(p) => {
                clear_stale_socket(p)?;
                let l = UnixListener::bind(p)?;
                let id = file_id(p).unwrap_or_default();
                Ok(Listener::Unix(l, p.clone(), id))
            }
        }
    }

    pub(crate) fn local_addr(&self) -> io::Result<Address> {
        match self {
            Listener::Tcp(l) => Ok(Address::from(l.local_addr()?)),
            Listener::Unix(_, p, _) => Ok(Address::Unix(p.clone())),
        }
    }

    /// Accepts a TCP connection as a tokio stream, for the transports layered over TCP (TLS,
    /// WebSocket, sniffing); `None` on a Unix listener.
    #[cfg(any(feature = "tls", feature = "websocket"))]
    pub(crate) async fn accept_tcp(
        &self,
    ) -> Option<io::Result<(tokio::net::TcpStream, std::net::SocketAddr)>> {
        match self {
            Listener::Tcp(l) => Some(l.accept().await),
            Listener::Unix(..) => None,
        }
    }

    pub(crate) async fn accept(&self) -> io::Result<SocketTransport> {
        match self {
            Listener::Tcp(l) => SocketTransport::from_tcp(l.accept().await?.0),
            Listener::Unix(l, _, _) => SocketTransport::from_unix(l.accept().await?.0),
        }
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
