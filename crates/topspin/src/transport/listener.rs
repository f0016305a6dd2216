//! Listening sockets: TCP and Unix.

use super::socket::SocketTransport;
use crate::address::Address;
use std::io;
use std::path::PathBuf;
use tokio::net::{TcpListener, UnixListener};

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

    pub(crate) async fn accept(&self) -> io::Result<SocketTransport> {
        match self {
            Listener::Tcp(l) => SocketTransport::from_tcp(l.accept().await?.0),
            Listener::Unix(l, _) => SocketTransport::from_unix(l.accept().await?.0),
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
