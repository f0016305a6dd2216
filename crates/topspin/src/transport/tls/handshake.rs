//! The TLS transport's dial (`tls://`; `grpcs://` for the gRPC client mode; `wss://`, TLS
//! under a WebSocket) and its accept (a `tls://` or `wss://` port's client, or one a sniffing
//! port told by its first byte), the handshake within the handshake timeout.

use super::{handshake_error, TlsPeer, ALPN};
use crate::transport::stream::StreamTransport;
use crate::transport::{Dial, Faces, Failed, Handshake, PeerAddr, Serve, Start};
use crate::Status;

/// The TLS transport's dial (`tls://`): TCP, the TLS handshake (ALPN `topspin/1`), then the
/// native protocol over the stream.
pub(crate) async fn dial<S: Start>(d: &Dial<'_>, hp: &str, start: S) -> Result<S::Conn, Status> {
    let tls = d.layers.tls.clone().unwrap_or_default();
    let host = d.address.host().unwrap_or_default();
    let connect = tls.connect(hp, host, ALPN);
    let s = d.within("connect and TLS handshake", connect).await?;
    let peer = crate::transport::peer_of(s.get_ref().0);
    start.native(StreamTransport::new(s, peer)).await
}

/// `grpcs://`: TCP, the TLS handshake offering ALPN `h2`, and the HTTP/2 handshake of the gRPC
/// client mode, all within the handshake timeout.
pub(crate) async fn dial_grpc<S: Start>(
    d: &Dial<'_>,
    hp: &str,
    start: S,
) -> Result<S::Conn, Status> {
    let tls = d.layers.tls.clone().unwrap_or_default();
    let host = d.address.host().unwrap_or_default();
    let start = async {
        let s = tls
            .connect(hp, host, b"h2")
            .await
            .map_err(|e| Failed(d.failed(&e)))?;
        start
            .grpc(s, http::uri::Scheme::HTTPS)
            .await
            .map_err(Failed)
    };
    d.within("connect, TLS and HTTP/2 handshakes", start).await
}

/// `wss://`: TCP, the TLS handshake (ALPN `http/1.1`), the WebSocket upgrade, then the native
/// protocol in binary messages.
#[cfg(feature = "websocket")]
pub(crate) async fn dial_ws<S: Start>(d: &Dial<'_>, hp: &str, start: S) -> Result<S::Conn, Status> {
    let (url, ws) = (
        d.address.to_string(),
        d.layers.websocket.bounded_by(d.config),
    );
    let tls = d.layers.tls.clone().unwrap_or_default();
    let host = d.address.host().unwrap_or_default();
    let connect = async {
        let s = tls.connect(hp, host, b"http/1.1").await?;
        ws.connect(s, &url).await
    };
    let s = d
        .within("connect, TLS and WebSocket handshakes", connect)
        .await?;
    let peer = crate::transport::peer_of(s.get_ref().get_ref().0);
    start.native(StreamTransport::new(s, peer)).await
}

/// The TLS transport's accept: a TLS client of a `tls://` or `wss://` port, or one a sniffing
/// port told by its first byte. The handshake, then by what it agreed: ALPN `h2` is the gRPC
/// face, `http/1.1` (or any client of a `wss://` port) a WebSocket upgrade, anything else the
/// native protocol; what the handshake established about the client goes with it.
pub(crate) async fn accept<S: Serve>(
    faces: &Faces,
    tcp: tokio::net::TcpStream,
    peer: PeerAddr,
    handshake: &Handshake<'_>,
    serve: S,
) -> Result<(), String> {
    let Some(tls) = &faces.tls else {
        return Err("a TLS client, and this port has no TLS settings".into());
    };
    let accept = async {
        tls.acceptor()
            .accept(tcp)
            .await
            .map_err(|e| handshake_error(&e))
    };
    let s = handshake.within(accept).await?;
    let info = TlsPeer::from_server(s.get_ref().1);
    #[cfg(feature = "grpc")]
    if faces.grpc && s.get_ref().1.alpn_protocol() == Some(b"h2") {
        serve.grpc_tls(s, peer, std::sync::Arc::new(info)).await;
        return Ok(());
    }
    // Under a WebSocket the client's ALPN is http/1.1; native topspin is topspin/1 or none.
    #[cfg(feature = "websocket")]
    if s.get_ref().1.alpn_protocol() == Some(b"http/1.1") || (!faces.sniff && faces.ws.is_some()) {
        let Some((ws, path)) = &faces.ws else {
            return Err("a WebSocket client, and this port has no WebSocket path".into());
        };
        let ws = handshake.within(ws.accept(s, path)).await?;
        serve
            .native(StreamTransport::new(ws, peer).with_tls_peer(info))
            .await;
        return Ok(());
    }
    serve
        .native(StreamTransport::new(s, peer).with_tls_peer(info))
        .await;
    Ok(())
}
