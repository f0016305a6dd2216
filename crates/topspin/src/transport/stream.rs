//! The transport over any `AsyncRead + AsyncWrite` byte stream: TLS, WebSocket adapters, user
//! streams, in-memory pipes.

use super::{PeerAddr, Transport};
use bytes::BytesMut;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};

/// Bytes over a stream. Vectored writes are used when the stream supports them; otherwise the
/// stream takes the first slice per call (small frames arrive coalesced anyway).
#[derive(Debug)]
pub(crate) struct StreamTransport<S> {
    io: S,
    peer: PeerAddr,
    #[cfg(feature = "tls")]
    tls: Option<std::sync::Arc<super::tls::TlsPeer>>,
}

impl<S> StreamTransport<S>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    pub(crate) fn new(io: S, peer: PeerAddr) -> StreamTransport<S> {
        StreamTransport {
            io,
            peer,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// The same, with what the TLS handshake under the stream established about the peer.
    #[cfg(feature = "tls")]
    pub(crate) fn with_tls_peer(mut self, tls: super::tls::TlsPeer) -> StreamTransport<S> {
        self.tls = Some(std::sync::Arc::new(tls));
        self
    }
}

impl<S> Transport for StreamTransport<S>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, buf)
    }

    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let io = Pin::new(&mut self.io);
        if io.is_write_vectored() {
            return io.poll_write_vectored(cx, bufs);
        }
        match bufs.iter().find(|b| !b.is_empty()) {
            Some(b) => io.poll_write(cx, b),
            None => Poll::Ready(Ok(0)),
        }
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn peer_addr(&self) -> PeerAddr {
        self.peer.clone()
    }

    #[cfg(feature = "tls")]
    fn tls_peer(&self) -> Option<std::sync::Arc<super::tls::TlsPeer>> {
        self.tls.clone()
    }
}
