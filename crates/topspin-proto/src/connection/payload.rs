//! [`Payload`]: one outgoing message as a sequence of [`Bytes`] segments, so that large parts
//! of it (a protobuf `bytes` field, say) go out by reference instead of being copied into one
//! contiguous buffer first.

use bytes::{Bytes, BytesMut};
use std::sync::Arc;

/// One message to send, made of one or more [`Bytes`] segments sent back to back.
///
/// The wire never sees the segments: a message of several segments is framed byte for byte as
/// their concatenation would be. Segments of at least 4 KiB go to the transport by reference
/// (never copied by the engine); smaller ones are copied into the frame staging buffer.
///
/// Cloning is cheap (a reference count); a one-segment payload (`From<Bytes>`) allocates
/// nothing.
///
/// ```
/// use bytes::Bytes;
/// use topspin_proto::connection::Payload;
/// let p = Payload::from_segments(vec![Bytes::from_static(b"he"), Bytes::new(), Bytes::from_static(b"llo")]);
/// assert_eq!(p.len(), 5);
/// assert_eq!(p.segments().len(), 2); // empty segments are dropped
/// assert_eq!(p.to_bytes(), Bytes::from_static(b"hello"));
/// ```
#[derive(Clone, Debug, Default)]
pub struct Payload {
    repr: Repr,
}

#[derive(Clone, Debug)]
enum Repr {
    One(Bytes),
    /// At least two non-empty segments, and their total length.
    Many(Arc<[Bytes]>, usize),
}

impl Default for Repr {
    fn default() -> Repr {
        Repr::One(Bytes::new())
    }
}

impl Payload {
    /// A payload of these segments, in order (empty ones are dropped).
    pub fn from_segments(segments: Vec<Bytes>) -> Payload {
        let n = segments.iter().filter(|s| !s.is_empty()).count();
        if n <= 1 {
            let one = segments.into_iter().find(|s| !s.is_empty());
            return Payload {
                repr: Repr::One(one.unwrap_or_default()),
            };
        }
        let len = segments.iter().map(Bytes::len).sum();
        let segs: Arc<[Bytes]> = segments.into_iter().filter(|s| !s.is_empty()).collect();
        Payload {
            repr: Repr::Many(segs, len),
        }
    }

    /// Total length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::One(b) => b.len(),
            Repr::Many(_, len) => *len,
        }
    }

    /// Whether the payload has no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The segments, in order (one, possibly empty, for a payload made from one [`Bytes`];
    /// otherwise none is empty).
    #[inline]
    pub fn segments(&self) -> &[Bytes] {
        match &self.repr {
            Repr::One(b) => std::slice::from_ref(b),
            Repr::Many(s, _) => s,
        }
    }

    /// The one segment, when there is only one.
    #[inline]
    pub fn as_single(&self) -> Option<&Bytes> {
        match &self.repr {
            Repr::One(b) => Some(b),
            Repr::Many(..) => None,
        }
    }

    /// The payload as one contiguous buffer: free for one segment, a copy otherwise. For
    /// consumers that need contiguous input (compression, a codec's decode in tests).
    pub fn to_bytes(&self) -> Bytes {
        match &self.repr {
            Repr::One(b) => b.clone(),
            Repr::Many(segs, len) => {
                // Sized by this side's own outgoing message (its sender checked it), not by a peer.
                let mut out = BytesMut::with_capacity(*len);
                for s in segs.iter() {
                    out.extend_from_slice(s);
                }
                out.freeze()
            }
        }
    }

    /// Walks `n` bytes from `(seg, off)`, handing each piece (a slice of one segment, never
    /// empty) to `f`, and returns the position after them. `n` must not pass the end.
    pub(crate) fn walk(
        &self,
        mut seg: usize,
        mut off: usize,
        mut n: usize,
        mut f: impl FnMut(Bytes),
    ) -> (usize, usize) {
        let segs = self.segments();
        while n > 0 {
            let s = &segs[seg];
            let take = (s.len() - off).min(n);
            if off == 0 && take == s.len() {
                f(s.clone());
            } else {
                f(s.slice(off..off + take));
            }
            n -= take;
            off += take;
            if off == s.len() {
                seg += 1;
                off = 0;
            }
        }
        (seg, off)
    }
}

impl From<Bytes> for Payload {
    #[inline]
    fn from(b: Bytes) -> Payload {
        Payload { repr: Repr::One(b) }
    }
}

impl From<Vec<Bytes>> for Payload {
    fn from(segments: Vec<Bytes>) -> Payload {
        Payload::from_segments(segments)
    }
}

impl PartialEq for Payload {
    /// Equal when the bytes are (however they are split into segments).
    fn eq(&self, other: &Payload) -> bool {
        self.len() == other.len() && self.to_bytes() == other.to_bytes()
    }
}

impl Eq for Payload {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload is no bigger than the `Bytes` it replaced in the runtime's queues.
    #[test]
    fn as_small_as_bytes() {
        assert_eq!(std::mem::size_of::<Payload>(), std::mem::size_of::<Bytes>());
    }

    #[test]
    fn segments_and_walk() {
        let p = Payload::from_segments(vec![
            Bytes::from_static(b"abc"),
            Bytes::new(),
            Bytes::from_static(b"defg"),
        ]);
        assert_eq!(p.len(), 7);
        assert_eq!(p.segments().len(), 2);
        assert!(p.as_single().is_none());
        let mut got = Vec::new();
        let pos = p.walk(0, 1, 4, |b| got.push(b));
        assert_eq!(got, [Bytes::from_static(b"bc"), Bytes::from_static(b"de")]);
        assert_eq!(pos, (1, 2));
        let pos = p.walk(pos.0, pos.1, 2, |b| got.push(b));
        assert_eq!(pos, (2, 0));
        assert_eq!(p.to_bytes(), Bytes::from_static(b"abcdefg"));
        // One non-empty segment collapses to the allocation-free form.
        let one = Payload::from_segments(vec![Bytes::new(), Bytes::from_static(b"x")]);
        assert_eq!(one.as_single(), Some(&Bytes::from_static(b"x")));
        assert!(Payload::from_segments(Vec::new()).is_empty());
        assert_eq!(one, Payload::from(Bytes::from_static(b"x")));
    }
}
