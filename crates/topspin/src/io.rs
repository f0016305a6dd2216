//! The byte pump between a socket and a protocol engine: one reader and one writer per
//! connection, non-blocking, so a connection task can read while its writes are pending.

use crate::transport::Stream;
use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::time::Instant;
use topspin_proto::{Connection, ProtocolError};

/// Most iovec entries per write (Linux allows 1024; a few dozen cover any realistic batch).
const MAX_IOV: usize = 64;
/// Usual read size; a larger frame gets a buffer of exactly its size.
const READ_CHUNK: usize = 64 * 1024;
/// Below this much free room, the read buffer is grown (or reclaimed) before reading.
const MIN_READ_ROOM: usize = 4 * 1024;
/// Reads per readiness before other work gets a turn.
const MAX_READS: usize = 16;

#[derive(Debug)]
pub(crate) enum ReadError {
    Io(io::Error),
    Protocol(ProtocolError),
}

#[derive(Debug)]
pub(crate) struct Io {
    pub(crate) stream: Stream,
    rbuf: BytesMut,
    wq: VecDeque<Bytes>,
    /// Set when a frame is partly received: since when.
    pub(crate) partial_since: Option<Instant>,
    /// Time of the last byte received.
    pub(crate) last_read: Instant,
}

impl Io {
    pub(crate) fn new(stream: Stream) -> Io {
        Io {
            stream,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wq: VecDeque::new(),
            partial_since: None,
            last_read: Instant::now(),
        }
    }

    /// Takes everything the engine wants to send and writes what the socket accepts now, in as
    /// few vectored writes as possible (usually one). Returns whether everything was written.
    pub(crate) fn flush(&mut self, conn: &mut Connection) -> io::Result<bool> {
        while let Some(b) = conn.poll_transmit() {
            if !b.is_empty() {
                self.wq.push_back(b);
            }
        }
        while !self.wq.is_empty() {
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let n = self.wq.len().min(MAX_IOV);
            for (slot, b) in iov.iter_mut().zip(self.wq.iter()) {
                *slot = IoSlice::new(b);
            }
            match self.stream.try_write_vectored(&iov[..n]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(mut written) => {
                    while written > 0 {
                        let Some(front) = self.wq.front_mut() else {
                            break;
                        };
                        if written >= front.len() {
                            written -= front.len();
                            self.wq.pop_front();
                        } else {
                            front.advance(written);
                            written = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.stream.write_idle();
        Ok(true)
    }

    /// Reads what the socket has and feeds it to the engine. `Ok(false)` at end of stream.
    pub(crate) fn read(&mut self, conn: &mut Connection) -> Result<bool, ReadError> {
        for _ in 0..MAX_READS {
            let need = conn.bytes_needed(&self.rbuf);
            // A large frame gets exactly the room it needs, so it lands in one buffer that is
            // then handed out by reference. Otherwise only grow when little room is left:
            // `reserve` then reclaims the buffer in place once the frames handed out earlier
            // are dropped, so steady state allocates nothing.
            let room = self.rbuf.capacity() - self.rbuf.len();
            if room < need || room < MIN_READ_ROOM {
                self.rbuf.reserve(need.max(READ_CHUNK));
            }
            let spare = self.rbuf.capacity() - self.rbuf.len();
            match self.stream.try_read_buf(&mut self.rbuf) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    let now = Instant::now();
                    self.last_read = now;
                    conn.handle_input(&mut self.rbuf, now)
                        .map_err(ReadError::Protocol)?;
                    self.partial_since = if self.rbuf.is_empty() {
                        None
                    } else {
                        self.partial_since.or(Some(now))
                    };
                    if n < spare {
                        // Drained (and its readiness cleared): the reactor says when more comes.
                        return Ok(true);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
        Ok(true)
    }

    /// Best-effort final flush (e.g. of an ERROR or the last END), then close our write side.
    pub(crate) async fn close(&mut self, conn: &mut Connection, grace: std::time::Duration) {
        let _ = tokio::time::timeout(grace, async {
            loop {
                match self.flush(conn) {
                    Ok(true) | Err(_) => break,
                    Ok(false) => {
                        if self.stream.writable().await.is_err() {
                            break;
                        }
                    }
                }
            }
        })
        .await;
        self.stream.shutdown_write();
    }
}

/// The connection-level timers both sides keep: keep-alive pings, frames left incomplete, and
/// idleness. (Call deadlines are the engine's; see `Connection::poll_timeout`.)
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

    /// The earliest of these timers, with `idle` telling whether no call is open.
    pub(crate) fn next(&self, io: &Io, config: &crate::Config, idle: bool) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut consider = |x: Instant| t = Some(t.map_or(x, |t| t.min(x)));
        if let Some(iv) = config.keepalive_interval {
            match self.ping_sent {
                Some(sent) => consider(sent + config.keepalive_timeout),
                None => consider(io.last_read + iv),
            }
        }
        if let Some(since) = io.partial_since {
            consider(since + config.frame_timeout);
        }
        if let (Some(limit), true) = (config.idle_timeout, idle) {
            consider(io.last_read + limit);
        }
        t
    }

    /// Acts on whichever of these timers passed.
    pub(crate) fn on_timer(
        &mut self,
        now: Instant,
        io: &Io,
        config: &crate::Config,
        conn: &mut Connection,
        idle: bool,
    ) -> Lapse {
        let timeout = |what: String| ProtocolError::new(topspin_proto::ErrorCode::Timeout, what);
        if io
            .partial_since
            .is_some_and(|since| now >= since + config.frame_timeout)
        {
            conn.close(timeout(format!(
                "a frame stayed incomplete for {:?} (frame_timeout)",
                config.frame_timeout
            )));
            return Lapse::Closed;
        }
        if let Some(iv) = config.keepalive_interval {
            match self.ping_sent {
                Some(sent) if now >= sent + config.keepalive_timeout => {
                    conn.close(timeout(format!(
                        "keep-alive PING unanswered for {:?}",
                        config.keepalive_timeout
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
        if let (Some(limit), true) = (config.idle_timeout, idle) {
            if now >= io.last_read + limit && !conn.is_going_away() {
                conn.go_away(topspin_proto::ErrorCode::NoError, "idle timeout");
                return Lapse::Idle;
            }
        }
        Lapse::None
    }
}
