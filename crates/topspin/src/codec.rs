//! Payload codecs: how messages become bytes. The framing never depends on them.

use crate::Status;
use bytes::Bytes;
#[cfg(feature = "prost")]
use bytes::{buf::UninitSlice, Buf, BufMut, BytesMut};
#[cfg(feature = "prost")]
use std::marker::PhantomData;
pub use topspin_proto::Payload;

/// Codec id of protobuf (protocol.md §5.2).
pub const CODEC_PROTOBUF: u8 = 0;
/// Codec id of raw bytes.
pub const CODEC_RAW: u8 = 1;
/// Codec id of JSON.
pub const CODEC_JSON: u8 = 2;

/// Turns outgoing messages into bytes and incoming bytes into messages for one method.
///
/// ```
/// use bytes::Bytes;
/// use topspin::codec::{Codec, RawCodec};
/// let c = RawCodec;
/// let b = c.encode(Bytes::from_static(b"hi")).unwrap();
/// assert_eq!(c.decode(b).unwrap(), Bytes::from_static(b"hi"));
/// ```
pub trait Codec: Clone + Send + Sync + 'static {
    /// What this side sends.
    type Encode: Send + 'static;
    /// What this side receives.
    type Decode: Send + 'static;
    /// The codec byte sent in CALL.
    const ID: u8;
    /// Encodes a message.
    fn encode(&self, item: Self::Encode) -> Result<Bytes, Status>;
    /// Encodes a message for sending, possibly as several segments so that large parts of it
    /// go out by reference instead of being copied into one buffer (see [`Payload`]). The
    /// runtime sends with this; the default is [`Codec::encode`] as one segment.
    /// [`ProstCodec`] overrides it: a large message's `bytes` fields (generated as
    /// [`Bytes`]) become segments of their own.
    #[inline]
    fn encode_payload(&self, item: Self::Encode) -> Result<Payload, Status> {
        self.encode(item).map(Payload::from)
    }
    /// Decodes a message; `buf` shares the receive buffer's memory.
    fn decode(&self, buf: Bytes) -> Result<Self::Decode, Status>;
}

/// Raw bytes both ways, passed through without a copy.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    const ID: u8 = CODEC_RAW;
    fn encode(&self, item: Bytes) -> Result<Bytes, Status> {
        Ok(item)
    }
    fn decode(&self, buf: Bytes) -> Result<Bytes, Status> {
        Ok(buf)
    }
}

/// Protobuf via prost: sends `E`, receives `D`. Messages whose `bytes` fields are generated as
/// [`bytes::Bytes`] decode them as slices of the receive buffer (no copy).
///
/// ```
/// use topspin::codec::{Codec, ProstCodec};
/// let c = ProstCodec::<String, String>::default();
/// let b = c.encode("hello".to_string()).unwrap();
/// assert_eq!(c.decode(b).unwrap(), "hello");
/// ```
#[cfg(feature = "prost")]
pub struct ProstCodec<E, D>(PhantomData<fn(E) -> D>);

#[cfg(feature = "prost")]
impl<E, D> Default for ProstCodec<E, D> {
    fn default() -> Self {
        ProstCodec(PhantomData)
    }
}

#[cfg(feature = "prost")]
impl<E, D> Clone for ProstCodec<E, D> {
    fn clone(&self) -> Self {
        ProstCodec(PhantomData)
    }
}

#[cfg(feature = "prost")]
impl<E, D> std::fmt::Debug for ProstCodec<E, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProstCodec")
    }
}

/// Messages up to this size are encoded into the per-thread buffer (always one contiguous
/// segment: copying at most this much costs less than a segment list).
#[cfg(feature = "prost")]
const ENCODE_POOL_MAX: usize = 64 * 1024;
/// The per-thread buffer grows by at least this much.
#[cfg(feature = "prost")]
const ENCODE_POOL_CHUNK: usize = 256 * 1024;

/// In a message larger than 64 KiB (the encode buffer pool's limit) sent with [`Codec::encode_payload`], a `bytes`
/// field of at least this size is sent from the caller's buffer by reference (a segment of its
/// own); smaller fields, and everything else, are copied into the segments between them. (A
/// field generated as `Vec<u8>` rather than `Bytes` is still copied, into a segment of its own.)
#[cfg(feature = "prost")]
pub const BY_REFERENCE_MIN: usize = 32 * 1024;

/// A message that wrote less than its `encoded_len` (prost guarantees it never does).
#[cfg(feature = "prost")]
fn short(missing: usize, len: usize) -> Status {
    Status::internal(format!(
        "protobuf encoding wrote {missing} bytes less than its encoded length {len}"
    ))
}

#[cfg(feature = "prost")]
thread_local! {
    static ENCODE_BUF: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
}

#[cfg(feature = "prost")]
impl<E, D> Codec for ProstCodec<E, D>
where
    E: prost::Message + Send + 'static,
    D: prost::Message + Default + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    const ID: u8 = CODEC_PROTOBUF;

    fn encode(&self, item: E) -> Result<Bytes, Status> {
        let len = item.encoded_len();
        if len > ENCODE_POOL_MAX {
            // Sized once: `encode` would walk the whole tree again for its `encoded_len` check
            // (nested messages are walked once more per level anyway, for their length
            // prefixes). A zeroed `Vec` of exactly `len` bytes, written through a slice (plain
            // stores), that `Bytes::from` takes over without copying.
            let mut buf = vec![0u8; len];
            let mut out: &mut [u8] = &mut buf[..];
            item.encode_raw(&mut out);
            if !out.is_empty() {
                return Err(short(out.len(), len));
            }
            return Ok(Bytes::from(buf));
        }
        encode_pooled(&item, len)
    }

    fn encode_payload(&self, item: E) -> Result<Payload, Status> {
        let len = item.encoded_len();
        if len <= ENCODE_POOL_MAX {
            return encode_pooled(&item, len).map(Payload::from);
        }
        // Room for all of it (`len` is our own message's encoded length, not a peer's number):
        // whatever goes by reference leaves its part of the allocation
        // untouched (never written, so never paged in), and nothing is ever reallocated.
        let mut buf = Segments {
            done: Vec::new(),
            cur: Vec::with_capacity(len),
            taken: 0,
            len,
        };
        item.encode_raw(&mut buf);
        if !buf.cur.is_empty() {
            buf.done.push(Bytes::from(buf.cur));
        }
        let p = Payload::from_segments(buf.done);
        debug_assert_eq!(p.len(), len);
        Ok(p)
    }

    fn decode(&self, buf: Bytes) -> Result<D, Status> {
        D::decode(buf).map_err(|e| {
            Status::invalid_argument(format!(
                "could not decode protobuf message {}: {e}",
                std::any::type_name::<D>()
            ))
        })
    }
}

/// A small message (`len`, its `encoded_len`, at most [`ENCODE_POOL_MAX`]) encoded into a
/// per-thread buffer and split off it: once the messages sent earlier are dropped, `reserve`
/// reclaims the buffer in place, so steady state allocates nothing per message.
#[cfg(feature = "prost")]
#[inline]
fn encode_pooled<E: prost::Message>(item: &E, len: usize) -> Result<Bytes, Status> {
    ENCODE_BUF.with(|b| {
        let mut buf = b.borrow_mut();
        if buf.capacity() < len {
            buf.reserve(len.max(ENCODE_POOL_CHUNK));
        }
        // Zeroed first, then written through a plain slice: prost writes varints a byte at a
        // time, and a slice's `put_u8` is a store where `BytesMut`'s checks its capacity and
        // length every time (~40 instructions per field on a small message). (`len` is
        // prost's own `encoded_len`, which its `encode_raw` writes exactly.)
        let start = buf.len();
        buf.resize(start + len, 0);
        let mut out: &mut [u8] = &mut buf[start..];
        item.encode_raw(&mut out);
        if !out.is_empty() {
            let missing = out.len();
            buf.clear();
            return Err(short(missing, len));
        }
        Ok(buf.split().freeze())
    })
}

/// A [`BufMut`] that builds a [`Payload`]: prost writes a `Bytes` field with
/// [`BufMut::put`], which takes a large one over as a segment (for a [`Bytes`] source,
/// `copy_to_bytes` is a reference count, not a copy); everything else is copied into `cur`.
/// `cur` is a `Vec` (whose writes are the cheapest `BufMut` there is: a message without large
/// fields, the usual case, costs what encoding into one `Vec` costs).
#[cfg(feature = "prost")]
struct Segments {
    done: Vec<Bytes>,
    cur: Vec<u8>,
    /// Bytes in `done`.
    taken: usize,
    /// The message's encoded length (what `cur` is sized from).
    len: usize,
}

// SAFETY: every method delegates to `Vec<u8>`'s own `BufMut` implementation, which upholds the
// trait's contract (`chunk_mut` is writable memory past the initialised part, `advance_mut`
// marks as initialised only what the caller wrote there); `put`, `put_slice` and `put_u8` go
// through its safe methods. The one `unsafe` item of this file.
#[cfg(feature = "prost")]
#[allow(unsafe_code)]
unsafe impl BufMut for Segments {
    #[inline]
    fn remaining_mut(&self) -> usize {
        self.cur.remaining_mut()
    }

    #[inline]
    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller's promise (cnt bytes of `chunk_mut` initialised) is passed on.
        unsafe { self.cur.advance_mut(cnt) }
    }

    #[inline]
    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.cur.chunk_mut()
    }

    #[inline]
    fn put_slice(&mut self, src: &[u8]) {
        self.cur.extend_from_slice(src);
    }

    #[inline]
    fn put_u8(&mut self, n: u8) {
        self.cur.push(n);
    }

    fn put<T: Buf>(&mut self, mut src: T)
    where
        Self: Sized,
    {
        let n = src.remaining();
        if n >= BY_REFERENCE_MIN {
            let written = self.taken + self.cur.len();
            if !self.cur.is_empty() {
                // What is still to come after this field gets a buffer of its exact size (our
                // own message's encoded length, not a peer's number).
                let rest = self.len.saturating_sub(written + n);
                let full = std::mem::replace(&mut self.cur, Vec::with_capacity(rest));
                self.done.push(Bytes::from(full));
            } else {
                self.cur.shrink_to(self.len.saturating_sub(written + n));
            }
            self.taken = written + n;
            self.done.push(src.copy_to_bytes(n));
        } else {
            while src.has_remaining() {
                let c = src.chunk();
                let k = c.len();
                self.cur.extend_from_slice(c);
                src.advance(k);
            }
        }
    }
}

#[cfg(all(test, feature = "prost"))]
mod tests {
    use super::*;

    /// Messages above the per-thread buffer's limit take the sized-once path: the same bytes as
    /// prost's own encoding, decoded back equal.
    #[test]
    fn large_prost_messages_encode_as_prost_does() {
        let big: String = (0..20_000).map(|i| format!("string number {i},")).collect();
        let c = ProstCodec::<String, String>::default();
        let b = c.encode(big.clone()).expect("encodes");
        assert!(b.len() > ENCODE_POOL_MAX);
        assert_eq!(&b[..], &prost::Message::encode_to_vec(&big)[..]);
        assert_eq!(c.decode(b).expect("decodes"), big);
        // And a small one through the per-thread buffer.
        let small = "abc".to_string();
        let b = c.encode(small.clone()).expect("encodes");
        assert_eq!(c.decode(b).expect("decodes"), small);
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct Blob {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(bytes = "bytes", tag = "2")]
        data: Bytes,
        #[prost(bytes = "bytes", tag = "3")]
        small: Bytes,
        #[prost(message, optional, tag = "4")]
        inner: Option<Box<Blob>>,
    }

    /// A large message's `bytes` fields are sent from the caller's buffers (segments pointing
    /// at them), the rest copied around them: the bytes are prost's own encoding, and decoding
    /// them gives `bytes` fields that are slices of the receive buffer.
    #[test]
    fn large_bytes_fields_are_segments_by_reference_and_decode_as_slices() {
        let data = Bytes::from(vec![7u8; 2 << 20]);
        let nested = Bytes::from(vec![9u8; 100 << 10]);
        let msg = Blob {
            name: "n".repeat(100),
            data: data.clone(),
            small: Bytes::from(vec![1u8; 1000]),
            inner: Some(Box::new(Blob {
                name: String::new(),
                data: nested.clone(),
                small: Bytes::new(),
                inner: None,
            })),
        };
        let c = ProstCodec::<Blob, Blob>::default();
        let p = c.encode_payload(msg.clone()).expect("encodes");
        let segs = p.segments();
        assert!(segs
            .iter()
            .any(|s| s.as_ptr() == data.as_ptr() && s.len() == data.len()));
        assert!(segs
            .iter()
            .any(|s| s.as_ptr() == nested.as_ptr() && s.len() == nested.len()));
        // name, tags and lengths, the small field: copied, around the two by-reference ones.
        assert_eq!(segs.len(), 4);
        let wire = p.to_bytes();
        assert_eq!(&wire[..], &prost::Message::encode_to_vec(&msg)[..]);
        assert_eq!(c.encode(msg.clone()).expect("encodes"), wire);
        let got = c.decode(wire.clone()).expect("decodes");
        assert_eq!(got, msg);
        let range = wire.as_ptr() as usize..wire.as_ptr() as usize + wire.len();
        assert!(
            range.contains(&(got.data.as_ptr() as usize)),
            "a slice, not a copy"
        );
        let inner = got.inner.expect("inner");
        assert!(range.contains(&(inner.data.as_ptr() as usize)));
        // Small messages stay one contiguous segment.
        let small = Blob {
            data: Bytes::from(vec![3u8; 40 << 10]),
            ..Blob::default()
        };
        let p = c.encode_payload(small.clone()).expect("encodes");
        assert!(p.as_single().is_some());
        assert_eq!(
            &p.to_bytes()[..],
            &prost::Message::encode_to_vec(&small)[..]
        );
    }
}
