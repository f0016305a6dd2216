//! The connection-level timers every face keeps — the handshake deadline, keep-alive pings,
//! frames left incomplete, writes the peer does not take, idleness — and the connection age's
//! jitter: one sans-IO policy. The native driver (`connection::Driver`) and both HTTP/2 loops
//! (the gRPC face's, `grpc::server`, and the `grpc://` client mode's, `client::grpc`, through
//! `grpc::live`) each tell it what they saw ([`Seen`]) and act on what is due ([`Due`]): a
//! keep-alive PING after `keepalive_interval` without a byte from the peer, the connection
//! closed when nothing (its answer or anything else) comes within `keepalive_timeout` of it.
//! (Call deadlines are the engine's; see `Connection::poll_timeout`.)

use crate::Config;
use std::time::{Duration, Instant};

/// What a connection's timers look at, whatever its face.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seen {
    /// When the connection was accepted or made.
    pub(crate) started: Instant,
    /// Its handshake is done (native: the preface and SETTINGS; HTTP/2: the client's
    /// SETTINGS): the handshake timeout no longer applies.
    pub(crate) established: bool,
    /// Since when a frame has been incomplete.
    pub(crate) partial_since: Option<Instant>,
    /// Since when the peer has taken none of our bytes.
    pub(crate) write_stalled_since: Option<Instant>,
    /// When bytes last came.
    pub(crate) last_read: Instant,
    /// Since when no call has been open, while none is and the connection is not going away
    /// already: the idle timeout counts from then ([`IdleSince`]), not from the last read — a
    /// PING, its answer or any other frame that is not a call keeps no connection from going
    /// idle (protocol.md §9; grpc-go's `MaxConnectionIdle` counts the same way).
    pub(crate) idle_since: Option<Instant>,
    /// This policy sends the keep-alive PINGs (every face that can send one).
    pub(crate) pings: bool,
}

/// A timer that is due.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Due {
    /// Close the connection: this timeout passed.
    Close(String),
    /// Send a keep-alive PING now (its answer is awaited from now).
    Ping,
    /// Idle too long: go away.
    Idle,
}

/// What the native driver's timer did ([`crate::connection::Role::on_timer`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lapse {
    None,
    /// The connection was closed with a TIMEOUT error.
    Closed,
    /// Idle too long: a go-away was sent.
    Idle,
}

/// Keep-alive, handshake, frame, write and idle timers of one connection.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    ping_sent: Option<Instant>,
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

    /// When the PING that waits was sent, unless bytes came after it: they answer it as its
    /// PONG would (a loop that sees its reads only as `Seen::last_read`, as the HTTP/2 ones do,
    /// need not call [`Liveness::alive`] for each).
    fn unanswered(&self, s: &Seen) -> Option<Instant> {
        self.ping_sent.filter(|&sent| s.last_read <= sent)
    }

    /// The shortest time after the last read at which a timer here can be due while no frame
    /// is half received, no write stalls and no PING waits: the keep-alive interval or the
    /// idle timeout (an hour when neither is set: nothing is due then anyway).
    #[inline]
    pub(crate) fn shortest_gap(&self, config: &Config) -> Duration {
        let far = Duration::from_secs(3600);
        let keepalive = config.keepalive_interval().unwrap_or(far);
        let idle = config.idle_timeout().unwrap_or(far);
        keepalive.min(idle)
    }

    /// The earliest of these timers.
    pub(crate) fn next(&self, s: &Seen, config: &Config) -> Option<Instant> {
        let handshake = (!s.established).then(|| s.started + config.handshake_timeout());
        let keepalive =
            config
                .keepalive_interval()
                .filter(|_| s.pings)
                .map(|iv| match self.unanswered(s) {
                    Some(sent) => sent + config.keepalive_timeout(),
                    None => s.last_read + iv,
                });
        let frame = s.partial_since.map(|since| since + config.frame_timeout());
        let write = s
            .write_stalled_since
            .zip(config.write_timeout())
            .and_then(|(since, limit)| since.checked_add(limit));
        let idle = config
            .idle_timeout()
            .zip(s.idle_since)
            .and_then(|(limit, since)| since.checked_add(limit));
        [handshake, keepalive, frame, write, idle]
            .into_iter()
            .flatten()
            .min()
    }

    /// Which of these timers passed, if any (one at a time: the caller looks again).
    pub(crate) fn due(&mut self, now: Instant, s: &Seen, config: &Config) -> Option<Due> {
        if !s.established && now >= s.started + config.handshake_timeout() {
            return Some(Due::Close(format!(
                "no handshake within {:?} (handshake_timeout)",
                config.handshake_timeout()
            )));
        }
        if s.partial_since
            .is_some_and(|since| now >= since + config.frame_timeout())
        {
            return Some(Due::Close(format!(
                "a frame stayed incomplete for {:?} (frame_timeout)",
                config.frame_timeout()
            )));
        }
        if let (Some(since), Some(limit)) = (s.write_stalled_since, config.write_timeout()) {
            if now >= since + limit {
                return Some(Due::Close(format!(
                    "the peer took none of our bytes for {limit:?} (write_timeout)"
                )));
            }
        }
        if let Some(iv) = config.keepalive_interval().filter(|_| s.pings) {
            self.ping_sent = self.unanswered(s);
            match self.ping_sent {
                Some(sent) if now >= sent + config.keepalive_timeout() => {
                    return Some(Due::Close(format!(
                        "keep-alive PING unanswered for {:?} (keepalive_timeout)",
                        config.keepalive_timeout()
                    )));
                }
                None if now >= s.last_read + iv => {
                    self.ping_sent = Some(now);
                    return Some(Due::Ping);
                }
                _ => {}
            }
        }
        let idle = config.idle_timeout().zip(s.idle_since);
        idle.is_some_and(|(limit, since)| now >= since + limit)
            .then_some(Due::Idle)
    }
}

/// Since when a connection has had no call open ([`Seen::idle_since`]), noted by its loop: from
/// the end of its last call, or from the first look if none came. A loop that looks only now
/// and then passes the count of calls begun so far, so that a call that began and ended
/// between two looks still starts the idle time again.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IdleSince {
    since: Option<Instant>,
    begun: u64,
}

impl IdleSince {
    /// Notes what the loop sees now: `idle`, no call open (and not going away); `begun`, the
    /// calls begun so far. Reads the clock only when idleness starts.
    #[inline]
    pub(crate) fn note(&mut self, idle: bool, begun: u64) {
        if !idle {
            self.since = None;
        } else if self.since.is_none() || begun != self.begun {
            self.since = Some(Instant::now());
            self.begun = begun;
        }
    }

    /// Since when the connection has been idle, as of the last [`IdleSince::note`]; `None` while
    /// a call is open.
    #[inline]
    pub(crate) fn since(&self) -> Option<Instant> {
        self.since
    }

    /// For a look between notes (`idle`, `begun` as in [`IdleSince::note`]): the noted time if
    /// it still holds, else `fallback`, a time no later than the idleness began (a timer set
    /// from it fires early at worst, and the loop notes and looks again then).
    #[inline]
    pub(crate) fn guess(&self, idle: bool, begun: u64, fallback: Instant) -> Option<Instant> {
        idle.then(|| {
            self.since
                .filter(|_| begun == self.begun)
                .unwrap_or(fallback)
        })
    }
}

/// `Config::max_connection_age`, jittered by ±10% so that connections made together do not
/// all go away together — on every face.
pub(crate) fn jittered_age(config: &Config) -> Option<Duration> {
    config
        .max_connection_age()
        .map(|age| age.mul_f64(0.9 + 0.2 * fastrand::f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(now: Instant) -> Seen {
        Seen {
            started: now,
            established: true,
            partial_since: None,
            write_stalled_since: None,
            last_read: now,
            idle_since: None,
            pings: true,
        }
    }

    #[test]
    fn a_handshake_not_done_in_time_closes() {
        let t0 = Instant::now();
        let config = Config::default();
        let mut l = Liveness::default();
        let s = Seen {
            established: false,
            ..seen(t0)
        };
        assert_eq!(l.next(&s, &config), Some(t0 + config.handshake_timeout()));
        assert_eq!(l.due(t0, &s, &config), None);
        let late = t0 + config.handshake_timeout();
        assert!(
            matches!(l.due(late, &s, &config), Some(Due::Close(why)) if why.contains("handshake_timeout"))
        );
    }

    #[test]
    fn keep_alive_pings_after_silence_then_closes_unanswered() {
        let t0 = Instant::now();
        let config = Config::default()
            .with_keepalive_interval(Some(Duration::from_secs(10)))
            .with_keepalive_timeout(Duration::from_secs(2));
        let mut l = Liveness::default();
        let s = seen(t0);
        assert_eq!(l.next(&s, &config), Some(t0 + Duration::from_secs(10)));
        assert_eq!(
            l.due(t0 + Duration::from_secs(10), &s, &config),
            Some(Due::Ping)
        );
        assert_eq!(l.next(&s, &config), Some(t0 + Duration::from_secs(12)));
        let unanswered = l.due(t0 + Duration::from_secs(12), &s, &config);
        assert!(matches!(unanswered, Some(Due::Close(why)) if why.contains("keepalive_timeout")));
        // A loop that sends no PINGs is asked for none.
        let mut l = Liveness::default();
        let quiet = Seen { pings: false, ..s };
        assert_eq!(l.due(t0 + Duration::from_secs(10), &quiet, &config), None);
    }

    #[test]
    fn bytes_after_the_ping_answer_it_and_the_next_waits_for_silence_again() {
        let t0 = Instant::now();
        let config = Config::default()
            .with_keepalive_interval(Some(Duration::from_secs(10)))
            .with_keepalive_timeout(Duration::from_secs(2));
        let mut l = Liveness::default();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(l.due(at(10), &seen(t0), &config), Some(Due::Ping));
        assert!(l.waiting_for_pong());
        // Bytes came a second after the PING (no PONG seen): the peer is alive.
        let heard = Seen {
            last_read: at(11),
            ..seen(t0)
        };
        assert_eq!(l.next(&heard, &config), Some(at(21)));
        assert_eq!(l.due(at(12), &heard, &config), None);
        assert!(!l.waiting_for_pong());
        assert_eq!(l.due(at(21), &heard, &config), Some(Due::Ping));
        // Bytes read at the very instant of the PING came before it: no answer.
        let mut l = Liveness::default();
        assert_eq!(l.due(at(10), &seen(t0), &config), Some(Due::Ping));
        let same = Seen {
            last_read: at(10),
            ..seen(t0)
        };
        assert!(matches!(l.due(at(12), &same, &config), Some(Due::Close(_))));
        // A PONG (`alive`) answers it too.
        let mut l = Liveness::default();
        assert_eq!(l.due(at(10), &seen(t0), &config), Some(Due::Ping));
        l.alive();
        assert_eq!(l.due(at(12), &seen(t0), &config), Some(Due::Ping));
    }

    #[test]
    fn frame_write_and_idle_timers() {
        let t0 = Instant::now();
        let config = Config::default()
            .with_idle_timeout(Some(Duration::from_secs(60)))
            .with_write_timeout(Some(Duration::from_secs(5)));
        let mut l = Liveness::default();
        let partial = Seen {
            partial_since: Some(t0),
            ..seen(t0)
        };
        let late = t0 + config.frame_timeout();
        assert!(
            matches!(l.due(late, &partial, &config), Some(Due::Close(why)) if why.contains("frame_timeout"))
        );
        let stalled = Seen {
            write_stalled_since: Some(t0),
            ..seen(t0)
        };
        assert_eq!(l.next(&stalled, &config), Some(t0 + Duration::from_secs(5)));
        assert!(
            matches!(l.due(t0 + Duration::from_secs(5), &stalled, &config), Some(Due::Close(why)) if why.contains("write_timeout"))
        );
        let busy = seen(t0);
        assert_eq!(l.due(t0 + Duration::from_secs(60), &busy, &config), None);
        let idle = Seen {
            idle_since: Some(t0),
            ..busy
        };
        assert_eq!(
            l.due(t0 + Duration::from_secs(60), &idle, &config),
            Some(Due::Idle)
        );
    }

    #[test]
    fn pings_and_other_frames_keep_no_connection_from_going_idle() {
        // Regression: the idle time counted from the last read, so a peer sending a PING (or
        // answering ours) now and then held its connection, and a max_connections slot, for ever.
        let t0 = Instant::now();
        let config = Config::default()
            .with_idle_timeout(Some(Duration::from_secs(60)))
            .with_keepalive_interval(Some(Duration::from_secs(10)));
        let mut l = Liveness::default();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let chatty = Seen {
            last_read: at(55),
            idle_since: Some(t0),
            ..seen(t0)
        };
        assert_eq!(l.next(&chatty, &config), Some(at(60)));
        assert_eq!(l.due(at(60), &chatty, &config), Some(Due::Idle));
    }

    #[test]
    fn idle_time_starts_again_after_every_call_even_one_between_two_looks() {
        let mut idle = IdleSince::default();
        idle.note(true, 0);
        let first = idle.since().expect("idle");
        idle.note(true, 0);
        assert_eq!(
            idle.since(),
            Some(first),
            "no call since: the same idleness"
        );
        idle.note(false, 1);
        assert_eq!(idle.since(), None, "a call is open");
        idle.note(true, 1);
        let second = idle.since().expect("idle again");
        assert!(second >= first);
        // A call began and ended between two looks: idleness starts again.
        let fallback = Instant::now();
        assert_eq!(idle.guess(true, 2, fallback), Some(fallback));
        assert_eq!(idle.guess(true, 1, fallback), Some(second));
        assert_eq!(idle.guess(false, 1, fallback), None);
        idle.note(true, 2);
        assert!(idle.since().expect("idle") >= second);
    }
}
