//! What happens to a connection once accepted: refused past `max_connections` (told why, on
//! its first call), or handed by its transport's accept (the shm hello; sniffing, TLS and
//! WebSocket handshakes: `transport/`) to the server's faces ([`Serving`]: the native engine
//! or the gRPC face); and [`StreamAcceptor`] for byte streams accepted elsewhere.

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

/// The server's faces for an accepted connection, once its transport's accept has set it up:
/// the native engine ([`serve_connection`]) or the gRPC face, with this server's methods,
/// limits and shutdown.
struct Serving {
    registry: Arc<Registry>,
    config: Config,
    signal: Shutdown,
}

impl crate::transport::Serve for Serving {
    fn native<T: crate::transport::Transport>(
        self,
        transport: T,
    ) -> impl Future<Output = ()> + Send {
        serve_connection(transport, self.registry, self.config, &self.signal)
    }

    fn silent<T: crate::transport::Transport>(
        self,
        transport: T,
    ) -> impl Future<Output = ()> + Send {
        // Silent for the whole handshake timeout already: the engine says TIMEOUT at once.
        let config = self.config.with_handshake_timeout(Duration::from_millis(1));
        serve_connection(transport, self.registry, config, &self.signal)
    }

    #[cfg(feature = "grpc")]
    fn grpc<S>(self, io: S, addr: crate::PeerAddr) -> impl Future<Output = ()> + Send
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let peer = crate::grpc::Peer {
            addr,
            #[cfg(feature = "tls")]
            tls: None,
        };
        crate::grpc::serve(io, peer, self.registry, self.config, self.signal)
    }

    #[cfg(all(feature = "grpc", feature = "tls"))]
    fn grpc_tls<S>(
        self,
        io: S,
        addr: crate::PeerAddr,
        tls: Arc<crate::tls::TlsPeer>,
    ) -> impl Future<Output = ()> + Send
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let peer = crate::grpc::Peer {
            addr,
            tls: Some(tls),
        };
        crate::grpc::serve(io, peer, self.registry, self.config, self.signal)
    }
}

/// The face of a connection over `max_connections`: [`refuse`] for a native client (a gRPC
/// client is closed).
struct Refusing(Config);

impl crate::transport::Serve for Refusing {
    fn native<T: crate::transport::Transport>(
        self,
        transport: T,
    ) -> impl Future<Output = ()> + Send {
        refuse(transport, self.0)
    }
}

/// Serves an accepted connection once its transport's accept has set it up: the shared-memory
/// hello, or a layered port's sniffing and handshakes. (`Server::serve` spawns a plain socket's
/// `serve_connection` itself, without this layer around it.)
pub(super) async fn serve_accepted(
    accepted: Accepted,
    registry: Arc<Registry>,
    config: Config,
    signal: Shutdown,
) {
    let timeout = config.handshake_timeout();
    let token = signal.token.clone();
    let serving = Serving {
        registry,
        config,
        signal,
    };
    accepted.serve(serving, timeout, &token).await;
}

/// Refuses a connection past `Config::max_connections`, telling a native client why.
pub(super) async fn refuse_accepted(accepted: Accepted, config: Config) {
    let timeout = config.handshake_timeout();
    accepted
        .refuse(Refusing(config), timeout, REFUSAL_WAIT)
        .await;
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
