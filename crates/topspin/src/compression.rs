//! Per-message compression (protocol.md §15): negotiated per call and direction through the
//! `topspin-encoding` / `topspin-accept-encoding` metadata; on a direction that uses an
//! encoding every message starts with a flag byte (0 as is, 1 compressed).
//!
//! Off by default. A decompressed message may never grow past the receiver's
//! `max_message_size`: the output is bounded while it is produced, so a zip bomb ends its call
//! with `RESOURCE_EXHAUSTED` before anything over the limit is allocated.

use crate::codec::{Codec, Payload};
use crate::{Metadata, Status};
use bytes::{BufMut, Bytes, BytesMut};
use std::io::{Read, Write};

/// Metadata key naming the encoding of the messages its sender sends on the call.
pub(crate) const ENCODING_KEY: &str = "topspin-encoding";
/// Metadata key listing the encodings its sender can decode, comma-separated.
pub(crate) const ACCEPT_ENCODING_KEY: &str = "topspin-accept-encoding";
/// Every encoding this implementation can decode, as sent in `topspin-accept-encoding`.
pub(crate) const ACCEPTED: &str = "zstd,gzip";

/// Flag byte of a message sent as is on a compressed direction.
const PLAIN: u8 = 0;
/// Flag byte of a compressed message.
const COMPRESSED: u8 = 1;

/// A compression algorithm for messages.
///
/// ```
/// use topspin::Encoding;
/// assert_eq!(Encoding::from_name("zstd"), Some(Encoding::Zstd));
/// assert_eq!(Encoding::Gzip.name(), "gzip");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Encoding {
    /// Zstandard (RFC 8878), level 1: fast, a good ratio.
    Zstd,
    /// gzip (RFC 1952), level 6 (zlib's default): understood by every gRPC stack.
    Gzip,
}

impl Encoding {
    /// The name used on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Zstd => "zstd",
            Encoding::Gzip => "gzip",
        }
    }

    /// The encoding with this wire name, if this implementation has it.
    pub fn from_name(name: &str) -> Option<Encoding> {
        match name.trim() {
            "zstd" => Some(Encoding::Zstd),
            "gzip" => Some(Encoding::Gzip),
            _ => None,
        }
    }
}

/// How one side compresses what it sends: an encoding (if any) and the smallest message worth
/// compressing.
///
/// ```
/// use topspin::{Compression, Encoding};
/// let c = Compression::new(Encoding::Zstd).with_threshold(512);
/// assert_eq!(c.encoding(), Encoding::Zstd);
/// assert_eq!(c.threshold(), 512);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compression {
    encoding: Encoding,
    threshold: u32,
}

impl Encoding {
    /// This encoding's bit in a set of them.
    pub(crate) fn bit(self) -> u8 {
        match self {
            Encoding::Zstd => 1,
            Encoding::Gzip => 2,
        }
    }
}

impl Compression {
    /// Compress messages of at least 1 KiB with `encoding`.
    pub fn new(encoding: Encoding) -> Compression {
        Compression {
            encoding,
            threshold: 1024,
        }
    }

    /// Messages smaller than `bytes` go as they are (compressing them costs more than it saves).
    #[must_use]
    pub fn with_threshold(mut self, bytes: u32) -> Compression {
        self.threshold = bytes;
        self
    }

    /// The encoding.
    pub fn encoding(self) -> Encoding {
        self.encoding
    }

    /// The threshold.
    pub fn threshold(self) -> u32 {
        self.threshold
    }

    /// Prepares one message for a direction that uses this compression: the flag byte, then the
    /// message compressed (or as is when it is below the threshold or would not shrink).
    pub(crate) fn encode(self, message: &[u8]) -> Result<Bytes, Status> {
        Ok(match self.compress(&[message])? {
            Some(b) => b,
            None => plain(&[message]),
        })
    }

    /// [`Compression::encode`] for a message of segments: compressed from the segments as they
    /// are (the encoders stream, no contiguous copy first); sent as is, a large message keeps
    /// its segments (the flag byte is one more in front) so nothing is copied.
    pub(crate) fn encode_payload(self, message: Payload) -> Result<Payload, Status> {
        if let Some(b) = self.compress(message.segments())? {
            return Ok(Payload::from(b));
        }
        if message.len() < PLAIN_COPY_BELOW {
            return Ok(Payload::from(plain(message.segments())));
        }
        // One more than the segments our own message already has.
        let mut segs = Vec::with_capacity(message.segments().len() + 1);
        segs.push(Bytes::from_static(&[PLAIN]));
        segs.extend(message.segments().iter().cloned());
        Ok(Payload::from_segments(segs))
    }

    /// The message compressed, flag byte first, if it is at least the threshold and shrinks.
    /// The output buffer starts at half the input, our own outgoing message (its size checked
    /// by the codec's sender), and grows only as the encoder writes.
    fn compress<S: AsRef<[u8]>>(self, message: &[S]) -> Result<Option<Bytes>, Status> {
        let len: usize = message.iter().map(|s| s.as_ref().len()).sum();
        if len < self.threshold as usize {
            return Ok(None);
        }
        let failed = |e| compress_failed(self.encoding, e);
        let mut out = BytesMut::with_capacity(len / 2 + 16).writer();
        out.write_all(&[COMPRESSED]).map_err(failed)?;
        let mut out = match self.encoding {
            Encoding::Zstd => {
                let mut z = zstd::stream::write::Encoder::new(out, 1).map_err(failed)?;
                for s in message {
                    z.write_all(s.as_ref()).map_err(failed)?;
                }
                z.finish().map_err(failed)?
            }
            Encoding::Gzip => {
                let mut z = flate2::write::GzEncoder::new(out, flate2::Compression::default());
                for s in message {
                    z.write_all(s.as_ref()).map_err(failed)?;
                }
                z.finish().map_err(failed)?
            }
        };
        if out.get_ref().len() <= len {
            return Ok(Some(out.get_mut().split().freeze()));
        }
        Ok(None)
    }
}

/// Turns the compression of a call's outgoing messages off and on between messages, as
/// grpc-java's `setMessageCompression` does: what the interop suite's `*_compressed_streaming`
/// cases ask for. On by default; while off, the call's messages go with flag 0 (gRPC's
/// compressed flag 0) whatever their size. It changes nothing on a call that does not compress.
///
/// A handler gives it to its response ([`Response::with_message_compression`]) and a client to
/// its streaming request ([`Request::with_message_compression`]); each message is encoded as
/// the switch stands when it is taken from the stream, so flip it before yielding a message.
///
/// ```
/// use topspin::{Compression, Encoding, MessageCompression, Response};
/// let switch = MessageCompression::new();
/// let replies = futures_util::stream::iter([Ok::<_, topspin::Status>(vec![0u8; 4096])]);
/// let r = Response::new(replies)
///     .with_compression(Some(Compression::new(Encoding::Gzip)))
///     .with_message_compression(&switch);
/// switch.set_enabled(false); // the next messages go as they are
/// assert!(!switch.is_enabled());
/// # let _ = r;
/// ```
///
/// [`Response::with_message_compression`]: crate::Response::with_message_compression
/// [`Request::with_message_compression`]: crate::Request::with_message_compression
#[derive(Clone, Debug, Default)]
pub struct MessageCompression(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl MessageCompression {
    /// A switch, on.
    pub fn new() -> MessageCompression {
        MessageCompression::default()
    }

    /// Compresses the next messages (`true`, as negotiated for the call) or not (`false`).
    pub fn set_enabled(&self, enabled: bool) {
        self.0.store(!enabled, std::sync::atomic::Ordering::Release);
    }

    /// Whether the next message is compressed (if the call compresses at all).
    pub fn is_enabled(&self) -> bool {
        !self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Whether a message goes compressed: on unless its call has a switch that is off.
pub(crate) fn switched_on(switch: Option<&MessageCompression>) -> bool {
    switch.is_none_or(MessageCompression::is_enabled)
}

/// A codec whose compression a [`MessageCompression`] turns off and on (a client's request
/// stream that has one).
#[derive(Clone)]
pub(crate) struct Switched<C> {
    pub(crate) inner: Compressed<C>,
    pub(crate) switch: MessageCompression,
}

impl<C: Codec> Codec for Switched<C> {
    type Encode = C::Encode;
    type Decode = C::Decode;
    const ID: u8 = C::ID;

    fn encode(&self, item: C::Encode) -> Result<Bytes, Status> {
        match self.inner.send {
            Some(c) if !self.switch.is_enabled() => c
                .with_threshold(u32::MAX)
                .encode(&self.inner.inner.encode(item)?),
            _ => self.inner.encode(item),
        }
    }

    fn encode_payload(&self, item: C::Encode) -> Result<Payload, Status> {
        self.inner.encode_payload_if(item, self.switch.is_enabled())
    }

    fn decode(&self, buf: Bytes) -> Result<C::Decode, Status> {
        self.inner.decode(buf)
    }
}

/// A message sent as is on a compressed direction is copied behind its flag byte below this
/// size, and sent as a flag-byte segment and its own segments (no copy) from this size on.
const PLAIN_COPY_BELOW: usize = 4096;

fn compress_failed(e: Encoding, err: std::io::Error) -> Status {
    Status::internal(format!("{} compression failed: {err}", e.name()))
}

/// Reads one message of a direction that uses `encoding`: checks the flag byte and
/// decompresses, never producing more than `limit` bytes (the receiver's max_message_size).
pub(crate) fn decode(encoding: Encoding, mut message: Bytes, room: &Room) -> Result<Bytes, Status> {
    let Some(&flag) = message.first() else {
        return Err(Status::internal(format!(
            "empty message on a call whose messages are {}-encoded: the flag byte is missing",
            encoding.name()
        )));
    };
    let body = message.split_off(1);
    match flag {
        PLAIN => Ok(body),
        COMPRESSED => inflate(encoding, &body, room),
        other => Err(Status::internal(format!(
            "invalid compression flag {other} (expected 0 or 1) on a {}-encoded call",
            encoding.name()
        ))),
    }
}

/// Whether a message that starts with its flag byte (a direction that uses an encoding) is
/// compressed.
#[inline]
pub(crate) fn flagged_compressed(message: &[u8]) -> bool {
    message.first() == Some(&COMPRESSED)
}

pub(crate) fn inflate(encoding: Encoding, body: &[u8], room: &Room) -> Result<Bytes, Status> {
    let limit = room.max;
    let failed = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::OutOfMemory {
            return Status::resource_exhausted(format!(
                "no room in the memory budget to decompress a {} message: {e}",
                encoding.name()
            ));
        }
        Status::internal(format!(
            "could not decompress a {} message: {e}",
            encoding.name()
        ))
    };
    // Read at most limit + 1 bytes: one more than allowed tells "too large" from "exactly at
    // the limit" without ever holding more.
    let cap = (limit as u64).saturating_add(1);
    let first = (body.len() * 4).min(limit.saturating_add(1));
    let max = limit.saturating_add(1);
    let mut out = Charging::new(first, max, room.budget.as_deref()).map_err(failed)?;
    match encoding {
        Encoding::Zstd => {
            let window_log = zstd_window_log(body, limit)?;
            let mut d = zstd::stream::read::Decoder::new(body).map_err(failed)?;
            d.window_log_max(window_log).map_err(failed)?;
            std::io::copy(&mut d.take(cap), &mut out).map_err(failed)?;
        }
        Encoding::Gzip => {
            let d = flate2::read::GzDecoder::new(body);
            std::io::copy(&mut d.take(cap), &mut out).map_err(failed)?;
        }
    }
    if out.buf.len() > limit {
        return Err(Status::resource_exhausted(format!(
            "a {}-compressed message of {} bytes decompresses to more than this side's max_message_size of {limit} bytes",
            encoding.name(),
            body.len()
        )));
    }
    Ok(out.into_bytes(room.budget.clone()))
}

/// What one decompressed message may take: at most `max` bytes, every byte of its buffer
/// charged to `budget` (the receiver's `Config::memory_budget`, shared with the messages being
/// received on every face) from the moment it is allocated until the application drops the
/// last reference to the message. Decompressed size counts, not the size on the wire.
#[derive(Clone, Debug, Default)]
pub(crate) struct Room {
    pub(crate) max: usize,
    pub(crate) budget: Option<std::sync::Arc<topspin_proto::MemoryBudget>>,
}

impl Room {
    /// A room of `max` bytes, charged to `budget`.
    pub(crate) fn new(
        max: usize,
        budget: Option<std::sync::Arc<topspin_proto::MemoryBudget>>,
    ) -> Room {
        Room { max, budget }
    }
}

/// A decompression buffer that grows only by what the memory budget grants, in steps of at
/// least [`CHARGE_STEP`]; a refusal is an `OutOfMemory` write error.
struct Charging<'a> {
    buf: Vec<u8>,
    /// The most bytes the buffer may need: the message limit + 1.
    max: usize,
    budget: Option<&'a topspin_proto::MemoryBudget>,
    charged: usize,
}

/// The least a decompression buffer grows by at once.
const CHARGE_STEP: usize = 64 * 1024;

impl<'a> Charging<'a> {
    fn new(
        first: usize,
        max: usize,
        budget: Option<&'a topspin_proto::MemoryBudget>,
    ) -> std::io::Result<Charging<'a>> {
        let mut c = Charging {
            buf: Vec::new(),
            max,
            budget,
            charged: 0,
        };
        c.grow(first)?;
        Ok(c)
    }

    /// Makes room for `more` bytes beyond those held: half again as much as held (amortized
    /// copies, never past the message limit + 1) if the budget has room for that, else just
    /// what is needed.
    fn grow(&mut self, more: usize) -> std::io::Result<()> {
        let len = self.buf.len();
        let want = len.saturating_add(more);
        if want <= self.buf.capacity() {
            return Ok(());
        }
        let roomy = len
            .saturating_add(CHARGE_STEP.max(len / 2))
            .min(self.max)
            .max(want);
        let Some(b) = self.budget else {
            self.buf.reserve_exact(roomy - len);
            return Ok(());
        };
        for target in [roomy, want] {
            // `charged` is the capacity paid for so far.
            let extra = target.saturating_sub(self.charged);
            if b.try_reserve(extra) {
                self.charged += extra;
                self.buf.reserve_exact(target - len);
                return Ok(());
            }
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::OutOfMemory,
            format!("{} of {} bytes in use", b.used(), b.limit()),
        ))
    }

    /// The message, still charged to `budget` until its last reference is dropped.
    fn into_bytes(mut self, budget: Option<std::sync::Arc<topspin_proto::MemoryBudget>>) -> Bytes {
        let charged = std::mem::take(&mut self.charged);
        let buf = std::mem::take(&mut self.buf);
        match budget {
            Some(budget) if charged > 0 => charged_bytes(buf, budget, charged),
            _ => Bytes::from(buf),
        }
    }
}

impl Drop for Charging<'_> {
    fn drop(&mut self) {
        if let (Some(b), true) = (self.budget, self.charged > 0) {
            b.release(self.charged);
        }
    }
}

impl Write for Charging<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.grow(data.len())?;
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `buf` as `Bytes` that keep `charged` bytes of `budget` until the last reference (slices
/// included) is dropped: a received message the application holds stays in the memory account.
pub(crate) fn charged_bytes<T: AsRef<[u8]> + Send + 'static>(
    buf: T,
    budget: std::sync::Arc<topspin_proto::MemoryBudget>,
    charged: usize,
) -> Bytes {
    Bytes::from_owner(ChargedBytes {
        buf,
        budget,
        charged,
    })
}

/// A received message's buffer and its charge to the memory budget, given back on drop.
struct ChargedBytes<T> {
    buf: T,
    budget: std::sync::Arc<topspin_proto::MemoryBudget>,
    charged: usize,
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for ChargedBytes<T> {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_ref()
    }
}

impl<T> Drop for ChargedBytes<T> {
    fn drop(&mut self) {
        self.budget.release(self.charged);
    }
}

/// The largest zstd window a receiver allocates (protocol.md §15): 8 MiB, as Go's decoder.
pub(crate) const MAX_ZSTD_WINDOW: u64 = 8 << 20;

/// The window log the zstd decoder may use for `body`, read from its (first) frame header
/// (RFC 8878 §3.1.1.1) before anything is allocated: at most [`MAX_ZSTD_WINDOW`], or the
/// frame's content size when the frame is one segment (its window is the output itself, which
/// `limit` already bounds). A larger window, or a one-segment frame larger than `limit`, ends
/// the call `RESOURCE_EXHAUSTED`; a header too short to read is left to the decoder.
fn zstd_window_log(body: &[u8], limit: usize) -> Result<u32, Status> {
    const MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
    let max_log = MAX_ZSTD_WINDOW.trailing_zeros();
    let (Some(magic), Some(&fhd)) = (body.get(..4), body.get(4)) else {
        return Ok(max_log);
    };
    if magic != MAGIC {
        return Ok(max_log);
    }
    let too_large = |what: &str, n: u64| {
        Status::resource_exhausted(format!(
            "a zstd-compressed message declares {what} of {n} bytes; this side decodes windows of at most {MAX_ZSTD_WINDOW} bytes and messages of at most max_message_size {limit} bytes"
        ))
    };
    if fhd & 0x20 == 0 {
        // Window_Descriptor: exponent (5 bits) and mantissa (3 bits).
        let Some(&wd) = body.get(5) else {
            return Ok(max_log);
        };
        let base = 1u64 << (10 + u32::from(wd >> 3));
        let window = base + base / 8 * u64::from(wd & 7);
        if window > MAX_ZSTD_WINDOW {
            return Err(too_large("a window", window));
        }
        return Ok(max_log);
    }
    // One segment: Frame_Content_Size follows the header descriptor and the dictionary id.
    let dict_len = [0usize, 1, 2, 4][usize::from(fhd & 3)];
    let fcs_len = [1usize, 2, 4, 8][usize::from(fhd >> 6)];
    let at = 5 + dict_len;
    let Some(field) = body.get(at..at + fcs_len) else {
        return Ok(max_log);
    };
    let mut le = [0u8; 8];
    le[..fcs_len].copy_from_slice(field);
    let size = u64::from_le_bytes(le) + if fcs_len == 2 { 256 } else { 0 };
    if size > limit as u64 {
        return Err(too_large("a content size", size));
    }
    // The decoder needs a window log covering the content (at least its own minimum, 10).
    let need = 64 - size.saturating_sub(1).leading_zeros();
    Ok(need.clamp(10, 31).max(max_log))
}

/// A message sent uncompressed: the flag byte, then the message's bytes in one buffer. Sized by
/// our own outgoing message, not by a peer.
fn plain<S: AsRef<[u8]>>(segments: &[S]) -> Bytes {
    let len: usize = segments.iter().map(|s| s.as_ref().len()).sum();
    let mut out = BytesMut::with_capacity(len + 1);
    out.put_u8(PLAIN);
    for s in segments {
        out.extend_from_slice(s.as_ref());
    }
    out.freeze()
}

/// A call's codec with the call's compression around it: what it encodes is compressed with
/// `send` (flag byte first), what it decodes is read with `recv`'s flag byte and decompressed.
/// Calls without compression use their codec directly, not this.
#[derive(Clone, Debug)]
pub(crate) struct Compressed<C> {
    pub(crate) inner: C,
    pub(crate) send: Option<Compression>,
    pub(crate) recv: Option<Encoding>,
    pub(crate) room: Room,
    /// Server: the encodings the client accepts (a bit per [`Encoding`]).
    pub(crate) accepts: u8,
    /// Server: the call's face compresses the messages itself (gRPC's frames): a handler's
    /// choice goes to it as a marker in the response headers.
    pub(crate) face_compresses: bool,
}

impl<C: Codec> Codec for Compressed<C> {
    type Encode = C::Encode;
    type Decode = C::Decode;
    const ID: u8 = C::ID;

    #[inline]
    fn encode(&self, item: C::Encode) -> Result<Bytes, Status> {
        let b = self.inner.encode(item)?;
        match self.send {
            Some(c) => c.encode(&b),
            None => Ok(b),
        }
    }

    #[inline]
    fn encode_payload(&self, item: C::Encode) -> Result<Payload, Status> {
        let p = self.inner.encode_payload(item)?;
        match self.send {
            Some(c) => c.encode_payload(p),
            None => Ok(p),
        }
    }

    #[inline]
    fn decode(&self, buf: Bytes) -> Result<C::Decode, Status> {
        match self.recv {
            Some(e) => self.inner.decode(decode(e, buf, &self.room)?),
            None => self.inner.decode(buf),
        }
    }
}

impl<C: Codec> Compressed<C> {
    /// [`Codec::decode`], setting `compressed` when the message's flag byte says it arrived
    /// compressed (on a direction that uses an encoding; a face that decompresses itself
    /// hands over plain bytes and says so beside them). A call without an encoding does
    /// nothing more than `decode`: `compressed` is left alone.
    #[inline]
    pub(crate) fn decode_noting(
        &self,
        buf: Bytes,
        compressed: &mut bool,
    ) -> Result<C::Decode, Status> {
        match self.recv {
            Some(e) => {
                *compressed = flagged_compressed(&buf);
                self.inner.decode(decode(e, buf, &self.room)?)
            }
            None => self.inner.decode(buf),
        }
    }

    /// [`Codec::encode_payload`], compressed only if `on` (else with flag 0, on a direction
    /// that compresses): one message of a call whose [`MessageCompression`] is off.
    #[inline]
    pub(crate) fn encode_payload_if(&self, item: C::Encode, on: bool) -> Result<Payload, Status> {
        match self.send {
            Some(c) if !on => c
                .with_threshold(u32::MAX)
                .encode_payload(self.inner.encode_payload(item)?),
            _ => self.encode_payload(item),
        }
    }

    /// Server: the codec of a call whose request metadata is `md`: requests decoded as the
    /// client's `topspin-encoding` says, responses compressed with `ours` if the client accepts
    /// it. `Err` (UNIMPLEMENTED, with `topspin-accept-encoding` in the trailers) for a request
    /// encoding this side does not have.
    #[inline]
    pub(crate) fn for_server_call(
        inner: C,
        md: &Metadata,
        ours: Option<Compression>,
        room: impl FnOnce() -> Room,
    ) -> Result<Compressed<C>, Status> {
        if md.is_empty() && ours.is_none() {
            // The common case: no compression either way, nothing to look up.
            return Ok(Compressed::plain(inner));
        }
        Compressed::negotiate(inner, md, ours, room())
    }

    /// `inner` with no compression either way.
    #[inline]
    pub(crate) fn plain(inner: C) -> Compressed<C> {
        Compressed {
            inner,
            send: None,
            recv: None,
            room: Room::default(),
            accepts: 0,
            face_compresses: false,
        }
    }

    #[cold]
    fn negotiate(
        inner: C,
        md: &Metadata,
        ours: Option<Compression>,
        room: Room,
    ) -> Result<Compressed<C>, Status> {
        let recv = encoding_of(md).map_err(|s| {
            let trailers = Metadata::builder()
                .text(ACCEPT_ENCODING_KEY, ACCEPTED)
                .map(|b| b.build())
                .unwrap_or_default();
            s.with_metadata(trailers)
        })?;
        let send = ours.filter(|c| accepts(md, c.encoding()));
        let accepts = [Encoding::Gzip, Encoding::Zstd]
            .into_iter()
            .filter(|e| accepts(md, *e))
            .fold(0, |bits, e| bits | e.bit());
        Ok(Compressed {
            inner,
            send,
            recv,
            room,
            accepts,
            face_compresses: false,
        })
    }

    /// Server: the response as the handler chose with [`Response::with_compression`]
    /// (`choice`; `None`: as negotiated): compressed with that encoding if the client accepts
    /// it, else not at all. On a face that compresses itself, the choice goes in `headers` as
    /// a `topspin-encoding` marker (the face reads it and never sends it).
    ///
    /// [`Response::with_compression`]: crate::Response::with_compression
    #[inline]
    pub(crate) fn respond_with(
        &mut self,
        choice: Option<Option<Compression>>,
        headers: Metadata,
    ) -> Metadata {
        match choice {
            None => headers,
            Some(choice) => self.choose(choice, headers),
        }
    }

    #[cold]
    fn choose(&mut self, choice: Option<Compression>, headers: Metadata) -> Metadata {
        if self.face_compresses {
            let marker = choice.map_or_else(
                || "identity".to_owned(),
                |c| format!("{}:{}", c.encoding().name(), c.threshold()),
            );
            return with_entry(headers, ENCODING_KEY, &marker);
        }
        self.send = choice.filter(|c| self.accepts & c.encoding().bit() != 0);
        headers
    }

    /// Server: adds `topspin-encoding` to the response headers when responses are compressed.
    #[inline]
    pub(crate) fn announce(&self, headers: Metadata) -> Metadata {
        match self.send {
            None => headers,
            Some(c) => with_entry(headers, ENCODING_KEY, c.encoding().name()),
        }
    }
}

/// `md` with one more text entry (a new block: only calls that use compression pay for it).
pub(crate) fn with_entry(md: Metadata, key: &str, value: &str) -> Metadata {
    let mut b = Metadata::builder();
    for (k, v) in md.iter() {
        b = match b.entry(k, v) {
            Ok(b) => b,
            Err(_) => return md,
        };
    }
    b.text(key, value).map(|b| b.build()).unwrap_or(md)
}

/// Client: the request metadata of a call that compresses with `c`.
pub(crate) fn client_metadata(md: Metadata, c: Compression) -> Metadata {
    with_entry(
        with_entry(md, ENCODING_KEY, c.encoding().name()),
        ACCEPT_ENCODING_KEY,
        ACCEPTED,
    )
}

/// Client: a response message as its call's response headers say it is encoded.
#[inline]
pub(crate) fn response_message(
    headers: &Metadata,
    m: Bytes,
    room: impl FnOnce() -> Room,
) -> Result<Bytes, Status> {
    if headers.is_empty() {
        return Ok(m);
    }
    match encoding_of(headers)? {
        Some(e) => decode(e, m, &room()),
        None => Ok(m),
    }
}

/// The encoding a peer's metadata says its messages use: `Ok(None)` for none (or `identity`),
/// `Err` (UNIMPLEMENTED, naming what is accepted) for an encoding this side does not have.
pub(crate) fn encoding_of(metadata: &Metadata) -> Result<Option<Encoding>, Status> {
    let Some(name) = metadata.get(ENCODING_KEY) else {
        return Ok(None);
    };
    let name = std::str::from_utf8(name).unwrap_or("").trim();
    if name.is_empty() || name == "identity" {
        return Ok(None);
    }
    Encoding::from_name(name).map(Some).ok_or_else(|| {
        Status::unimplemented(format!(
            "message encoding {name:?} is not supported; this side accepts {ACCEPTED}"
        ))
    })
}

/// Whether the peer's metadata says it can decode `encoding`.
pub(crate) fn accepts(metadata: &Metadata, encoding: Encoding) -> bool {
    metadata.get(ACCEPT_ENCODING_KEY).is_some_and(|v| {
        std::str::from_utf8(v)
            .unwrap_or("")
            .split(',')
            .any(|n| n.trim() == encoding.name())
    })
}

#[cfg(test)]
mod tests;
