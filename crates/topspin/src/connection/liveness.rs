//! The connection-level timers both sides keep: keep-alive pings, frames left incomplete,
//! writes the peer does not take, and idleness. (Call deadlines are the engine's; see `Connection::poll_timeout`.)

use super::io::Io;
use crate::Config;
use std::time::Instant;
use topspin_proto::{Connection, ProtocolError};

/// Keep-alive, frame and idle timers of one connection.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    ping_sent: Option<Instant>,
}

/// What [`Liveness::on_timer`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lapse {
    None,
    /// The connection was closed with a TIMEOUT error.
    Closed,
    /// Idle too long: a go-away was sent.
    Idle,
}

impl Liveness {
    /// Bytes arrived (or a PING answer): the peer is alive.
    pub(crate) fn alive(&mut self) {
        self.ping_sent = None;
    }

    /// Whether a keep-alive PING waits for its answer.
    #[inline]
    pub(crate) fn waiting_for_pong(&self) -> bool {
        self.ping_sent.is_some()
    }

    /// The shortest time after the last read at which a timer here can be due while no frame
    /// is half received, no write stalls and no PING waits: the keep-alive interval or the
    /// idle timeout (an hour when neither is set: nothing is due then anyway).
    #[inline]
    pub(crate) fn shortest_gap(&self, config: &Config) -> std::time::Duration {
        let far = std::time::Duration::from_secs(3600);
        let keepalive = config.keepalive_interval().unwrap_or(far);
        let idle = config.idle_timeout().unwrap_or(far);
        keepalive.min(idle)
    }

    /// The earliest of these timers, with `idle` telling whether no call is open.
    pub(crate) fn next(
        &self,
        io: &Io<impl crate::transport::Transport>,
        config: &Config,
        idle: bool,
    ) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut consider = |x: Instant| t = Some(t.map_or(x, |t| t.min(x)));
        if let Some(iv) = config.keepalive_interval() {
            match self.ping_sent {
                Some(sent) => consider(sent + config.keepalive_timeout()),
                None => consider(io.last_read + iv),
            }
        }
        if let Some(since) = io.partial_since {
            consider(since + config.frame_timeout());
        }
        if let (Some(since), Some(limit)) = (io.write_stalled_since, config.write_timeout()) {
            consider(since + limit);
        }
        if let (Some(limit), true) = (config.idle_timeout(), idle) {
            consider(io.last_read + limit);
        }
        t
    }

    /// Acts on whichever of these timers passed.
    pub(crate) fn on_timer(
        &mut self,
        now: Instant,
        io: &Io<impl crate::transport::Transport>,
        config: &Config,
        conn: &mut Connection,
        idle: bool,
    ) -> Lapse {
        let timeout = |what: String| ProtocolError::new(topspin_proto::ErrorCode::TIMEOUT, what);
        if io
            .partial_since
            .is_some_and(|since| now >= since + config.frame_timeout())
        {
            conn.close(timeout(format!(
                "a frame stayed incomplete for {:?} (frame_timeout)",
                config.frame_timeout()
            )));
            return Lapse::Closed;
        }
        if let (Some(since), Some(limit)) = (io.write_stalled_since, config.write_timeout()) {
            if now >= since + limit {
                conn.close(timeout(format!(
                    "the peer took none of our bytes for {limit:?} (write_timeout)"
                )));
                return Lapse::Closed;
            }
        }
        if let Some(iv) = config.keepalive_interval() {
            match self.ping_sent {
                Some(sent) if now >= sent + config.keepalive_timeout() => {
                    conn.close(timeout(format!(
                        "keep-alive PING unanswered for {:?}",
                        config.keepalive_timeout()
                    )));
                    return Lapse::Closed;
                }
                None if now >= io.last_read + iv => {
                    conn.ping(*b"keepaliv");
                    self.ping_sent = Some(now);
                }
                _ => {}
            }
        }
        if let (Some(limit), true) = (config.idle_timeout(), idle) {
            if now >= io.last_read + limit && !conn.is_going_away() {
                conn.go_away(topspin_proto::ErrorCode::NO_ERROR, "idle timeout");
                return Lapse::Idle;
            }
        }
        Lapse::None
    }
}
