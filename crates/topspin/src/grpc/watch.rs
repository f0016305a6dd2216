//! What an HTTP/2 loop — the gRPC face's or the `grpc://` client mode's — needs to know of the
//! bytes its peer sends, read as they pass to h2 (which does not say): whether the peer's
//! SETTINGS — the first frame after the client's preface, or the server's first frame
//! (RFC 9113 §3.4) — has arrived, whether a frame is half received and since when, and when
//! bytes last came — and whether the peer takes the bytes we write. The loop holds the
//! connection to the same `Config` timers a native connection has (`handshake_timeout`,
//! `frame_timeout`, `write_timeout`, `idle_timeout`, `keepalive_*`) with them (`live.rs`).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

#[cfg(any(test, feature = "grpc"))] // the gRPC face's
/// The client connection preface's length (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`).
const PREFACE: usize = 24;
/// An HTTP/2 frame header's length.
const HEADER: usize = 9;

/// Follows the frame boundaries of a peer's byte stream (sans-IO).
#[derive(Debug)]
pub(crate) struct Tracker {
    /// Preface bytes still to come.
    preface_left: usize,
    header: [u8; HEADER],
    header_len: usize,
    /// Payload bytes of the current frame still to come.
    payload_left: usize,
    settings: bool,
    /// When the frame now incomplete started to arrive.
    pub(crate) partial_since: Option<Instant>,
    pub(crate) last_read: Instant,
    /// Since when the client has taken none of our bytes (`write_timeout`).
    pub(crate) write_stalled_since: Option<Instant>,
    /// Told when a timer starts (a frame incomplete, writes stalled): the loop re-arms.
    pub(crate) changed: Arc<Changed>,
}

/// Set when a timer starts (a frame became incomplete, writes stalled), and the connection's
/// task woken: h2 reads and writes from that task, so the loop sees it on its next turn. A
/// flag rather than a `Notify`, whose future the loop would register and drop on every turn.
#[derive(Debug, Default)]
pub(crate) struct Changed(AtomicBool);

impl Changed {
    /// Whether a timer started since the last look.
    pub(crate) fn take(&self) -> bool {
        self.0.swap(false, Ordering::AcqRel)
    }

    fn set(&self, cx: &Context<'_>) {
        self.0.store(true, Ordering::Release);
        cx.waker().wake_by_ref();
    }
}

impl Tracker {
    /// A client's bytes: the preface, then frames.
    #[cfg(any(test, feature = "grpc"))] // the gRPC face's
    pub(crate) fn new(now: Instant) -> Tracker {
        Tracker::with_preface(now, PREFACE)
    }

    /// A server's bytes: frames only (its preface is its SETTINGS frame).
    pub(crate) fn of_server(now: Instant) -> Tracker {
        Tracker::with_preface(now, 0)
    }

    fn with_preface(now: Instant, preface: usize) -> Tracker {
        Tracker {
            preface_left: preface,
            header: [0; HEADER],
            header_len: 0,
            payload_left: 0,
            settings: false,
            partial_since: None,
            last_read: now,
            write_stalled_since: None,
            changed: Arc::new(Changed::default()),
        }
    }

    /// Whether the peer's first frame (its SETTINGS) has arrived whole.
    pub(crate) fn settings_received(&self) -> bool {
        self.settings
    }

    /// `data` arrived at `now`. Whether a frame is now incomplete that was not before (its
    /// timer starts).
    pub(crate) fn feed(&mut self, mut data: &[u8], now: Instant) -> bool {
        if data.is_empty() {
            return false;
        }
        let was_partial = self.partial_since.is_some();
        self.last_read = now;
        let k = self.preface_left.min(data.len());
        self.preface_left -= k;
        data = &data[k..];
        while !data.is_empty() {
            if self.payload_left > 0 {
                let k = self.payload_left.min(data.len());
                self.payload_left -= k;
                data = &data[k..];
                if self.payload_left == 0 {
                    self.frame_done();
                }
                continue;
            }
            let k = (HEADER - self.header_len).min(data.len());
            self.header[self.header_len..self.header_len + k].copy_from_slice(&data[..k]);
            self.header_len += k;
            data = &data[k..];
            if self.header_len == HEADER {
                let h = &self.header;
                self.payload_left =
                    (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
                self.header_len = 0;
                if self.payload_left == 0 {
                    self.frame_done();
                    continue;
                }
            }
            if self.partial_since.is_none() {
                self.partial_since = Some(now);
            }
        }
        !was_partial && self.partial_since.is_some()
    }

    fn frame_done(&mut self) {
        self.settings = true;
        self.partial_since = None;
    }
}

/// The connection's I/O with a [`Tracker`] reading along.
pub(crate) struct Watched<IO> {
    io: IO,
    tracker: Arc<Mutex<Tracker>>,
    changed: Arc<Changed>,
    /// The last write (or flush) was refused for want of room.
    stalled: bool,
}

impl<IO> Watched<IO> {
    /// A server's connection: reads a client's bytes.
    #[cfg(any(test, feature = "grpc"))] // the gRPC face's
    #[cfg_attr(not(feature = "grpc"), allow(dead_code))] // the face's
    pub(crate) fn new(io: IO) -> (Watched<IO>, Arc<Mutex<Tracker>>) {
        Watched::with(io, Tracker::new(Instant::now()))
    }

    /// A client's connection: reads a server's bytes.
    pub(crate) fn of_server(io: IO) -> (Watched<IO>, Arc<Mutex<Tracker>>) {
        Watched::with(io, Tracker::of_server(Instant::now()))
    }

    fn with(io: IO, t: Tracker) -> (Watched<IO>, Arc<Mutex<Tracker>>) {
        let changed = t.changed.clone();
        let tracker = Arc::new(Mutex::new(t));
        let w = Watched {
            io,
            tracker: tracker.clone(),
            changed,
            stalled: false,
        };
        (w, tracker)
    }

    /// Starts the write-stall clock at a refused write, stops it when bytes go.
    fn note_write<T>(&mut self, cx: &Context<'_>, r: &Poll<io::Result<T>>) {
        match r {
            Poll::Pending if !self.stalled => {
                self.stalled = true;
                read(&self.tracker).write_stalled_since = Some(Instant::now());
                self.changed.set(cx);
            }
            Poll::Ready(Ok(_)) if self.stalled => {
                self.stalled = false;
                read(&self.tracker).write_stalled_since = None;
            }
            _ => {}
        }
    }
}

/// The tracker's state, whatever a panic elsewhere left it in.
pub(crate) fn read(t: &Mutex<Tracker>) -> std::sync::MutexGuard<'_, Tracker> {
    t.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let new = &buf.filled()[before..];
            if !new.is_empty() && read(&self.tracker).feed(new, Instant::now()) {
                self.changed.set(cx);
            }
        }
        r
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.note_write(cx, &r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.note_write(cx, &r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.note_write(cx, &r);
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const PRI: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame(len: usize, kind: u8) -> Vec<u8> {
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            0,
            0,
            0,
            0,
            0,
        ];
        f.resize(HEADER + len, 7);
        f
    }

    #[test]
    fn settings_and_partial_frames_are_seen_whatever_the_reads() {
        let t0 = Instant::now();
        let mut wire = PRI.to_vec();
        wire.extend(frame(18, 4)); // SETTINGS
        wire.extend(frame(0, 4)); // SETTINGS ack
        wire.extend(frame(40_000, 0)); // DATA
        for step in [1, 2, 9, 10, 33, 1000, wire.len()] {
            let mut t = Tracker::new(t0);
            for (i, chunk) in wire.chunks(step).enumerate() {
                let now = t0 + Duration::from_millis(i as u64);
                t.feed(chunk, now);
                let at = (i + 1) * step;
                assert_eq!(
                    t.settings_received(),
                    at >= PRI.len() + 27,
                    "step {step} at {at}"
                );
                let whole = at >= wire.len() || at == PRI.len() + 27 || at == PRI.len() + 36;
                let in_frame = at > PRI.len() && !whole;
                assert_eq!(t.partial_since.is_some(), in_frame, "step {step} at {at}");
                assert_eq!(t.last_read, now);
            }
        }
    }

    #[test]
    fn a_servers_first_frame_is_its_settings() {
        let mut t = Tracker::of_server(Instant::now());
        t.feed(&frame(6, 4)[..5], Instant::now());
        assert!(!t.settings_received());
        assert!(t.partial_since.is_some());
        t.feed(&frame(6, 4)[5..], Instant::now());
        assert!(t.settings_received());
        assert!(t.partial_since.is_none());
    }

    #[test]
    fn a_preface_without_settings_is_not_a_handshake() {
        let mut t = Tracker::new(Instant::now());
        t.feed(PRI, Instant::now());
        assert!(!t.settings_received());
        assert!(t.partial_since.is_none());
        t.feed(&frame(6, 4)[..5], Instant::now());
        assert!(!t.settings_received());
        assert!(t.partial_since.is_some());
    }
}
