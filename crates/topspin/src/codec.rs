//! Payload codecs: how messages become bytes. The framing never depends on them.

use crate::Status;
use bytes::Bytes;
#[cfg(feature = "prost")]
use bytes::BytesMut;
#[cfg(feature = "prost")]
use std::marker::PhantomData;

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

/// Messages up to this size are encoded into the per-thread buffer.
#[cfg(feature = "prost")]
const ENCODE_POOL_MAX: usize = 64 * 1024;
/// The per-thread buffer grows by at least this much.
#[cfg(feature = "prost")]
const ENCODE_POOL_CHUNK: usize = 256 * 1024;

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
        let failed =
            |e: prost::EncodeError| Status::internal(format!("protobuf encoding failed: {e}"));
        if len > ENCODE_POOL_MAX {
            // Sized once: `encode` would walk the whole tree again for its `encoded_len` check
            // (nested messages are walked once more per level anyway, for their length
            // prefixes). A `Vec` of exactly `len` bytes: its `put_slice` is a plain copy, and
            // `Bytes::from` takes it over without copying.
            let mut buf = Vec::with_capacity(len);
            item.encode_raw(&mut buf);
            debug_assert_eq!(buf.len(), len);
            return Ok(Bytes::from(buf));
        }
        // Small messages are encoded into a per-thread buffer and split off it: once the
        // messages sent earlier are dropped, `reserve` reclaims the buffer in place, so steady
        // state allocates nothing per message.
        ENCODE_BUF.with(|b| {
            let mut buf = b.borrow_mut();
            if buf.capacity() < len {
                buf.reserve(len.max(ENCODE_POOL_CHUNK));
            }
            item.encode(&mut *buf).map_err(failed)?;
            Ok(buf.split().freeze())
        })
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
}
