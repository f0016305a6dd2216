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

/// A message sent as is on a compressed direction is copied behind its flag byte below this
/// size, and sent as a flag-byte segment and its own segments (no copy) from this size on.
const PLAIN_COPY_BELOW: usize = 4096;

fn compress_failed(e: Encoding, err: std::io::Error) -> Status {
    Status::internal(format!("{} compression failed: {err}", e.name()))
}

/// Reads one message of a direction that uses `encoding`: checks the flag byte and
/// decompresses, never producing more than `limit` bytes (the receiver's max_message_size).
pub(crate) fn decode(
    encoding: Encoding,
    mut message: Bytes,
    limit: usize,
) -> Result<Bytes, Status> {
    let Some(&flag) = message.first() else {
        return Err(Status::internal(format!(
            "empty message on a call whose messages are {}-encoded: the flag byte is missing",
            encoding.name()
        )));
    };
    let body = message.split_off(1);
    match flag {
        PLAIN => Ok(body),
        COMPRESSED => inflate(encoding, &body, limit),
        other => Err(Status::internal(format!(
            "invalid compression flag {other} (expected 0 or 1) on a {}-encoded call",
            encoding.name()
        ))),
    }
}

pub(crate) fn inflate(encoding: Encoding, body: &[u8], limit: usize) -> Result<Bytes, Status> {
    let failed = |e: std::io::Error| {
        Status::internal(format!(
            "could not decompress a {} message: {e}",
            encoding.name()
        ))
    };
    // Read at most limit + 1 bytes: one more than allowed tells "too large" from "exactly at
    // the limit" without ever holding more.
    let cap = (limit as u64).saturating_add(1);
    let mut out = Vec::with_capacity((body.len() * 4).min(limit.saturating_add(1)));
    match encoding {
        Encoding::Zstd => {
            let d = zstd::stream::read::Decoder::new(body).map_err(failed)?;
            d.take(cap).read_to_end(&mut out).map_err(failed)?;
        }
        Encoding::Gzip => {
            flate2::read::GzDecoder::new(body)
                .take(cap)
                .read_to_end(&mut out)
                .map_err(failed)?;
        }
    }
    if out.len() > limit {
        return Err(Status::resource_exhausted(format!(
            "a {}-compressed message of {} bytes decompresses to more than this side's max_message_size of {limit} bytes",
            encoding.name(),
            body.len()
        )));
    }
    Ok(Bytes::from(out))
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
    pub(crate) limit: usize,
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
            Some(e) => self.inner.decode(decode(e, buf, self.limit)?),
            None => self.inner.decode(buf),
        }
    }
}

impl<C: Codec> Compressed<C> {
    /// Server: the codec of a call whose request metadata is `md`: requests decoded as the
    /// client's `topspin-encoding` says, responses compressed with `ours` if the client accepts
    /// it. `Err` (UNIMPLEMENTED, with `topspin-accept-encoding` in the trailers) for a request
    /// encoding this side does not have.
    #[inline]
    pub(crate) fn for_server_call(
        inner: C,
        md: &Metadata,
        ours: Option<Compression>,
        limit: u32,
    ) -> Result<Compressed<C>, Status> {
        if md.is_empty() && ours.is_none() {
            // The common case: no compression either way, nothing to look up.
            return Ok(Compressed {
                inner,
                send: None,
                recv: None,
                limit: 0,
            });
        }
        Compressed::negotiate(inner, md, ours, limit)
    }

    #[cold]
    fn negotiate(
        inner: C,
        md: &Metadata,
        ours: Option<Compression>,
        limit: u32,
    ) -> Result<Compressed<C>, Status> {
        let recv = encoding_of(md).map_err(|s| {
            let trailers = Metadata::builder()
                .text(ACCEPT_ENCODING_KEY, ACCEPTED)
                .map(|b| b.build())
                .unwrap_or_default();
            s.with_metadata(trailers)
        })?;
        let send = ours.filter(|c| accepts(md, c.encoding()));
        Ok(Compressed {
            inner,
            send,
            recv,
            limit: limit as usize,
        })
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
    limit: usize,
) -> Result<Bytes, Status> {
    if headers.is_empty() {
        return Ok(m);
    }
    match encoding_of(headers)? {
        Some(e) => decode(e, m, limit),
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
mod tests {
    use super::*;

    fn roundtrip(e: Encoding, msg: &[u8]) {
        let c = Compression::new(e).with_threshold(16);
        let wire = c.encode(msg).unwrap();
        let back = decode(e, wire, msg.len()).unwrap();
        assert_eq!(&back[..], msg);
    }

    #[test]
    fn messages_round_trip_compressed_and_plain() {
        for e in [Encoding::Zstd, Encoding::Gzip] {
            roundtrip(e, b"");
            roundtrip(e, b"short");
            roundtrip(e, &vec![b'a'; 100_000]);
            let random: Vec<u8> = (0..5000).map(|_| fastrand::u8(..)).collect();
            roundtrip(e, &random); // does not shrink: sent as is
        }
    }

    #[test]
    fn small_and_incompressible_messages_go_as_they_are() {
        let c = Compression::new(Encoding::Zstd);
        let wire = c.encode(b"tiny").unwrap();
        assert_eq!(&wire[..], b"\x00tiny");
        let random: Vec<u8> = (0..5000).map(|_| fastrand::u8(..)).collect();
        assert_eq!(c.encode(&random).unwrap()[0], PLAIN);
        assert_eq!(c.encode(&vec![0; 5000]).unwrap()[0], COMPRESSED);
    }

    #[test]
    fn a_zip_bomb_is_refused_without_allocating_past_the_limit() {
        for e in [Encoding::Zstd, Encoding::Gzip] {
            let bomb = Compression::new(e).encode(&vec![0; 64 << 20]).unwrap();
            assert!(bomb.len() < 256 << 10, "{} bytes", bomb.len());
            let err = decode(e, bomb.clone(), 1 << 20).unwrap_err();
            assert_eq!(err.code(), crate::Code::ResourceExhausted, "{err}");
            assert!(err.message().contains("max_message_size"), "{err}");
            // Exactly at the limit is fine.
            assert_eq!(decode(e, bomb, 64 << 20).unwrap().len(), 64 << 20);
        }
    }

    #[test]
    fn bad_flags_and_garbage_are_call_errors() {
        let e = decode(Encoding::Gzip, Bytes::from_static(b"\x07abc"), 100).unwrap_err();
        assert!(e.message().contains("invalid compression flag 7"), "{e}");
        let e = decode(Encoding::Zstd, Bytes::from_static(b"\x01garbage"), 100).unwrap_err();
        assert_eq!(e.code(), crate::Code::Internal);
        let e = decode(Encoding::Zstd, Bytes::new(), 100).unwrap_err();
        assert!(e.message().contains("flag byte is missing"), "{e}");
    }

    /// testdata/vectors/compression.json (kind `compression`): what every implementation decodes
    /// alike.
    #[test]
    fn shared_vectors() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../../../testdata/vectors/compression.json"))
                .unwrap();
        let cases = doc["vectors"].as_array().unwrap();
        assert_eq!(doc["version"], 1);
        assert!(cases.len() >= 10);
        for c in cases {
            let name = c["name"].as_str().unwrap();
            let e = Encoding::from_name(c["encoding"].as_str().unwrap()).unwrap();
            let payload = Bytes::from(hex::decode(c["payload"].as_str().unwrap()).unwrap());
            let limit = c["limit"].as_u64().unwrap() as usize;
            match (decode(e, payload, limit), c.get("message")) {
                (Ok(m), Some(want)) => {
                    assert_eq!(hex::encode(m), want.as_str().unwrap(), "{name}")
                }
                (Err(s), None) => {
                    assert_eq!(
                        format!("{:?}", s.code()),
                        camel(c["code"].as_str().unwrap()),
                        "{name}: {s}"
                    )
                }
                (got, _) => panic!("{name}: got {got:?}"),
            }
        }
    }

    fn camel(code: &str) -> String {
        code.split('_')
            .map(|w| w[..1].to_owned() + &w[1..].to_lowercase())
            .collect()
    }

    #[test]
    fn negotiation_reads_the_metadata() {
        let md = Metadata::builder()
            .text(ENCODING_KEY, "zstd")
            .unwrap()
            .text(ACCEPT_ENCODING_KEY, "gzip, zstd")
            .unwrap()
            .build();
        assert_eq!(encoding_of(&md).unwrap(), Some(Encoding::Zstd));
        assert!(accepts(&md, Encoding::Gzip));
        let md = Metadata::builder()
            .text(ENCODING_KEY, "br")
            .unwrap()
            .build();
        let e = encoding_of(&md).unwrap_err();
        assert_eq!(e.code(), crate::Code::Unimplemented);
        assert!(e.message().contains("zstd,gzip"), "{e}");
        assert_eq!(encoding_of(&Metadata::default()).unwrap(), None);
        assert!(!accepts(&Metadata::default(), Encoding::Zstd));
    }
}
