//! The faces of a TCP listener: native topspin, TLS, WebSocket, WebSocket over TLS, or one
//! port that tells them apart by the client's first byte (`T` of the `TOPSPIN` preface, `0x16`
//! of a TLS handshake record, `G` of an HTTP `GET`, and with the gRPC face `P` of HTTP/2's
//! `PRI * HTTP/2.0` preface). Sniffing peeks: the bytes stay in the socket, and a native
//! connection then gets the ordinary socket transport, so the fast path pays one
//! `recv(MSG_PEEK)` per connection and nothing per call. After a TLS handshake, ALPN `h2` is
//! gRPC.

use super::socket::SocketTransport;
#[cfg(any(feature = "tls", feature = "websocket"))]
use super::stream::StreamTransport;
use super::PeerAddr;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;

#[cfg(feature = "tls")]
use super::tls::{ServerTls, TlsPeer};
#[cfg(feature = "websocket")]
use super::ws::{Replay, WebSocketSettings, WsStream};

/// How a server's TCP connections are served (all but plain TCP, which stays on the socket
/// fast path without this module).
#[derive(Clone, Debug)]
pub(crate) struct Faces {
    /// TLS: the only face of a `tls://` listener, or accepted when sniffed.
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<ServerTls>,
    /// A sniffing port that serves TLS clients only (mutual TLS, no plaintext opt-in).
    #[cfg(feature = "tls")]
    pub(crate) tls_only: bool,
    /// WebSocket settings and path: the face of a `ws://` (`wss://` with `tls`) listener.
    #[cfg(feature = "websocket")]
    pub(crate) ws: Option<(WebSocketSettings, String)>,
    /// Tell the faces apart by the first byte (plain topspin accepted too).
    pub(crate) sniff: bool,
    /// How long a sniffing server waits for a client's first byte.
    pub(crate) sniff_timeout: Duration,
    /// The gRPC face: `P` (HTTP/2 prior knowledge) and ALPN `h2` go to it.
    #[cfg(feature = "grpc")]
    pub(crate) grpc: bool,
    /// A plain `tcp://` port that sniffs only for gRPC: a client silent for the sniff timeout
    /// (the handshake timeout) is handed to the native engine, which tells it `TIMEOUT`.
    pub(crate) plain: bool,
}

/// One accepted connection, its layers set up (moved once into its connection task).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Upgraded {
    Native(SocketTransport),
    #[cfg(feature = "tls")]
    Tls(StreamTransport<tokio_rustls::server::TlsStream<TcpStream>>),
    #[cfg(feature = "websocket")]
    Ws(StreamTransport<WsStream<Replay<TcpStream>>>),
    #[cfg(all(feature = "tls", feature = "websocket"))]
    Wss(StreamTransport<WsStream<Replay<tokio_rustls::server::TlsStream<TcpStream>>>>),
    /// A native client that sent nothing within the handshake timeout (plain ports only).
    Silent(SocketTransport),
    /// HTTP/2 with prior knowledge: the gRPC face.
    #[cfg(feature = "grpc")]
    H2(TcpStream, PeerAddr),
    /// HTTP/2 over TLS (ALPN `h2`): the gRPC face.
    #[cfg(all(feature = "grpc", feature = "tls"))]
    TlsH2(
        tokio_rustls::server::TlsStream<TcpStream>,
        PeerAddr,
        std::sync::Arc<TlsPeer>,
    ),
}

/// What the first byte of a connection says it speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sniffed {
    Native,
    Tls,
    Http,
    /// `P` of HTTP/2's `PRI * HTTP/2.0` connection preface (gRPC face only).
    H2,
}

pub(crate) fn classify(first: u8, grpc: bool) -> Sniffed {
    match first {
        0x16 => Sniffed::Tls,        // TLS handshake record (ClientHello)
        b'G' => Sniffed::Http,       // GET: a WebSocket upgrade
        b'P' if grpc => Sniffed::H2, // PRI * HTTP/2.0: gRPC with prior knowledge
        _ => Sniffed::Native, // `T` of TOPSPIN, or garbage the engine rejects with BAD_PREFACE
    }
}

impl Faces {
    /// Whether the gRPC face is on.
    pub(crate) fn grpc(&self) -> bool {
        #[cfg(feature = "grpc")]
        return self.grpc;
        #[cfg(not(feature = "grpc"))]
        false
    }
}

impl Faces {
    /// Sets up the layers of one accepted connection (TLS handshake, WebSocket upgrade),
    /// within `timeout`. Errors say what failed.
    pub(crate) async fn upgrade(
        &self,
        tcp: TcpStream,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Upgraded, String> {
        let _ = tcp.set_nodelay(true);
        let kind = if self.sniff {
            let mut b = [0u8; 1];
            match tokio::time::timeout(self.sniff_timeout, tcp.peek(&mut b)).await {
                // A plain port tells only gRPC apart: anything else is the native engine's
                // (which answers garbage with BAD_PREFACE, as without the gRPC face).
                Ok(Ok(1)) if self.plain && classify(b[0], self.grpc()) != Sniffed::H2 => {
                    Sniffed::Native
                }
                Ok(Ok(1)) => classify(b[0], self.grpc()),
                Ok(Ok(_)) => return Err("closed before sending anything".into()),
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) if self.plain => {
                    return Ok(Upgraded::Silent(
                        SocketTransport::from_tcp(tcp).map_err(|e| e.to_string())?,
                    ))
                }
                Err(_) => return Err("sent nothing within the sniff timeout".into()),
            }
        } else {
            #[cfg(feature = "tls")]
            if self.tls.is_some() {
                Sniffed::Tls
            } else {
                Sniffed::Http
            }
            #[cfg(not(feature = "tls"))]
            Sniffed::Http
        };
        #[cfg(feature = "tls")]
        if self.tls_only && kind != Sniffed::Tls {
            return Err("a plaintext client on a port that requires client certificates (mutual TLS): refused (ServerBuilder::plaintext_beside_mtls)".into());
        }
        match tokio::time::timeout(timeout, self.layer(kind, tcp, addr)).await {
            Ok(r) => r,
            Err(_) => Err("the TLS or WebSocket handshake timed out".into()),
        }
    }

    async fn layer(
        &self,
        kind: Sniffed,
        tcp: TcpStream,
        addr: SocketAddr,
    ) -> Result<Upgraded, String> {
        let peer = PeerAddr::Tcp(addr);
        match kind {
            Sniffed::Native => Ok(Upgraded::Native(
                SocketTransport::from_tcp(tcp).map_err(|e| e.to_string())?,
            )),
            #[cfg(feature = "tls")]
            Sniffed::Tls => {
                let Some(tls) = &self.tls else {
                    return Err("a TLS client, and this port has no TLS settings".into());
                };
                let s = tls
                    .acceptor()
                    .accept(tcp)
                    .await
                    .map_err(|e| super::tls::handshake_error(&e))?;
                let info = TlsPeer::from_server(s.get_ref().1);
                #[cfg(feature = "grpc")]
                if self.grpc && s.get_ref().1.alpn_protocol() == Some(b"h2") {
                    return Ok(Upgraded::TlsH2(s, peer, std::sync::Arc::new(info)));
                }
                // Under a WebSocket the client's ALPN is http/1.1; native topspin is
                // topspin/1 or none.
                #[cfg(feature = "websocket")]
                if s.get_ref().1.alpn_protocol() == Some(b"http/1.1")
                    || (!self.sniff && self.ws.is_some())
                {
                    let Some((ws, path)) = &self.ws else {
                        return Err(
                            "a WebSocket client, and this port has no WebSocket path".into()
                        );
                    };
                    let ws = ws.accept(s, path).await?;
                    return Ok(Upgraded::Wss(
                        StreamTransport::new(ws, peer).with_tls_peer(info),
                    ));
                }
                Ok(Upgraded::Tls(
                    StreamTransport::new(s, peer).with_tls_peer(info),
                ))
            }
            #[cfg(feature = "websocket")]
            Sniffed::Http => {
                let Some((ws, path)) = &self.ws else {
                    return Err("an HTTP client, and this port has no WebSocket path".into());
                };
                let ws = ws.accept(tcp, path).await?;
                Ok(Upgraded::Ws(StreamTransport::new(ws, peer)))
            }
            #[cfg(feature = "grpc")]
            Sniffed::H2 => Ok(Upgraded::H2(tcp, peer)),
            #[allow(unreachable_patterns)]
            _ => Err("no transport for this client's first bytes".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_bytes() {
        assert_eq!(classify(b'T', true), Sniffed::Native);
        assert_eq!(classify(0x16, true), Sniffed::Tls);
        assert_eq!(classify(b'G', true), Sniffed::Http);
        assert_eq!(classify(b'P', true), Sniffed::H2);
        assert_eq!(classify(b'P', false), Sniffed::Native);
    }
}
