//! The faces of a TCP listener: native topspin, TLS, WebSocket, WebSocket over TLS, or one
//! port that tells them apart by the client's first byte (`T` of the `TOPSPIN` preface, `0x16`
//! of a TLS handshake record, `G` of an HTTP `GET`, and with the gRPC face `P` of HTTP/2's
//! `PRI * HTTP/2.0` preface). Sniffing peeks: the bytes stay in the socket, and a native
//! connection then gets the ordinary socket transport, so the fast path pays one
//! `recv(MSG_PEEK)` per connection and nothing per call. A TLS client is `tls.rs`'s to accept
//! (after its handshake, ALPN `h2` is gRPC), a WebSocket upgrade `ws.rs`'s.

use super::socket::SocketTransport;
use super::{cancellable, FaceSettings, Faces, PeerAddr, Serve};
use crate::{Address, Config};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;

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

impl FaceSettings {
    fn grpc_on(&self) -> bool {
        #[cfg(feature = "grpc")]
        return !self.no_grpc;
        #[cfg(not(feature = "grpc"))]
        false
    }

    /// The faces of a listener on `address`; `None` for the plain socket fast path. Errors
    /// say why the address cannot be served with these settings.
    #[allow(unused_mut)]
    pub(crate) fn faces(
        &self,
        address: &Address,
        config: &Config,
    ) -> Result<Option<Faces>, String> {
        let grpc = self.grpc_on();
        let mut faces = Faces {
            #[cfg(feature = "tls")]
            tls: None,
            #[cfg(feature = "tls")]
            tls_only: false,
            #[cfg(feature = "websocket")]
            ws: None,
            sniff: false,
            sniff_timeout: self.sniff.unwrap_or(Duration::from_secs(5)),
            #[cfg(feature = "grpc")]
            grpc,
            plain: false,
        };
        match address {
            Address::Tcp(_) if self.sniff.is_none() => {
                #[cfg(feature = "tls")]
                if self.tls.is_some() {
                    return Err("TLS settings on a plain tcp:// address would be ignored: bind tls:// (or sniff_transports to serve TLS and plaintext on one port)".into());
                }
                if !grpc {
                    return Ok(None);
                }
                // Only gRPC is told apart: a client silent for the handshake timeout is the
                // native engine's to time out.
                faces.sniff = true;
                faces.plain = true;
                faces.sniff_timeout = config.handshake_timeout();
            }
            Address::Tcp(_) => self.sniff_every_face(&mut faces, grpc, config),
            #[cfg(feature = "tls")]
            Address::Tls(_) => {
                let tls = self
                    .tls
                    .as_ref()
                    .ok_or("a tls:// address needs ServerBuilder::tls")?;
                faces.tls = Some(if grpc {
                    tls.with_alpn(&[super::tls::ALPN, b"h2"])
                } else {
                    tls.clone()
                });
            }
            #[cfg(feature = "websocket")]
            Address::Ws(_, path) => {
                faces.ws = Some((self.websocket.bounded_by(config), path.clone()));
            }
            #[cfg(all(feature = "tls", feature = "websocket"))]
            Address::Wss(_, path) => {
                let tls = self
                    .tls
                    .as_ref()
                    .ok_or("a wss:// address needs ServerBuilder::tls")?;
                faces.tls = Some(tls.with_alpn(&[b"http/1.1"]));
                faces.ws = Some((self.websocket.bounded_by(config), path.clone()));
            }
            Address::Unix(_) | Address::UnixAbstract(_) | Address::Dns(_) | Address::Shm(_) => {
                return Ok(None)
            }
            Address::Grpc(_) | Address::Grpcs(_) => return Err(
                "grpc:// and grpcs:// name a gRPC server to call: a server binds tcp:// or tls://"
                    .into(),
            ),
            #[allow(unreachable_patterns)]
            _ => return Err("this build lacks the feature for it (tls, websocket)".into()),
        }
        Ok(Some(faces))
    }

    /// A `tcp://` port with `sniff_transports`: every face this server has, told apart by the
    /// first bytes (TLS, with its ALPN for topspin, gRPC and WebSocket; WebSocket; gRPC; the
    /// native protocol).
    #[allow(unused_variables)]
    fn sniff_every_face(&self, faces: &mut Faces, grpc: bool, config: &Config) {
        faces.sniff = true;
        #[cfg(feature = "tls")]
        {
            let alpn: &[&[u8]] = if grpc {
                &[super::tls::ALPN, b"h2", b"http/1.1"]
            } else {
                &[super::tls::ALPN, b"http/1.1"]
            };
            faces.tls = self.tls.as_ref().map(|t| t.with_alpn(alpn));
            faces.tls_only = self
                .tls
                .as_ref()
                .is_some_and(|t| t.requires_client_certificates())
                && !self.plaintext_beside_mtls;
        }
        #[cfg(feature = "websocket")]
        {
            faces.ws = Some((
                self.websocket.bounded_by(config),
                self.websocket.get_path().to_owned(),
            ));
        }
    }
}

impl Faces {
    /// Accepts one TCP connection of this listener: tells its face by the first byte (when
    /// sniffing), sets up its layers (the TLS handshake, the WebSocket upgrade) within
    /// `timeout`, then hands it to `serve`. `shutdown` drops a connection still being set up
    /// (but a plain port's sniff is let finish: a native client sends its first CALLs with
    /// its preface, and only the engine can tell it, with GOAWAY, that they were not
    /// processed). Errors say why the connection was not served.
    #[cfg_attr(
        not(any(feature = "tls", feature = "websocket")),
        allow(unused_variables)
    )]
    pub(crate) async fn accept<S: Serve>(
        &self,
        tcp: TcpStream,
        addr: SocketAddr,
        timeout: Duration,
        shutdown: &tokio_util::sync::CancellationToken,
        serve: S,
    ) -> Result<(), String> {
        let _ = tcp.set_nodelay(true);
        let shutdown = (!self.plain).then_some(shutdown);
        let kind = if self.sniff {
            let mut b = [0u8; 1];
            let peek =
                async { Ok(tokio::time::timeout(self.sniff_timeout, tcp.peek(&mut b)).await) };
            match cancellable(shutdown, peek).await? {
                // A plain port tells only gRPC apart: anything else is the native engine's
                // (which answers garbage with BAD_PREFACE, as without the gRPC face).
                Ok(Ok(1)) if self.plain && classify(b[0], self.grpc()) != Sniffed::H2 => {
                    Sniffed::Native
                }
                Ok(Ok(1)) => classify(b[0], self.grpc()),
                Ok(Ok(_)) => return Err("closed before sending anything".into()),
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) if self.plain => {
                    let t = SocketTransport::from_tcp(tcp).map_err(|e| e.to_string())?;
                    serve.silent(t).await;
                    return Ok(());
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
        #[cfg(any(feature = "tls", feature = "websocket"))]
        let handshake = super::Handshake {
            deadline: tokio::time::Instant::now() + timeout,
            shutdown,
        };
        let peer = PeerAddr::Tcp(addr);
        match kind {
            Sniffed::Native => {
                let t = SocketTransport::from_tcp(tcp).map_err(|e| e.to_string())?;
                serve.native(t).await;
                Ok(())
            }
            #[cfg(feature = "tls")]
            Sniffed::Tls => super::tls::accept(self, tcp, peer, &handshake, serve).await,
            #[cfg(feature = "websocket")]
            Sniffed::Http => super::ws::accept(self, tcp, peer, &handshake, serve).await,
            #[cfg(feature = "grpc")]
            Sniffed::H2 => {
                serve.grpc(tcp, peer).await;
                Ok(())
            }
            #[allow(unreachable_patterns)]
            _ => Err("no transport for this client's first bytes".into()),
        }
    }

    /// Hands a connection over `max_connections` to `refuse`: a plain port's client whose
    /// first byte (awaited up to `wait`) is not HTTP/2's is refused as a native one; a gRPC
    /// client is closed, and so is every client of a TLS or WebSocket port (its handshake is
    /// not worth doing to refuse it).
    pub(crate) async fn refuse<S: Serve>(&self, tcp: TcpStream, wait: Duration, refuse: S) {
        if !self.plain {
            return;
        }
        let mut b = [0u8; 1];
        if let Ok(Ok(1)) = tokio::time::timeout(wait, tcp.peek(&mut b)).await {
            if b[0] == b'P' {
                return;
            }
        }
        if let Ok(t) = SocketTransport::from_tcp(tcp) {
            refuse.native(t).await;
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
