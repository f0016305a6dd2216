//! What happens to a connection once accepted: refused past `max_connections` (told why, on
//! its first call), the shm handshake, the native or gRPC face picked for it (`serve_layered`),
//! and [`StreamAcceptor`] for byte streams accepted elsewhere.

use super::*;

/// Connections over `max_connections` being told so at once; more are closed without a word.
pub(super) const MAX_REFUSALS: usize = 64;
/// The first and the longest pause after accepting failed.
pub(super) const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
pub(super) const ACCEPT_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// How long a refused connection is kept waiting for its first call (which then carries the
/// reason to the caller) before it is told anyway.
pub(super) const REFUSAL_WAIT: Duration = Duration::from_secs(1);
/// Bytes read from a refused connection at most.
pub(super) const REFUSAL_READ_LIMIT: usize = 64 * 1024;

/// Serves one accepted connection; with `Config::max_connection_age`, asks it to go away once
/// it is that old (±10%) and gives its calls `max_connection_age_grace`.
pub(super) fn serve_connection<T: crate::transport::Transport>(
    transport: T,
    registry: Arc<Registry>,
    config: Config,
    server: &Shutdown,
) -> impl Future<Output = ()> + Send + 'static {
    let age = crate::connection::liveness::jittered_age(&config)
        .map(|age| (age, config.max_connection_age_grace(), server.child()));
    use futures_util::future::Either;
    let Some((age, grace, signal)) = age else {
        // No age limit (the default): the connection's own future, with no layer around it.
        return Either::Left(conn::serve(transport, registry, config, server.clone()));
    };
    Either::Right(async move {
        let serve = conn::serve(transport, registry, config, signal.clone());
        tokio::pin!(serve);
        tokio::select! {
            biased; // the connection first: the timer is the rare case
            () = &mut serve => return,
            () = tokio::time::sleep(age) => {}
        }
        tracing::debug!("connection reached its max_connection_age ({age:?}): going away");
        signal.begin(grace);
        serve.await;
    })
}

/// A `shm://` client's hello, within the handshake timeout; `None` (logged) when it does
/// not come or is refused.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(super) async fn shm_handshake(
    pending: crate::transport::shm::PendingShm,
    config: &Config,
) -> Option<crate::transport::shm::ShmTransport> {
    match tokio::time::timeout(config.handshake_timeout(), pending.handshake()).await {
        Ok(Ok(t)) => Some(t),
        Ok(Err(e)) => {
            tracing::debug!("a shm:// handshake failed: {e}");
            None
        }
        Err(_) => {
            tracing::debug!("a shm:// client sent no hello within the handshake timeout");
            None
        }
    }
}

/// Tells a connection over `Config::max_connections` why it is refused, then closes it: it
/// gets the preface and SETTINGS, and once its first call arrives (so that the call fails with
/// the reason) or after [`REFUSAL_WAIT`], an ERROR frame naming the limit. No connection task,
/// no handler, a small buffer and a bounded time.
pub(super) async fn refuse<T: crate::transport::Transport>(mut transport: T, config: Config) {
    use topspin_proto::{Connection, ErrorCode, Event, ProtocolError, Side};
    let limit = config.max_connections();
    tracing::debug!(peer = %transport.peer_addr(), "refusing a connection: max_connections ({limit}) reached");
    let mut conn = Connection::new(Side::Server, config.settings());
    let wait = REFUSAL_WAIT.min(config.handshake_timeout());
    let _ = tokio::time::timeout(wait, async {
        let mut buf = bytes::BytesMut::with_capacity(4096);
        write_all(&mut transport, &mut conn).await?;
        loop {
            if buf.capacity() - buf.len() < 1024 {
                if buf.len() >= REFUSAL_READ_LIMIT {
                    return Ok(());
                }
                buf.reserve(4096);
            }
            let n = std::future::poll_fn(|cx| transport.poll_read(cx, &mut buf)).await?;
            if n == 0 || conn.handle_input(&mut buf, Instant::now()).is_err() {
                return Ok(());
            }
            while let Some(event) = conn.poll_event() {
                if let Event::CallStarted { .. } = event {
                    return Ok(());
                }
            }
            write_all(&mut transport, &mut conn).await?; // PING answers
        }
    })
    .await
    .unwrap_or(Ok::<(), std::io::Error>(()));
    conn.close(ProtocolError::new(
        ErrorCode::INTERNAL_ERROR,
        format!("max_connections ({limit}) reached: the server takes no more connections now; try again later"),
    ));
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = write_all(&mut transport, &mut conn).await;
        let _ = std::future::poll_fn(|cx| transport.poll_shutdown(cx)).await;
    })
    .await;
}

/// [`refuse`] for a plain port with the gRPC face: a client whose first byte (awaited up to
/// [`REFUSAL_WAIT`]) is not HTTP/2's is refused as a native one; a gRPC client is closed.
#[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
pub(super) async fn refuse_sniffed(tcp: tokio::net::TcpStream, config: Config) {
    let mut b = [0u8; 1];
    if let Ok(Ok(1)) = tokio::time::timeout(REFUSAL_WAIT, tcp.peek(&mut b)).await {
        if b[0] == b'P' {
            return;
        }
    }
    if let Ok(t) = crate::transport::socket::SocketTransport::from_tcp(tcp) {
        refuse(t, config).await;
    }
}

/// Writes everything the engine has queued.
pub(super) async fn write_all<T: crate::transport::Transport>(
    transport: &mut T,
    conn: &mut topspin_proto::Connection,
) -> std::io::Result<()> {
    use bytes::Buf;
    while let Some(mut b) = conn.poll_transmit() {
        while !b.is_empty() {
            let slice = [std::io::IoSlice::new(&b)];
            let n = std::future::poll_fn(|cx| transport.poll_write_vectored(cx, &slice)).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            b.advance(n);
        }
    }
    Ok(())
}

/// What the accept loop took.
pub(super) enum Accepted {
    /// A socket or shared-memory connection, ready for the protocol.
    Plain(crate::transport::Accepted),
    #[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
    Layered(
        Arc<crate::transport::sniff::Faces>,
        tokio::net::TcpStream,
        std::net::SocketAddr,
    ),
}

/// Serves an accepted connection: its shared-memory handshake or the face its first bytes
/// pick first, if it needs one. (`Server::serve` spawns a plain socket's `serve_connection`
/// itself, without this layer around it.)
pub(super) async fn serve_accepted(
    accepted: Accepted,
    registry: Arc<Registry>,
    config: Config,
    signal: Shutdown,
) {
    match accepted {
        Accepted::Plain(crate::transport::Accepted::Socket(transport)) => {
            serve_connection(transport, registry, config, &signal).await;
        }
        #[cfg(any(target_os = "linux", target_os = "android"))]
        Accepted::Plain(crate::transport::Accepted::Shm(pending)) => {
            if let Some(t) = shm_handshake(pending, &config).await {
                serve_connection(t, registry, config, &signal).await;
            }
        }
        #[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
        Accepted::Layered(faces, tcp, addr) => {
            serve_layered(faces, tcp, addr, registry, config, signal).await;
        }
    }
}

/// Refuses a connection past `Config::max_connections`, telling a native client why.
pub(super) async fn refuse_accepted(accepted: Accepted, config: Config) {
    match accepted {
        Accepted::Plain(crate::transport::Accepted::Socket(transport)) => {
            refuse(transport, config).await;
        }
        #[cfg(any(target_os = "linux", target_os = "android"))]
        Accepted::Plain(crate::transport::Accepted::Shm(pending)) => {
            if let Some(t) = shm_handshake(pending, &config).await {
                refuse(t, config).await;
            }
        }
        // A plain port's native client is told why, as without the gRPC face.
        #[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
        Accepted::Layered(faces, tcp, _) if faces.plain => refuse_sniffed(tcp, config).await,
        // Closed at once (its TLS or WebSocket handshake is not worth doing to refuse it).
        #[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
        Accepted::Layered(..) => {}
    }
}

/// Sets up a connection's TLS and WebSocket layers (within the handshake timeout) on its own
/// task, then serves it; a failed handshake ends that connection only.
#[cfg(any(feature = "tls", feature = "websocket", feature = "grpc"))]
pub(super) async fn serve_layered(
    faces: Arc<crate::transport::sniff::Faces>,
    tcp: tokio::net::TcpStream,
    addr: std::net::SocketAddr,
    registry: Arc<Registry>,
    config: Config,
    signal: Shutdown,
) {
    use crate::transport::sniff::Upgraded;
    // A shutdown drops connections still in their TLS or WebSocket handshake. A plain port's
    // sniff (one peeked byte, bounded by the handshake timeout) is let finish instead: a
    // native client sends its first CALLs with its preface, and only the engine can tell it,
    // with GOAWAY, that they were not processed (so they are safe to send elsewhere).
    let upgraded = if faces.plain {
        faces.upgrade(tcp, addr, config.handshake_timeout()).await
    } else {
        tokio::select! {
            r = faces.upgrade(tcp, addr, config.handshake_timeout()) => r,
            _ = signal.token.cancelled() => Err("the server is shutting down".into()),
        }
    };
    match upgraded {
        Ok(Upgraded::Native(t)) => serve_connection(t, registry, config, &signal).await,
        #[cfg(feature = "tls")]
        Ok(Upgraded::Tls(t)) => serve_connection(t, registry, config, &signal).await,
        #[cfg(feature = "websocket")]
        Ok(Upgraded::Ws(t)) => serve_connection(t, registry, config, &signal).await,
        #[cfg(all(feature = "tls", feature = "websocket"))]
        Ok(Upgraded::Wss(t)) => serve_connection(t, registry, config, &signal).await,
        Ok(Upgraded::Silent(t)) => {
            // Silent for the whole handshake timeout already: the engine says TIMEOUT at once.
            let config = config.with_handshake_timeout(Duration::from_millis(1));
            serve_connection(t, registry, config, &signal).await
        }
        #[cfg(feature = "grpc")]
        Ok(Upgraded::H2(tcp, addr)) => {
            let peer = crate::grpc::Peer {
                addr,
                #[cfg(feature = "tls")]
                tls: None,
            };
            crate::grpc::serve(tcp, peer, registry, config, signal).await
        }
        #[cfg(all(feature = "grpc", feature = "tls"))]
        Ok(Upgraded::TlsH2(s, addr, tls)) => {
            let peer = crate::grpc::Peer {
                addr,
                tls: Some(tls),
            };
            crate::grpc::serve(s, peer, registry, config, signal).await
        }
        Err(why) => tracing::debug!(peer = %addr, "connection refused: {why}"),
    }
}

/// Serves connections over byte streams the application accepted itself (see
/// [`Server::stream_acceptor`]). Cheap to clone.
#[derive(Clone, Debug)]
pub struct StreamAcceptor {
    pub(super) registry: Arc<Registry>,
    pub(super) config: Config,
    pub(super) signal: Shutdown,
}

impl StreamAcceptor {
    /// Serves one connection over `stream` until it ends (spawn the future). Its peer address
    /// is [`PeerAddr::Stream`](crate::PeerAddr::Stream).
    pub fn serve<S>(&self, stream: S) -> impl Future<Output = ()> + Send + 'static
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let transport =
            crate::transport::stream::StreamTransport::new(stream, crate::PeerAddr::Stream);
        conn::serve(
            transport,
            self.registry.clone(),
            self.config.clone(),
            self.signal.clone(),
        )
    }
}
