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
