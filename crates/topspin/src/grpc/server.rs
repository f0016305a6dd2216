//! One HTTP/2 connection of the gRPC face: h2's handshake, its timers (handshake, frame,
//! write, idle and keep-alive from `live.rs`; age, shutdown grace) and its loop; h2 accepts streams, each a
//! call run on the connection's task by [`Face::call`] (`call.rs`).

use super::call::{Face, Unsent};
use super::live::{Coalesced, Lapse, LapseTimer, Pings, Timers};
use super::wire::Frame;
use super::Peer;
use crate::connection::liveness;
use crate::request::Protocol;
use crate::server::{Registry, Shutdown};
use crate::Config;
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Response bytes h2 buffers per stream beyond what the client's window lets out (h2's
/// default); a handler's next message waits until they are written.
const SEND_BUFFER: usize = 400 * 1024;
/// Header-list room beyond `max_metadata_size`, for the HTTP/2 and gRPC headers themselves.
const HEADER_ROOM: u32 = 4096;

/// Serves gRPC over HTTP/2 on `io` (h2c with prior knowledge, or TLS that agreed on `h2`)
/// until the client closes it or a graceful shutdown completes.
pub(crate) fn serve<IO>(
    io: IO,
    peer: Peer,
    registry: Arc<Registry>,
    config: Config,
    shutdown: Shutdown,
) -> impl Future<Output = ()> + Send + 'static
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    Coalesced::new(run(io, peer, registry, config, shutdown))
}

async fn run<IO>(io: IO, peer: Peer, registry: Arc<Registry>, config: Config, shutdown: Shutdown)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // In `Server::gauges()` from the handshake until the connection is gone, as a native one.
    let mut share = crate::stats::Share::new(config.gauges.as_ref());
    // `Config::max_connection_age`, jittered as for native connections.
    let age = liveness::jittered_age(&config);
    let started = Instant::now();
    let (io, tracker) = super::watch::Watched::new(io);
    let Some(mut conn) = handshake(io, &peer, &config, &shutdown).await else {
        return;
    };
    let face = face(registry, peer, &config, started);
    let mut calls = FuturesUnordered::new();
    let grace = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(grace);
    let aged = tokio::time::sleep(age.unwrap_or(Duration::ZERO));
    tokio::pin!(aged);
    let mut going = Going::default();
    // The handshake (the client's SETTINGS), frame, write, idle and keep-alive timers, as on a
    // native connection; the keep-alive PINGs are h2's.
    let changed = super::watch::read(&tracker).changed.clone();
    let mut pings = Pings::new(config.keepalive_interval().and_then(|_| conn.ping_pong()));
    let mut timers = Timers::new(tracker, started, &config);
    let lapse = tokio::time::sleep_until(started.into());
    tokio::pin!(lapse);
    let mut timer = LapseTimer::default();
    loop {
        let next = timers.next(calls.is_empty() && !going.away);
        timer.arm(lapse.as_mut(), next);
        tokio::select! {
            () = poll_fn(|cx| timer.poll(lapse.as_mut(), cx)), if next.is_some() => {
                timer.armed = None;
                let idle = calls.is_empty() && !going.away;
                let lapsed = timers.lapsed(idle, &mut pings);
                if going.on_lapse(lapsed, &mut conn, &face.peer, &config) {
                    break;
                }
            }
            accepted = conn.accept() => match accepted {
                Some(Ok((req, respond))) => calls.push(face.call(req, respond)),
                Some(Err(e)) => {
                    tracing::debug!(peer = %face.peer.addr, "gRPC connection ends: {e}");
                    break;
                }
                None => break,
            },
            Some(()) = calls.next(), if !calls.is_empty() => {}
            // A frame became incomplete or writes stalled: re-arm for its timer.
            () = poll_fn(|_| if changed.take() { Poll::Ready(()) } else { Poll::Pending }) => {}
            // The keep-alive PING's answer (an error: the connection is gone, `accept` says).
            pong = poll_fn(|cx| pings.poll_pong(cx)) => if pong.is_ok() {
                timers.alive();
            },
            () = shutdown.token.cancelled(), if !going.shutting => {
                going.on_shutdown(&shutdown, grace.as_mut(), &mut conn);
            }
            () = &mut aged, if age.is_some() && !going.away => {
                tracing::debug!(peer = %face.peer.addr, "gRPC connection reached its max_connection_age ({age:?}): going away");
                going.on_aged(&config, grace.as_mut(), &mut conn);
            }
            () = &mut grace, if going.away && !going.aborted => {
                going.aborted = true;
                face.abort.cancel();
            }
        }
        share.report(calls.len(), face.unsent.get());
    }
    // Calls still here lost their connection: dropping them cancels their handlers.
    drop(calls);
}

/// h2's handshake, the client's preface included, within `Config::handshake_timeout` (or
/// until the server shuts down); `None`: it failed (logged).
async fn handshake<IO>(
    io: super::watch::Watched<IO>,
    peer: &Peer,
    config: &Config,
    shutdown: &Shutdown,
) -> Option<h2::server::Connection<super::watch::Watched<IO>, Frame>>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let window = super::stream_window(config);
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(config.max_concurrent_calls())
        .initial_window_size(window)
        .initial_connection_window_size(window.saturating_mul(2).min(i32::MAX as u32))
        .max_header_list_size(config.max_metadata_size().saturating_add(HEADER_ROOM))
        .max_send_buffer_size(SEND_BUFFER);
    let handshake = tokio::time::timeout(
        config.handshake_timeout(),
        builder.handshake::<_, Frame>(io),
    );
    tokio::select! {
        r = handshake => match r {
            Ok(Ok(c)) => Some(c),
            Ok(Err(e)) => {
                tracing::debug!(peer = %peer.addr, "gRPC connection: HTTP/2 handshake failed: {e}");
                None
            }
            Err(_) => {
                tracing::debug!(peer = %peer.addr, "gRPC connection: HTTP/2 handshake timed out");
                None
            }
        },
        () = shutdown.token.cancelled() => None,
    }
}

/// What every call of a connection shares.
fn face(registry: Arc<Registry>, peer: Peer, config: &Config, started: Instant) -> Face {
    let (unary_tx, unary_rx) = mpsc::channel(1);
    // gRPC's compression is in its own frames, handled here: the handlers' codecs see plain
    // messages.
    let context = Arc::new(crate::request::ConnContext {
        peer: peer.addr.clone(),
        #[cfg(feature = "tls")]
        tls: peer.tls.clone(),
        compression: None,
        max_message_size: config.max_message_size(),
        budget: config.memory_budget(),
        protocol: Protocol::Grpc,
    });
    // The connection's share of the process budget: one peer cannot spend it all (the native
    // engine's rule, `topspin_proto::SHARE_OF_BUDGET`).
    let budget = {
        let process = config.memory_budget();
        let share = (process.limit() / topspin_proto::SHARE_OF_BUDGET).max(1);
        topspin_proto::MemoryBudget::share_of(&process, share)
    };
    Face {
        unsent: Unsent {
            bytes: std::sync::atomic::AtomicUsize::new(0),
            max: config.max_send_buffer(),
            room: tokio::sync::Notify::new(),
        },
        registry,
        peer,
        context,
        max_message_size: config.max_message_size(),
        max_metadata_size: config.max_metadata_size() as usize,
        window: config.initial_call_window() as usize,
        frame_timeout: config.frame_timeout(),
        far: started + crate::connection::FAR,
        compression: config.compression(),
        spare: Arc::new(super::wire::Spare::new(Some(budget.clone()))),
        budget,
        unary_tx,
        _unary_rx: unary_rx,
        abort: CancellationToken::new(),
    }
}

/// How far the connection is in going away.
#[derive(Default)]
struct Going {
    /// GOAWAY sent (age, idle or shutdown).
    away: bool,
    /// The server's shutdown seen.
    shutting: bool,
    /// The grace ended: the calls left were cancelled.
    aborted: bool,
}

impl Going {
    /// A connection timer lapsed; `true`: close the connection now.
    fn on_lapse<IO>(
        &mut self,
        lapse: Option<Lapse>,
        conn: &mut h2::server::Connection<IO, Frame>,
        peer: &Peer,
        config: &Config,
    ) -> bool
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        match lapse {
            Some(Lapse::Close(why)) => {
                tracing::debug!(peer = %peer.addr, "gRPC connection closed: {why}");
                true
            }
            Some(Lapse::Idle) => {
                tracing::debug!(peer = %peer.addr, "gRPC connection idle for {:?}: going away", config.idle_timeout());
                self.away = true;
                conn.graceful_shutdown();
                false
            }
            None => false,
        }
    }

    /// The server shuts down: GOAWAY (unless the age sent it); calls in flight get the
    /// shutdown's grace, or what is left of the age's if that ends first.
    fn on_shutdown<IO>(
        &mut self,
        shutdown: &Shutdown,
        grace: Pin<&mut tokio::time::Sleep>,
        conn: &mut h2::server::Connection<IO, Frame>,
    ) where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        self.shutting = true;
        let until = shutdown.deadline().unwrap_or_else(Instant::now);
        if !self.away || until < grace.deadline().into_std() {
            grace.reset(until.into());
        }
        if !self.away {
            self.away = true;
            conn.graceful_shutdown();
        }
    }

    /// As old as max_connection_age: GOAWAY; calls in flight get max_connection_age_grace,
    /// then are cancelled.
    fn on_aged<IO>(
        &mut self,
        config: &Config,
        grace: Pin<&mut tokio::time::Sleep>,
        conn: &mut h2::server::Connection<IO, Frame>,
    ) where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        self.away = true;
        conn.graceful_shutdown();
        let now = Instant::now();
        let until = now
            .checked_add(config.max_connection_age_grace())
            .unwrap_or(now + crate::connection::FAR);
        grace.reset(until.into());
    }
}
