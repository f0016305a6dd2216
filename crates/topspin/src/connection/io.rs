//! The byte pump between a transport and a protocol engine: a reused read buffer and a write
//! queue drained with vectored writes, so a connection task can read while its writes wait.

use crate::transport::Transport;
use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;
use topspin_proto::{Connection, MemoryBudget, ProtocolError};

/// Most iovec entries per write (Linux allows 1024). Small frames arrive coalesced, so a
/// handful covers a turn; more go in the next write of the same flush.
const MAX_IOV: usize = 16;
/// Usual read size; a larger frame gets a buffer of exactly its size.
const READ_CHUNK: usize = 64 * 1024;
/// Below this much free room, the read buffer is grown (or reclaimed) before reading.
const MIN_READ_ROOM: usize = 4 * 1024;
/// Reads per wake-up before other work gets a turn.
const MAX_READS: usize = 16;
/// Reads in a row without a large frame after which the kept large buffer is let go.
const SPARE_READS: u32 = 256;
/// Input a closing connection reads and drops at most while it waits for the peer to close
/// its side ([`Io::close`]); a peer that sends more gets the reset.
const LINGER_BYTES: usize = 4 * 1024 * 1024;

#[cfg(test)]
thread_local! {
    /// Times a large frame's buffer was reallocated while the frame came in (on this thread).
    pub(crate) static LARGE_BUFFER_MOVED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

#[derive(Debug)]
pub(crate) enum ReadError {
    Io(io::Error),
    Protocol(ProtocolError),
}

#[derive(Debug)]
pub(crate) struct Io<T> {
    pub(crate) transport: T,
    rbuf: BytesMut,
    wq: VecDeque<Bytes>,
    /// Bytes in `wq`.
    queued: usize,
    /// Set when a frame is partly received: since when.
    pub(crate) partial_since: Option<Instant>,
    /// Time of the last byte received.
    pub(crate) last_read: Instant,
    /// Set while the transport takes none of our bytes: since when (`write_timeout`).
    pub(crate) write_stalled_since: Option<Instant>,
    /// Charged for a frame larger than a read: its whole size is reserved only while the
    /// budget has room; otherwise the buffer grows as the bytes arrive (a header's length is a
    /// claim, not a fact).
    budget: Arc<MemoryBudget>,
    /// Bytes of `budget` held for the frame being received.
    charged: usize,
    /// While a large frame is received into a buffer of its own: the usual read buffer, to go
    /// back to once it is taken.
    small: Option<BytesMut>,
    /// The buffer the last large frame came in (its tail: the frame was handed out from its
    /// front), kept so that the next large frame reuses the allocation once the application
    /// has dropped that frame — instead of a fresh one whose pages the kernel must fault in
    /// on every message (a 2 MB echo over a Unix socket paid about a third of its time so).
    /// Charged to the memory budget (`spare_charged`: its allocation's size) while kept; let
    /// go when the budget has no room, or after `SPARE_READS` reads with no large frame.
    spare: Option<BytesMut>,
    spare_charged: usize,
    /// Size of the allocation the current large frame is received into.
    large_cap: usize,
    reads_since_large: u32,
    /// The transport's own flush is unfinished (a TLS or buffered stream holds bytes it took
    /// but could not pass on yet): it is flushed again even when the queue is empty.
    flushing: bool,
}

impl<T: Transport> Io<T> {
    pub(crate) fn new(transport: T, budget: Arc<MemoryBudget>) -> Io<T> {
        Io {
            budget,
            charged: 0,
            small: None,
            spare: None,
            spare_charged: 0,
            large_cap: 0,
            reads_since_large: 0,
            flushing: false,
            transport,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wq: VecDeque::new(),
            queued: 0,
            partial_since: None,
            last_read: Instant::now(),
            write_stalled_since: None,
        }
    }

    /// Bytes produced by the engine and not yet taken by the transport.
    pub(crate) fn unsent(&self, conn: &Connection) -> usize {
        self.queued + conn.transmit_len()
    }

    /// What this side holds for its peer: [`Io::unsent`] and the rest of split messages
    /// waiting for the peer's credit (which no flush can move).
    pub(crate) fn held(&self, conn: &Connection) -> usize {
        self.unsent(conn) + conn.pending_send_len()
    }

    /// Takes everything the engine wants to send and writes what the transport accepts now, in
    /// as few vectored writes as possible (usually one). `Ready(Ok(()))` once all is written;
    /// `Pending` (waker registered) while the transport is full.
    pub(crate) fn poll_flush(
        &mut self,
        cx: &mut Context<'_>,
        conn: &mut Connection,
    ) -> Poll<io::Result<()>> {
        if conn.transmit_len() == 0 && self.wq.is_empty() && !self.flushing {
            return Poll::Ready(Ok(())); // the common idle turn: nothing to write
        }
        let mut wrote = false;
        if self.wq.is_empty() {
            // The common busy turn: small frames only, written straight from the engine's
            // buffer (no chunk split off, queued and dropped).
            while let Some(staged) = conn.transmit_contiguous() {
                wrote = true;
                let r = self
                    .transport
                    .poll_write_vectored(cx, &[IoSlice::new(staged)]);
                let n = ready!(self.progress(taken(r)))?;
                conn.transmit_consumed(n);
            }
        }
        while let Some(b) = conn.poll_transmit() {
            if !b.is_empty() {
                self.queued += b.len();
                self.wq.push_back(b);
            }
        }
        if self.wq.is_empty() && !self.flushing && !wrote {
            return Poll::Ready(Ok(()));
        }
        while !self.wq.is_empty() {
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let n = self.wq.len().min(MAX_IOV);
            for (slot, b) in iov.iter_mut().zip(self.wq.iter()) {
                *slot = IoSlice::new(b);
            }
            let r = self.transport.poll_write_vectored(cx, &iov[..n]);
            let n = ready!(self.progress(taken(r)))?;
            self.consume(n);
        }
        let r = self.transport.poll_flush(cx);
        self.flushing = r.is_pending();
        if self.flushing {
            self.write_stalled_since.get_or_insert_with(Instant::now);
        }
        r
    }

    /// Notes whether a write moved bytes: a `Pending` starts the stall clock (once), bytes
    /// taken stop it.
    fn progress(&mut self, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match r {
            Poll::Pending => {
                self.write_stalled_since.get_or_insert_with(Instant::now);
            }
            Poll::Ready(Ok(_)) => self.write_stalled_since = None,
            Poll::Ready(Err(_)) => {}
        }
        r
    }

    /// Drops `written` bytes from the front of the write queue.
    fn consume(&mut self, mut written: usize) {
        self.queued -= written.min(self.queued);
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

    /// Reads what the transport has and feeds it to the engine: `Ready(Ok(true))` after input
    /// was handled, `Ready(Ok(false))` at the end of the stream, `Pending` (waker registered)
    /// when nothing is there.
    pub(crate) fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        conn: &mut Connection,
    ) -> Poll<Result<bool, ReadError>> {
        // The common case on a busy loop: nothing to read, and the check is one poll.
        match self.transport.poll_readable(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(ReadError::Io(e))),
            Poll::Ready(Ok(())) => {}
        }
        for i in 0..MAX_READS {
            // Only a partly received frame can need more room than usual.
            let need = if self.rbuf.is_empty() {
                0
            } else {
                conn.bytes_needed(&self.rbuf)
            };
            // A large frame gets exactly the room it needs (while the memory budget allows), so
            // it lands in one buffer that is then handed out by reference. Otherwise only grow
            // when little room is left: `reserve` then reclaims the buffer in place once the
            // frames handed out earlier are dropped, so steady state allocates nothing.
            let room = self.rbuf.capacity() - self.rbuf.len();
            // A large frame's own buffer is sized to it: the rest of the frame is read into
            // what is left, however little (a usual read's room would reallocate it, copying
            // the frame, and lose the allocation the next large frame reuses).
            let rest_fits = self.small.is_some() && need > 0 && room >= need;
            if (room < need || room < MIN_READ_ROOM) && !rest_fits {
                let grow = self.room_for(need);
                if grow > READ_CHUNK && self.small.is_none() {
                    self.switch_to_large_buffer(grow);
                } else {
                    #[cfg(test)]
                    let before = self.rbuf.as_ptr();
                    self.rbuf.reserve(grow.max(READ_CHUNK));
                    #[cfg(test)]
                    if self.small.is_some() && self.rbuf.as_ptr() != before {
                        LARGE_BUFFER_MOVED.with(|n| n.set(n.get() + 1));
                    }
                }
            }
            let spare = self.rbuf.capacity() - self.rbuf.len();
            match self.transport.poll_read(cx, &mut self.rbuf) {
                Poll::Pending if i == 0 => return Poll::Pending,
                Poll::Pending => return Poll::Ready(Ok(true)),
                Poll::Ready(Ok(0)) => return Poll::Ready(Ok(false)),
                Poll::Ready(Ok(n)) => {
                    let now = Instant::now();
                    self.last_read = now;
                    let handled = conn.handle_input(&mut self.rbuf, now);
                    if self.charged > 0 {
                        self.release_if_taken(conn);
                    }
                    self.after_input(conn);
                    if let Err(e) = handled {
                        return Poll::Ready(Err(ReadError::Protocol(e)));
                    }
                    self.partial_since = if self.rbuf.is_empty() {
                        None
                    } else {
                        self.partial_since.or(Some(now))
                    };
                    if n < spare {
                        // Drained (a socket's readiness is cleared with it): wait for more.
                        return Poll::Ready(Ok(true));
                    }
                    if conn.has_events() {
                        // Let the role act on what came in (and the send-buffer bound apply)
                        // before taking in more: a turn takes in at most one read of calls.
                        return Poll::Ready(Ok(true));
                    }
                }
                Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(ReadError::Io(e))),
            }
        }
        Poll::Ready(Ok(true))
    }

    /// How much room to add to the read buffer for a frame that needs `need` more bytes: all
    /// of it for a usual frame, or for a large one whose size the memory budget can hold;
    /// otherwise at most as much as the buffer already holds (so a peer that announces a huge
    /// frame and sends little makes us hold at most about twice what it sent).
    fn room_for(&mut self, need: usize) -> usize {
        if need <= READ_CHUNK {
            return need;
        }
        let frame = self.rbuf.len() + need;
        if self.charged >= frame {
            return need;
        }
        if self.budget.try_reserve(frame - self.charged) {
            self.charged = frame;
            return need;
        }
        need.min(self.rbuf.len().max(READ_CHUNK))
    }

    /// A large frame begins (`grow` more bytes wanted): it is received into a buffer of its
    /// own — the kept one when the application has let go of the frame that last came in it,
    /// else a fresh one — and the usual buffer waits for it to be taken.
    fn switch_to_large_buffer(&mut self, grow: usize) {
        // Bounded by `room_for`: a frame's whole size (≤ MAX_FRAME_SIZE) only once it is
        // reserved in the memory budget, otherwise at most what already arrived (so about
        // twice what the peer sent).
        let want = self.rbuf.len() + grow;
        let kept = self.spare.take().and_then(|mut spare| {
            self.budget.release(std::mem::take(&mut self.spare_charged));
            // Succeeds, without allocating, when the frame handed out from it is gone.
            spare.try_reclaim(want).then_some(spare)
        });
        let mut big = kept.unwrap_or_else(|| BytesMut::with_capacity(want));
        self.large_cap = big.capacity();
        big.extend_from_slice(&self.rbuf);
        self.rbuf.clear();
        self.small = Some(std::mem::replace(&mut self.rbuf, big));
        self.reads_since_large = 0;
    }

    /// After input was handled: once a large frame was taken off its buffer, back to the
    /// usual one (the bytes after the frame, at most about a read's worth, move along), and
    /// the large one is kept for the next large frame if the budget has room. A kept buffer
    /// no large frame came for in a while is let go.
    fn after_input(&mut self, conn: &Connection) {
        if self.small.is_none() {
            if self.spare.is_some() {
                self.reads_since_large += 1;
                if self.reads_since_large >= SPARE_READS {
                    self.spare = None;
                    self.budget.release(std::mem::take(&mut self.spare_charged));
                }
            }
            return;
        }
        let pending = if self.rbuf.is_empty() {
            0
        } else {
            self.rbuf.len() + conn.bytes_needed(&self.rbuf)
        };
        if pending > READ_CHUNK {
            return; // the large frame (or another) is still coming
        }
        let Some(mut small) = self.small.take() else {
            return;
        };
        small.reserve(self.rbuf.len().max(READ_CHUNK));
        small.extend_from_slice(&self.rbuf);
        let mut big = std::mem::replace(&mut self.rbuf, small);
        big.clear();
        if self.budget.try_reserve(self.large_cap) {
            self.spare_charged = self.large_cap;
            self.spare = Some(big);
        }
    }

    /// Gives the budget back once the charged frame has been taken off the buffer.
    fn release_if_taken(&mut self, conn: &Connection) {
        let pending = if self.rbuf.is_empty() {
            0
        } else {
            self.rbuf.len() + conn.bytes_needed(&self.rbuf)
        };
        if pending < self.charged {
            self.budget.release(self.charged);
            self.charged = 0;
        }
    }

    /// Best-effort final flush (e.g. of an ERROR or the last END), then close our write side,
    /// then a lingering close: what the peer still sends is read and dropped until it closes
    /// its side too (or `grace` passes, or [`LINGER_BYTES`] were dropped). A socket closed with
    /// unread input makes the kernel reset the connection (RFC 2525 §2.17), and a reset
    /// throws away what we sent and the peer has not read yet — a server's GOAWAY and last
    /// ENDs, while its client, not yet aware of the GOAWAY, keeps sending calls.
    pub(crate) async fn close(&mut self, conn: &mut Connection, grace: std::time::Duration) {
        let _ = tokio::time::timeout(grace, async {
            let _ = std::future::poll_fn(|cx| self.poll_flush(cx, conn)).await;
        })
        .await;
        let _ = tokio::time::timeout(
            grace,
            std::future::poll_fn(|cx| self.transport.poll_shutdown(cx)),
        )
        .await;
        let mut dropped = 0;
        let _ = tokio::time::timeout(
            grace,
            std::future::poll_fn(|cx| self.poll_discard(cx, &mut dropped)),
        )
        .await;
    }

    /// Reads and drops input until the end of the stream, an error, or [`LINGER_BYTES`] in all
    /// (`dropped` counts them); `Pending` while the peer is quiet.
    fn poll_discard(&mut self, cx: &mut Context<'_>, dropped: &mut usize) -> Poll<()> {
        while *dropped < LINGER_BYTES {
            self.rbuf.clear();
            if self.rbuf.capacity() < MIN_READ_ROOM {
                self.rbuf.reserve(READ_CHUNK);
            }
            match self.transport.poll_read(cx, &mut self.rbuf) {
                Poll::Ready(Ok(0)) => return Poll::Ready(()),
                Poll::Ready(Ok(n)) => *dropped += n,
                Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(())
    }
}

impl<T> Drop for Io<T> {
    fn drop(&mut self) {
        self.budget.release(self.charged + self.spare_charged);
    }
}

/// What a write took: its byte count (0 after an interrupted write, which is simply tried
/// again), or what stops the flush (a write that took nothing is `WriteZero`).
fn taken(r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
    match r {
        Poll::Ready(Ok(0)) => Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
        Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::Interrupted => Poll::Ready(Ok(0)),
        r => r,
    }
}
