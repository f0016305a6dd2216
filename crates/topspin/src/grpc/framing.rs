//! gRPC's message codec, free of I/O and one for both sides (the server's gRPC face and the
//! client's gRPC mode): the 5-byte prefix, the one framer (`Frame`: a message framed for h2,
//! the face's responses and the client's requests) and the one deframer (`Deframer`: request
//! and response messages gathered, a split message's buffer charged to the memory budget, each
//! message's flow-control credit). The header side of gRPC is `wire.rs`, which re-exports
//! these names.

use crate::codec::Payload;
#[cfg(feature = "grpc")]
use crate::compression::Compression;
use crate::compression::{self, Encoding};
use crate::Status;
use bytes::{Buf, Bytes, BytesMut};

/// Bytes before each message: the compressed flag and the length (big-endian u32).
pub(crate) const PREFIX: usize = 5;

/// The 5-byte prefix of a message of `len` bytes.
pub(crate) fn prefix(compressed: bool, len: usize) -> Result<[u8; PREFIX], Status> {
    let len = u32::try_from(len).map_err(|_| {
        Status::resource_exhausted(format!(
            "a message of {len} bytes is larger than gRPC's 4 GiB message limit"
        ))
    })?;
    let l = len.to_be_bytes();
    Ok([u8::from(compressed), l[0], l[1], l[2], l[3]])
}

/// A message's prefix read (`head` holds at least its 5 bytes): whether it is compressed and
/// its length. `Err`: a flag other than 0 or 1 (INTERNAL) or a length over `limit`
/// (RESOURCE_EXHAUSTED), found before any of the message is buffered.
fn parse_prefix(head: &[u8], limit: usize) -> Result<(bool, usize), Status> {
    let (&flag, rest) = head
        .split_first()
        .ok_or_else(|| Status::internal("a gRPC message prefix is 5 bytes"))?;
    let len = match rest {
        [a, b, c, d, ..] => u32::from_be_bytes([*a, *b, *c, *d]) as usize,
        _ => return Err(Status::internal("a gRPC message prefix is 5 bytes")),
    };
    if flag > 1 {
        return Err(Status::internal(format!(
            "invalid compressed flag {flag} (gRPC allows 0 or 1)"
        )));
    }
    if len > limit {
        return Err(Status::resource_exhausted(format!(
            "a message of {len} bytes is over the max_message_size of {limit} bytes"
        )));
    }
    Ok((flag == 1, len))
}

/// A received message's bytes: decompressed with the call's `grpc-encoding` if its flag says
/// so (to at most `limit` bytes, charged to `budget` while the message lives). `Err` (INTERNAL): a compressed message without an encoding.
pub(crate) fn unframe(
    compressed: bool,
    body: Bytes,
    encoding: Option<Encoding>,
    limit: usize,
    budget: Option<&std::sync::Arc<topspin_proto::MemoryBudget>>,
) -> Result<Bytes, Status> {
    match (compressed, encoding) {
        (false, _) => Ok(body),
        (true, Some(e)) => {
            let room = compression::Room::new(limit, budget.cloned());
            compression::inflate(e, &body, &room)
        }
        (true, None) => Err(Status::internal(
            "a compressed message on a call without grpc-encoding",
        )),
    }
}

/// One outgoing gRPC message: the 5-byte prefix and the message, sent from the message's own
/// segments without a copy (h2 writes them as successive DATA; a small one it copies behind
/// its DATA header). The one framer of both sides: the face's response messages and the
/// client mode's request messages, each side's h2 buffer type.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(super) head: [u8; 5],
    /// Where the prefix left to send ends (5 but in a piece that ends inside it).
    head_end: usize,
    pos: usize,
    body: Payload,
    /// Where the rest of `body` starts: a segment and an offset in it.
    seg: usize,
    off: usize,
    /// Bytes of `body` not yet taken.
    left: usize,
}

impl Frame {
    /// The frame of `message`, compressed with `c` when given (and worth it).
    #[cfg(feature = "grpc")]
    pub(crate) fn new(message: Payload, c: Option<Compression>) -> Result<Frame, Status> {
        match c {
            Some(c) => Frame::encoded(c.encode_payload(message)?, true),
            None => Frame::encoded(message, false),
        }
    }

    /// The frame of a message as topspin's codec left it: with `flagged`, topspin's
    /// compression flag byte first (0 as is, 1 compressed: gRPC's compressed flag has the same
    /// meaning), which becomes the prefix's flag. `Err`: a flagged message without its byte
    /// (INTERNAL), or one over gRPC's 4 GiB (RESOURCE_EXHAUSTED).
    pub(crate) fn encoded(body: Payload, flagged: bool) -> Result<Frame, Status> {
        let (flag, skip) = if flagged {
            match body.segments().iter().find_map(|s| s.first()) {
                Some(&f) => (f, 1),
                None => {
                    return Err(Status::internal(
                        "a compressed call's message lacks its flag byte",
                    ))
                }
            }
        } else {
            (0, 0)
        };
        let mut f = Frame {
            head: prefix(flag == 1, body.len() - skip)?,
            head_end: PREFIX,
            pos: 0,
            left: body.len(),
            body,
            seg: 0,
            off: 0,
        };
        f.skip_body(skip);
        Ok(f)
    }

    /// A frame of no bytes (what ends a stream with no message).
    pub(crate) fn empty() -> Frame {
        Frame {
            head: [0; PREFIX],
            head_end: 0,
            pos: 0,
            body: Payload::default(),
            seg: 0,
            off: 0,
            left: 0,
        }
    }

    /// The next `n` bytes (at most what is left) as a frame of their own, sharing the
    /// message's buffers (no copy); this frame goes on after them. How a large message goes to
    /// HTTP/2 a stream's send capacity at a time.
    #[cfg_attr(not(feature = "grpc"), allow(dead_code))] // the face's
    pub(crate) fn take_piece(&mut self, n: usize) -> Frame {
        if n >= self.remaining() {
            // All of it (the usual case): moved, not shared.
            return std::mem::replace(self, Frame::empty());
        }
        let head_end = self.head_end.min(self.pos + n);
        let body = n - (head_end - self.pos);
        let piece = Frame {
            head: self.head,
            head_end,
            pos: self.pos,
            body: self.body.clone(),
            seg: self.seg,
            off: self.off,
            left: body,
        };
        self.advance(n);
        piece
    }

    /// Moves past `n` bytes of the body.
    fn skip_body(&mut self, mut n: usize) {
        let segs = self.body.segments();
        self.left -= n;
        while n > 0 {
            let k = (segs[self.seg].len() - self.off).min(n);
            n -= k;
            self.off += k;
            if self.off == segs[self.seg].len() {
                self.seg += 1;
                self.off = 0;
            }
        }
        // Past empty segments, so `chunk` is never empty while bytes are left.
        while self.left > 0 && self.off == segs[self.seg].len() {
            self.seg += 1;
            self.off = 0;
        }
    }
}

impl Buf for Frame {
    fn remaining(&self) -> usize {
        (self.head_end - self.pos) + self.left
    }

    fn chunk(&self) -> &[u8] {
        if self.pos < self.head_end {
            &self.head[self.pos..self.head_end]
        } else if self.left > 0 {
            let s = &self.body.segments()[self.seg][self.off..];
            &s[..s.len().min(self.left)]
        } else {
            &[]
        }
    }

    fn advance(&mut self, mut n: usize) {
        let h = n.min(self.head_end - self.pos);
        self.pos += h;
        n -= h;
        assert!(n <= self.left, "advance past the end of a gRPC frame");
        self.skip_body(n);
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        let mut i = 0;
        if self.pos < self.head_end {
            if let Some(d) = dst.get_mut(i) {
                *d = std::io::IoSlice::new(&self.head[self.pos..self.head_end]);
                i += 1;
            }
        }
        if self.left > 0 {
            let segs = &self.body.segments()[self.seg..];
            let mut left = self.left;
            for (k, s) in segs.iter().enumerate() {
                let s = if k == 0 { &s[self.off..] } else { &s[..] };
                let s = &s[..s.len().min(left)];
                left -= s.len();
                if s.is_empty() {
                    if left == 0 {
                        break;
                    }
                    continue;
                }
                let Some(d) = dst.get_mut(i) else { break };
                *d = std::io::IoSlice::new(s);
                i += 1;
            }
        }
        i
    }
}

/// One received message: its bytes (decompressed), the bytes it took on the wire (prefix
/// included) and its flow-control credit: the bytes of the DATA chunk that completed it that
/// are its own (those of earlier chunks were reported as an incomplete message's then).
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) message: Bytes,
    #[cfg_attr(not(feature = "grpc"), allow(dead_code))] // the face's
    pub(crate) wire_len: usize,
    pub(crate) credit: usize,
    /// Its prefix's compressed flag was set (it arrived compressed, and was decompressed):
    /// `Request::message_compressed` on the face, `Streaming::last_message_compressed` on
    /// both.
    pub(crate) compressed: bool,
}

/// A connection's buffer for messages split over DATA chunks, kept between messages and calls
/// (every [`Deframer`] of the connection shares it): the next split message reuses its
/// allocation once the application has dropped the message handed out from it, instead of a
/// fresh one whose pages the kernel must fault in anew — a 1 MiB response cost the `grpc://`
/// client about 500 page faults a call so, and took twice tonic's time. Charged to the memory
/// budget while kept (its allocation's size); let go when the budget has no room, or when the
/// message handed out from it is still held as the next one begins. (The native connection
/// keeps its large-frame buffer the same way, `connection::io`.)
#[derive(Debug)]
pub(crate) struct Spare {
    /// The kept buffer and the bytes of `budget` charged for it.
    kept: std::sync::Mutex<Option<(BytesMut, usize)>>,
    budget: Option<std::sync::Arc<topspin_proto::MemoryBudget>>,
}

impl Spare {
    /// A connection's spare buffer, charged to `budget` while kept.
    pub(crate) fn new(budget: Option<std::sync::Arc<topspin_proto::MemoryBudget>>) -> Spare {
        Spare {
            kept: std::sync::Mutex::new(None),
            budget,
        }
    }

    /// The kept buffer, if it can hold `want` bytes without allocating (its charge given back
    /// either way).
    fn take(&self, want: usize) -> Option<BytesMut> {
        let (mut buf, charged) = self.kept.lock().ok()?.take()?;
        if let Some(b) = &self.budget {
            b.release(charged);
        }
        buf.try_reclaim(want).then_some(buf)
    }

    /// Keeps `buf`, the tail of an allocation of `alloc` bytes, unless one is kept already or
    /// the budget has no room for it.
    fn put(&self, buf: BytesMut, alloc: usize) {
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        if kept.is_none() && self.budget.as_ref().is_none_or(|b| b.try_reserve(alloc)) {
            *kept = Some((buf, alloc));
        }
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        let kept = self.kept.get_mut().ok().and_then(Option::take);
        if let (Some((_, charged)), Some(b)) = (kept, &self.budget) {
            b.release(charged);
        }
    }
}

/// Cuts gRPC messages out of a stream's DATA chunks: the one decoder of both sides, the
/// server's gRPC face (request messages) and the client's gRPC mode (response messages).
///
/// A message's length is checked against the limit on its 5-byte prefix, before any of it is
/// buffered. A message inside one chunk is a slice of it (no copy); the rest is copied into a
/// buffer as it arrives, so that h2's receive buffer is never held and is reused in place
/// (holding its chunks until a large message is complete made h2 allocate afresh for every
/// 16 KiB frame). The buffer is reserved for a message whole if the memory budget
/// (`Config::memory_budget`, as for native calls) has room, else up to `reserve` bytes (the
/// stream window), then grows as bytes come, each growth charged to the budget; the charge
/// goes with the message when it is handed on (given back when it is dropped) or is given
/// back when the deframer is dropped. The buffer is bounded by the limit plus one chunk.
///
/// Credit: each message reports the bytes of the chunk that completed it that are its own
/// ([`Received::credit`]), for the caller to give back as the message's consumer takes it;
/// the rest of a chunk (its length less the credit of the messages it completed) belongs to a
/// message not yet complete, whose credit the caller releases at once (else a message larger
/// than the window would never arrive) unless [`Deframer::must_wait`] says the budget is
/// spent.
pub(crate) struct Deframer {
    /// A message split over chunks, gathered: its limit plus a chunk at most.
    pub(super) buf: BytesMut,
    fresh: Option<Bytes>,
    reserve: usize,
    budget: Option<std::sync::Arc<topspin_proto::MemoryBudget>>,
    /// Bytes of the budget held for the message being gathered.
    held: usize,
    /// The buffer grew past what the budget had room for.
    over: bool,
    /// Bytes queued (`buf` and `fresh`) that chunks before the last one brought: already
    /// reported as an incomplete message's, so not credited again.
    carried: usize,
    /// The connection's kept buffer for split messages, if it keeps one.
    spare: Option<std::sync::Arc<Spare>>,
    /// The size of the allocation `buf` gathers the current split message in.
    alloc: usize,
}

impl Drop for Deframer {
    fn drop(&mut self) {
        self.release();
    }
}

impl Deframer {
    /// A deframer that reserves a message whole if `budget` has room for it, else at most
    /// `reserve` bytes ahead of what arrived.
    pub(crate) fn new(
        reserve: usize,
        budget: Option<std::sync::Arc<topspin_proto::MemoryBudget>>,
    ) -> Deframer {
        Deframer {
            buf: BytesMut::new(),
            fresh: None,
            reserve,
            budget,
            held: 0,
            over: false,
            carried: 0,
            spare: None,
            alloc: 0,
        }
    }

    /// Gathers split messages in the connection's kept buffer ([`Spare`]) when it is free.
    pub(crate) fn with_spare(mut self, spare: std::sync::Arc<Spare>) -> Deframer {
        self.spare = Some(spare);
        self
    }

    fn release(&mut self) {
        if self.held > 0 {
            if let Some(b) = &self.budget {
                b.release(self.held);
            }
            self.held = 0;
        }
    }

    /// Adds a received chunk (call [`Deframer::next`] until `None` before the next one).
    pub(crate) fn push(&mut self, b: Bytes) {
        // What is queued now is an incomplete message's, reported as such with its chunks.
        self.carried = self.buf.len() + self.fresh.as_ref().map_or(0, Bytes::len);
        if let Some(old) = self.fresh.replace(b) {
            // Not drained: keep the order.
            self.buf.extend_from_slice(&old);
            if let Some(b) = self.fresh.take() {
                self.buf.extend_from_slice(&b);
            }
        }
    }

    /// Whether no bytes of an unfinished message are left.
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty() && self.fresh.as_ref().is_none_or(|f| f.is_empty())
    }

    /// The next whole message, if it has arrived. `Err`: over `limit` (RESOURCE_EXHAUSTED), an
    /// invalid flag or a compressed message without an encoding (INTERNAL), or one that does
    /// not decompress.
    pub(crate) fn next(
        &mut self,
        limit: usize,
        encoding: Option<Encoding>,
    ) -> Result<Option<Received>, Status> {
        if self.buf.is_empty() {
            if let Some(f) = self.fresh.as_mut() {
                if f.len() >= 5 {
                    let n = Self::length(f, limit)?;
                    if f.len() >= 5 + n {
                        // The whole message is in this chunk: a slice of it.
                        let flag = f[0];
                        f.advance(5);
                        let body = f.split_to(n);
                        if f.is_empty() {
                            self.fresh = None;
                        }
                        return self.finish(flag, body, n, limit, encoding).map(Some);
                    }
                    let whole = 5 + n;
                    if self.buf.capacity() < whole {
                        // Taken first: its charge is given back before the message's is asked.
                        if let Some(kept) = self.spare.as_ref().and_then(|s| s.take(whole)) {
                            self.buf = kept;
                        }
                    }
                    let want = if whole > self.reserve
                        && self.budget.as_ref().is_some_and(|b| b.try_reserve(whole))
                    {
                        self.held = whole;
                        whole
                    } else {
                        whole.min(self.reserve.max(5))
                    };
                    self.buf.reserve(want);
                    self.alloc = self.buf.capacity();
                }
            }
        }
        if let Some(f) = self.fresh.take() {
            self.buf.extend_from_slice(&f);
            self.charge_growth();
        }
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let n = Self::length(&self.buf, limit)?;
        if self.buf.len() < 5 + n {
            return Ok(None);
        }
        let flag = self.buf[0];
        self.buf.advance(5);
        let body = self.buf.split_to(n).freeze();
        if let (Some(spare), true) = (&self.spare, self.buf.is_empty() && self.alloc > 0) {
            // Kept for the next split message: its allocation is reused once `body` is gone.
            spare.put(
                std::mem::take(&mut self.buf),
                std::mem::take(&mut self.alloc),
            );
        }
        // The message is the handler's now, still charged until the handler drops it.
        // Complete, it is no longer the connection's incomplete data: the charge moves from
        // the connection's share to the process budget, until the handler drops it.
        let body = match (&self.budget, std::mem::take(&mut self.held)) {
            (Some(b), held) if held > 0 => {
                b.hand_to_whole(held);
                let whole = b.whole().unwrap_or(b).clone();
                crate::compression::charged_bytes(body, whole, held)
            }
            _ => body,
        };
        self.finish(flag, body, n, limit, encoding).map(Some)
    }

    /// Charges the buffer's growth past what is held to the budget, if it has room; else
    /// marks the deframer as over it (the bytes already here arrived within the stream's
    /// window and are kept, uncharged: at most a window per stream).
    fn charge_growth(&mut self) {
        let cap = self.buf.capacity();
        self.over = false;
        if let (Some(b), true) = (&self.budget, cap > self.held) {
            if b.try_reserve(cap - self.held) {
                self.held = cap;
            } else {
                self.over = true;
            }
        }
    }

    /// Whether an unfinished message is held that the memory budget has no room for: the
    /// stream's window is then not given back until there is room (as native chunk credit is
    /// withheld), so a peer cannot make the server hold more than its budget plus a window per
    /// stream. Looks for room again.
    pub(crate) fn must_wait(&mut self) -> bool {
        if self.buf.is_empty() {
            return false;
        }
        if self.over {
            self.charge_growth();
        }
        self.over
    }

    fn length(b: &[u8], limit: usize) -> Result<usize, Status> {
        parse_prefix(b, limit).map(|(_, n)| n)
    }

    /// The message of `n` bytes taken off the queue: decompressed, its credit worked out.
    fn finish(
        &mut self,
        flag: u8,
        body: Bytes,
        n: usize,
        limit: usize,
        encoding: Option<Encoding>,
    ) -> Result<Received, Status> {
        let wire_len = PREFIX + n;
        // The bytes earlier chunks brought are this message's first ones (it is the front).
        let before = self.carried.min(wire_len);
        self.carried -= before;
        // Decompressed bytes are charged to the process budget, as on the native face.
        let budget = self.budget.as_ref().map(|b| b.whole().unwrap_or(b));
        let compressed = flag == 1;
        let message = unframe(compressed, body, encoding, limit, budget)?;
        Ok(Received {
            message,
            wire_len,
            credit: wire_len - before,
            compressed,
        })
    }
}
