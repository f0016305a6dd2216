//! Metadata (headers and trailers): key/value pairs kept in their wire encoding, so decoding
//! copies nothing and an empty set costs nothing (protocol.md §5.1).

use crate::error::ProtocolError;
use bytes::{BufMut, Bytes, BytesMut};
use std::fmt;

const EMPTY: &[u8] = &[0, 0];

/// Why a key or value cannot be metadata.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidMetadata {
    /// Key empty, longer than 255 bytes, or with a byte outside `0-9 a-z - _ .`.
    #[error("invalid metadata key {0:?}: keys are 1..=255 bytes of 0-9 a-z - _ . (lower case)")]
    Key(String),
    /// A text value given for a `-bin` key or a binary value for a text key.
    #[error("metadata key {0:?}: binary values need a key ending in \"-bin\", text values a key that does not")]
    Kind(String),
    /// Value longer than 65535 bytes.
    #[error("metadata value for {0:?} is longer than 65535 bytes")]
    ValueTooLong(String),
    /// More than 65535 entries.
    #[error("more than 65535 metadata entries")]
    TooMany,
}

/// Whether `key` is a valid metadata key.
pub fn is_valid_key(key: &[u8]) -> bool {
    !key.is_empty()
        && key.len() <= 255
        && key
            .iter()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'z' | b'-' | b'_' | b'.'))
}

/// Whether `key` names a binary value (ends in `-bin`).
pub fn is_binary_key(key: &[u8]) -> bool {
    key.ends_with(b"-bin")
}

/// An immutable set of metadata entries, in order, with repeats allowed.
///
/// ```
/// use topspin_proto::Metadata;
/// let md = Metadata::builder()
///     .text("user-agent", "topspin/0.1").unwrap()
///     .binary("trace-bin", &[0, 1, 2]).unwrap()
///     .build();
/// assert_eq!(md.get_str("user-agent"), Some("topspin/0.1"));
/// assert_eq!(md.get("trace-bin"), Some(&[0u8, 1, 2][..]));
/// assert_eq!(md.len(), 2);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Metadata {
    /// The whole block: count (u16 LE) then entries.
    raw: Bytes,
}

impl Default for Metadata {
    fn default() -> Metadata {
        Metadata::new()
    }
}

impl Metadata {
    /// No entries; does not allocate.
    pub const fn new() -> Metadata {
        Metadata {
            raw: Bytes::from_static(EMPTY),
        }
    }

    /// A builder.
    pub fn builder() -> MetadataBuilder {
        MetadataBuilder::default()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        usize::from(u16::from_le_bytes([self.raw[0], self.raw[1]]))
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Encoded size in bytes (what `MAX_METADATA_SIZE` limits).
    pub fn encoded_len(&self) -> usize {
        self.raw.len()
    }

    /// The encoded block.
    pub fn as_bytes(&self) -> &Bytes {
        &self.raw
    }

    /// Entries as `(key, value)`; values of `-bin` keys are binary, others UTF-8.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            rest: &self.raw[2..],
        }
    }

    /// The first value for `key`.
    pub fn get(&self, key: &str) -> Option<&[u8]> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// The first value for `key`, as text (`None` for binary keys).
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// All values for `key`, in order.
    pub fn get_all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.iter().filter(move |(k, _)| *k == key).map(|(_, v)| v)
    }

    /// Writes the block.
    pub fn encode(&self, dst: &mut impl BufMut) {
        dst.put_slice(&self.raw);
    }

    /// Parses and validates a block at the start of `src`; returns it (sharing `src`'s memory)
    /// and the number of bytes it took.
    pub fn decode(src: &Bytes) -> Result<(Metadata, usize), ProtocolError> {
        if src.len() < 2 {
            return Err(ProtocolError::malformed(
                "metadata block shorter than its 2-byte count",
            ));
        }
        let count = u16::from_le_bytes([src[0], src[1]]);
        let mut pos = 2usize;
        for i in 0..count {
            let Some(h) = src.get(pos..pos + 3) else {
                return Err(ProtocolError::malformed(format!(
                    "metadata entry {i} of {count} is truncated"
                )));
            };
            let klen = usize::from(h[0]);
            let vlen = usize::from(u16::from_le_bytes([h[1], h[2]]));
            pos += 3;
            let Some(key) = src.get(pos..pos + klen) else {
                return Err(ProtocolError::malformed(format!(
                    "metadata entry {i} of {count}: key is truncated"
                )));
            };
            if !is_valid_key(key) {
                return Err(ProtocolError::malformed(format!(
                    "metadata key {:?} is invalid: keys are 1..=255 bytes of 0-9 a-z - _ .",
                    String::from_utf8_lossy(key)
                )));
            }
            let Some(value) = src.get(pos + klen..pos + klen + vlen) else {
                return Err(ProtocolError::malformed(format!(
                    "metadata entry {i} of {count}: value is truncated"
                )));
            };
            if !is_binary_key(key) && std::str::from_utf8(value).is_err() {
                return Err(ProtocolError::malformed(format!(
                    "metadata value of text key {:?} is not UTF-8 (use a key ending in -bin for binary)",
                    String::from_utf8_lossy(key)
                )));
            }
            pos += klen + vlen;
        }
        Ok((
            Metadata {
                raw: src.slice(..pos),
            },
            pos,
        ))
    }
}

impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for (k, v) in self.iter() {
            if is_binary_key(k.as_bytes()) {
                m.entry(&k, &v);
            } else {
                m.entry(&k, &String::from_utf8_lossy(v));
            }
        }
        m.finish()
    }
}

/// Iterator over a [`Metadata`]'s entries.
pub struct Iter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        // The block was validated when it was built or decoded.
        let h = self.rest.get(..3)?;
        let klen = usize::from(h[0]);
        let vlen = usize::from(u16::from_le_bytes([h[1], h[2]]));
        let key = self.rest.get(3..3 + klen)?;
        let value = self.rest.get(3 + klen..3 + klen + vlen)?;
        self.rest = &self.rest[3 + klen + vlen..];
        Some((std::str::from_utf8(key).ok()?, value))
    }
}

/// Builds a [`Metadata`], checking every key and value.
#[derive(Default)]
pub struct MetadataBuilder {
    buf: BytesMut,
    count: u16,
}

impl MetadataBuilder {
    fn push(mut self, key: &str, value: &[u8], binary: bool) -> Result<Self, InvalidMetadata> {
        if !is_valid_key(key.as_bytes()) {
            return Err(InvalidMetadata::Key(key.to_owned()));
        }
        if is_binary_key(key.as_bytes()) != binary {
            return Err(InvalidMetadata::Kind(key.to_owned()));
        }
        let vlen = u16::try_from(value.len())
            .map_err(|_| InvalidMetadata::ValueTooLong(key.to_owned()))?;
        self.count = self.count.checked_add(1).ok_or(InvalidMetadata::TooMany)?;
        if self.buf.is_empty() {
            self.buf.put_u16_le(0);
        }
        self.buf.put_u8(key.len() as u8); // is_valid_key bounds it to 255
        self.buf.put_u16_le(vlen);
        self.buf.put_slice(key.as_bytes());
        self.buf.put_slice(value);
        Ok(self)
    }

    /// Adds a text entry (`key` must not end in `-bin`).
    pub fn text(self, key: &str, value: &str) -> Result<Self, InvalidMetadata> {
        self.push(key, value.as_bytes(), false)
    }

    /// Adds a binary entry (`key` must end in `-bin`).
    pub fn binary(self, key: &str, value: &[u8]) -> Result<Self, InvalidMetadata> {
        self.push(key, value, true)
    }

    /// Adds an entry, text or binary by the key's suffix; text values must be UTF-8.
    pub fn entry(self, key: &str, value: &[u8]) -> Result<Self, InvalidMetadata> {
        let binary = is_binary_key(key.as_bytes());
        if !binary && std::str::from_utf8(value).is_err() {
            return Err(InvalidMetadata::Kind(key.to_owned()));
        }
        self.push(key, value, binary)
    }

    /// The finished metadata.
    pub fn build(mut self) -> Metadata {
        if self.count == 0 {
            return Metadata::new();
        }
        self.buf[..2].copy_from_slice(&self.count.to_le_bytes());
        Metadata {
            raw: self.buf.freeze(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_unicode_and_binary() {
        let md = Metadata::builder()
            .text("greeting", "grüße 👋")
            .unwrap()
            .binary("blob-bin", &[0xff, 0, 0x80])
            .unwrap()
            .text("greeting", "again")
            .unwrap()
            .build();
        let (d, used) = Metadata::decode(md.as_bytes()).unwrap();
        assert_eq!(used, md.encoded_len());
        assert_eq!(d, md);
        assert_eq!(d.get_str("greeting"), Some("grüße 👋"));
        assert_eq!(d.get_all("greeting").count(), 2);
        assert_eq!(d.get("blob-bin"), Some(&[0xff, 0, 0x80][..]));
        assert_eq!(d.get("missing"), None);
    }

    #[test]
    fn rejects_bad_keys_and_kinds() {
        assert!(matches!(
            Metadata::builder().text("Upper", "x"),
            Err(InvalidMetadata::Key(_))
        ));
        assert!(matches!(
            Metadata::builder().text("", "x"),
            Err(InvalidMetadata::Key(_))
        ));
        assert!(matches!(
            Metadata::builder().text("a-bin", "x"),
            Err(InvalidMetadata::Kind(_))
        ));
        assert!(matches!(
            Metadata::builder().binary("a", b"x"),
            Err(InvalidMetadata::Kind(_))
        ));
        assert!(matches!(
            Metadata::builder().entry("a", &[0xff]),
            Err(InvalidMetadata::Kind(_))
        ));
    }

    #[test]
    fn decode_rejects_malformed() {
        for bad in [
            &b"\x01"[..],
            b"\x01\x00",
            b"\x01\x00\x01\x00\x00",
            b"\x01\x00\x01\x00\x00A",
            b"\x01\x00\x01\x01\x00a\xff",
            b"\x01\x00\x00\x00\x00",
        ] {
            let e = Metadata::decode(&Bytes::copy_from_slice(bad)).unwrap_err();
            assert_eq!(e.code, crate::ErrorCode::MALFORMED_FRAME, "{bad:?}");
        }
        let (md, n) = Metadata::decode(&Bytes::from_static(b"\x00\x00rest")).unwrap();
        assert!(md.is_empty());
        assert_eq!(n, 2);
    }
}
