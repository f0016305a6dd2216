//! The WebSocket transport's handshakes both ways — the server's upgrade (answering what is not
//! one `426`) and the client's — and its dial (`ws://`) and accept (a `ws://` port's client, or
//! one a sniffing port told by its `GET`). `wss://` is `tls.rs`'s: its TLS handshake, then
//! these.

use super::*;
use crate::transport::stream::StreamTransport;
use crate::transport::{Dial, Faces, Handshake, PeerAddr, Serve, Start};
use crate::Status;

impl WebSocketSettings {
    /// Server side: runs the upgrade handshake on `stream` for `path`. A request that is not
    /// a WebSocket upgrade (a browser opening the URL, `curl`) is answered `426 Upgrade
    /// Required` (protocol.md §14.2) and the connection closed.
    #[allow(clippy::result_large_err)] // tungstenite's callback type
    pub(crate) async fn accept<S>(
        &self,
        mut stream: S,
        path: &str,
    ) -> Result<WsStream<Replay<S>>, String>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        // tungstenite refuses a request without the upgrade headers before any callback, and
        // writes no answer: read the head first, answer what is not an upgrade, and replay the
        // head to tungstenite otherwise.
        let head = read_head(&mut stream).await?;
        if !is_upgrade(&head) {
            use tokio::io::AsyncWriteExt;
            if !is_http(&head) {
                return Err("WebSocket handshake failed: not an HTTP request".into());
            }
            let _ = stream.write_all(UPGRADE_REQUIRED).await;
            let _ = stream.shutdown().await;
            return Err("not a WebSocket upgrade request: answered 426 Upgrade Required".into());
        }
        let stream = Metered::new(Replay {
            head,
            inner: stream,
        });
        let ws = tokio_tungstenite::accept_hdr_async_with_config(
            stream,
            |req: &Request, resp: Response| self.check(path, req, resp),
            Some(self.config()),
        )
        .await
        .map_err(|e| format!("WebSocket handshake failed: {e}"))?;
        Ok(WsStream::new(ws, self.bounds.clone()))
    }

    /// Client side: runs the upgrade handshake on `stream` to `url` (`ws://…` or `wss://…`).
    pub(crate) async fn connect<S>(&self, stream: S, url: &str) -> Result<WsStream<S>, String>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut req = url
            .into_client_request()
            .map_err(|e| format!("invalid WebSocket URL {url}: {e}"))?;
        req.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_static(SUBPROTOCOL),
        );
        let (ws, resp) = tokio_tungstenite::client_async_with_config(
            req,
            Metered::new(stream),
            Some(self.config()),
        )
        .await
        .map_err(|e| format!("WebSocket handshake failed: {e}"))?;
        let agreed = resp
            .headers()
            .get("sec-websocket-protocol")
            .is_some_and(|v| v.as_bytes() == SUBPROTOCOL.as_bytes());
        if !agreed {
            return Err(
                "WebSocket handshake failed: the server did not agree to topspin.v1".into(),
            );
        }
        Ok(WsStream::new(ws, self.bounds.clone()))
    }
}

/// The WebSocket transport's dial (`ws://`): TCP, the upgrade, then the native protocol in
/// binary messages.
pub(crate) async fn dial<S: Start>(d: &Dial<'_>, hp: &str, start: S) -> Result<S::Conn, Status> {
    let (url, ws) = (
        d.address.to_string(),
        d.layers.websocket.bounded_by(d.config),
    );
    let connect = async {
        let tcp = crate::transport::tcp_connect(hp)
            .await
            .map_err(|e| e.to_string())?;
        ws.connect(tcp, &url).await
    };
    let s = d.within("connect and WebSocket handshake", connect).await?;
    let peer = crate::transport::peer_of(s.get_ref());
    start.native(StreamTransport::new(s, peer)).await
}

/// The WebSocket transport's accept: the upgrade on the port's path, then the native protocol.
pub(crate) async fn accept<S: Serve>(
    faces: &Faces,
    tcp: tokio::net::TcpStream,
    peer: PeerAddr,
    handshake: &Handshake<'_>,
    serve: S,
) -> Result<(), String> {
    let Some((ws, path)) = &faces.ws else {
        return Err("an HTTP client, and this port has no WebSocket path".into());
    };
    let ws = handshake.within(ws.accept(tcp, path)).await?;
    serve.native(StreamTransport::new(ws, peer)).await;
    Ok(())
}
