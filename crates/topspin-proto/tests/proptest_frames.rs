//! Property tests of the frame codec (protocol.md §3–§5): every valid frame round-trips
//! exactly, decoding arbitrary bytes never panics, and the stream decoder does not care where
//! the byte stream is split.

use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;
use proptest::collection::vec;
use proptest::prelude::*;
use topspin_proto::frame::{
    clip, CallFrame, EndFrame, Frame, FrameDecoder, FrameType, MessageFrame, HEADER_LEN,
    MAX_METHOD_ID, MAX_METHOD_NAME_LEN,
};
use topspin_proto::{
    CallId, Code, ErrorCode, Metadata, Settings, MAX_WINDOW, MIN_MAX_FRAME_SIZE,
    MIN_MAX_METADATA_SIZE,
};

/// The receive limit used by the decoders here; generated frames stay far below it.
const MAX_FRAME: u32 = 1 << 20;

fn call_id() -> impl Strategy<Value = CallId> {
    prop_oneof![1..=16u32, 1..=u32::MAX, Just(u32::MAX)].prop_map(CallId)
}

/// Short UTF-8 text of any characters, control characters and astral planes included.
fn text(max_chars: usize) -> impl Strategy<Value = ByteString> {
    prop_oneof![
        3 => proptest::string::string_regex(&format!("(?s).{{0,{max_chars}}}")).unwrap(),
        1 => proptest::string::string_regex(&format!("[a-z ]{{0,{max_chars}}}")).unwrap(),
        1 => proptest::string::string_regex(&format!("[αβγ€😀\u{10FFFF}\0]{{0,{max_chars}}}")).unwrap(),
    ]
    .prop_map(ByteString::from)
}

/// A text for END, GOAWAY and ERROR: usually short, sometimes well past the 65,535 bytes a
/// u16 length can carry (up to ~320 KB, multi-byte characters included), which encoders clip
/// at a character boundary.
fn status_text() -> impl Strategy<Value = ByteString> {
    prop_oneof![
        9 => text(40),
        1 => ("[é😀a-z€]{1,4}", 5_000..=20_000usize)
            .prop_map(|(s, n)| ByteString::from(s.repeat(n))),
    ]
}

/// What a frame decodes to after encoding: its texts clipped as `frame::clip` does.
fn clipped(f: &Frame) -> Frame {
    let cut = |t: &ByteString| ByteString::from(clip(t, usize::MAX).to_owned());
    match f {
        Frame::End(e) => Frame::End(EndFrame {
            message: cut(&e.message),
            ..e.clone()
        }),
        Frame::GoAway {
            last_call_id,
            code,
            reason,
        } => Frame::GoAway {
            last_call_id: *last_call_id,
            code: *code,
            reason: cut(reason),
        },
        Frame::Error { code, reason } => Frame::Error {
            code: *code,
            reason: cut(reason),
        },
        other => other.clone(),
    }
}

fn key_base() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => "[0-9a-z._-]{1,16}",
        1 => "[0-9a-z._-]{200,251}",
        1 => Just("topspin-status-details".to_owned()),
    ]
}

/// A metadata entry: a text key with a UTF-8 value, or a `-bin` key with any bytes.
fn entry() -> impl Strategy<Value = (String, Vec<u8>)> {
    prop_oneof![
        (key_base(), text(24)).prop_map(|(mut k, v)| {
            if k.ends_with("-bin") {
                k.push('x');
            }
            (k, v.as_bytes().to_vec())
        }),
        (key_base(), vec(any::<u8>(), 0..40)).prop_map(|(k, v)| (format!("{k}-bin"), v)),
        // A long value, to exercise the u16 value length past 255.
        ("[a-z]{1,8}", vec(any::<u8>(), 256..1200)).prop_map(|(k, v)| (format!("{k}-bin"), v)),
    ]
}

fn metadata() -> impl Strategy<Value = Metadata> {
    prop_oneof![
        1 => Just(Metadata::new()),
        3 => vec(entry(), 1..5).prop_map(|entries| {
            entries
                .iter()
                .try_fold(Metadata::builder(), |b, (k, v)| b.entry(k, v))
                .expect("generated entries are valid")
                .build()
        }),
    ]
}

fn method_name() -> impl Strategy<Value = ByteString> {
    prop_oneof![
        4 => "/[a-z]{1,8}\\.[A-Z][a-z]{0,8}/[A-Z][a-z]{0,12}",
        2 => "\\PC{1,24}",
        1 => Just("x".repeat(MAX_METHOD_NAME_LEN)),
        1 => Just("é".repeat(MAX_METHOD_NAME_LEN / 2)),
    ]
    .prop_map(ByteString::from)
}

fn chunk() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        3 => vec(any::<u8>(), 0..64),
        1 => vec(any::<u8>(), 0..4096),
    ]
    .prop_map(Bytes::from)
}

fn code() -> impl Strategy<Value = Code> {
    prop::sample::select(Code::ALL.to_vec())
}

fn error_code() -> impl Strategy<Value = ErrorCode> {
    (0..=14u16).prop_map(ErrorCode::from_u16)
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        prop_oneof![Just(MIN_MAX_FRAME_SIZE), MIN_MAX_FRAME_SIZE..=MAX_WINDOW],
        0..=MAX_WINDOW,
        0..=MAX_WINDOW,
        any::<u32>(),
        MIN_MAX_METADATA_SIZE..=u32::MAX,
    )
        .prop_map(|(f, c, w, m, md)| {
            Settings::default()
                .with_max_frame_size(f)
                .with_max_concurrent_calls(c)
                .with_initial_call_window(w)
                .with_max_message_size(m)
                .with_max_metadata_size(md)
        })
}

/// Any valid frame of any type (including ignorable extensions), as a sender would build it.
fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        settings().prop_map(Frame::Settings),
        (
            call_id(),
            0..=MAX_METHOD_ID,
            proptest::option::of(method_name()),
            any::<u8>(),
            prop_oneof![Just(0u64), any::<u64>()],
            metadata(),
        )
            .prop_map(
                |(call_id, method_id, method_name, codec, timeout_us, metadata)| {
                    Frame::Call(CallFrame {
                        call_id,
                        method_id,
                        method_name,
                        codec,
                        timeout_us,
                        metadata,
                    })
                }
            ),
        (
            call_id(),
            any::<bool>(),
            proptest::option::of(any::<u32>()),
            chunk()
        )
            .prop_map(|(call_id, end_stream, total_len, chunk)| Frame::Message(
                MessageFrame {
                    call_id,
                    end_stream,
                    total_len,
                    chunk,
                }
            )),
        (call_id(), chunk()).prop_map(|(call_id, chunk)| Frame::Continuation { call_id, chunk }),
        (call_id(), metadata())
            .prop_map(|(call_id, metadata)| Frame::Headers { call_id, metadata }),
        call_id().prop_map(|call_id| Frame::HalfClose { call_id }),
        (call_id(), code(), status_text(), metadata()).prop_map(
            |(call_id, code, message, trailers)| {
                Frame::End(EndFrame {
                    call_id,
                    code,
                    message,
                    trailers,
                })
            }
        ),
        (call_id(), code()).prop_map(|(call_id, code)| Frame::Cancel { call_id, code }),
        (
            call_id(),
            prop_oneof![Just(1), Just(MAX_WINDOW), 1..=MAX_WINDOW]
        )
            .prop_map(|(call_id, increment)| Frame::Credit { call_id, increment }),
        (any::<bool>(), any::<[u8; 8]>()).prop_map(|(ack, data)| Frame::Ping { ack, data }),
        (any::<u32>(), error_code(), status_text()).prop_map(|(last, code, reason)| {
            Frame::GoAway {
                last_call_id: CallId(last),
                code,
                reason,
            }
        }),
        (error_code(), status_text()).prop_map(|(code, reason)| Frame::Error { code, reason }),
        (0x80..=0xFFu8, any::<u8>(), any::<u32>(), chunk()).prop_map(
            |(ty, flags, call_id, payload)| Frame::Extension {
                ty,
                flags,
                call_id: CallId(call_id),
                payload,
            }
        ),
    ]
}

fn encode_all(frames: &[Frame]) -> Vec<u8> {
    let mut wire = BytesMut::new();
    for f in frames {
        f.encode(&mut wire);
    }
    wire.to_vec()
}

/// Decodes every complete frame at the front of `buf`, checking each one re-encodes and
/// decodes to itself. Returns how decoding stopped: `Ok` when more bytes are needed.
fn decode_available(
    dec: &mut FrameDecoder,
    buf: &mut BytesMut,
    out: &mut Vec<Frame>,
) -> Result<(), topspin_proto::ProtocolError> {
    loop {
        let before = buf.len();
        match dec.decode(buf)? {
            Some(f) => {
                assert!(
                    buf.len() < before,
                    "decoder returned a frame without consuming bytes"
                );
                out.push(f);
            }
            None => {
                assert_eq!(
                    buf.len(),
                    before,
                    "decoder consumed bytes without returning a frame"
                );
                assert!(
                    dec.bytes_needed(buf)? > 0,
                    "Ok(None) although a frame is complete"
                );
                return Ok(());
            }
        }
    }
}

/// Re-encodes a decoded frame: the encoding is canonical and decodes to the same frame.
fn assert_reencodes(f: &Frame) {
    let wire = f.to_bytes();
    assert_eq!(wire.len(), HEADER_LEN + f.payload_len());
    let mut buf = BytesMut::from(&wire[..]);
    let back = FrameDecoder::new(u32::MAX)
        .decode(&mut buf)
        .expect("re-encoding of a decoded frame must decode")
        .expect("re-encoding must be complete");
    assert_eq!(&back, f);
    assert!(buf.is_empty());
    assert_eq!(back.to_bytes(), wire, "encoding is not deterministic");
}

/// A frame-shaped byte string: a header whose length matches the payload, with any type,
/// flags, reserved bytes and call id, so decoding gets past the length check.
fn framed_garbage() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![0x00..=0x0Du8, Just(0x7F), 0x80..=0xFFu8],
        any::<u8>(),
        any::<u16>(),
        prop_oneof![Just(0u32), 1..4u32, any::<u32>()],
        vec(any::<u8>(), 0..80),
    )
        .prop_map(|(ty, flags, reserved, call_id, payload)| {
            let mut b = Vec::with_capacity(HEADER_LEN + payload.len());
            b.put_u32_le(payload.len() as u32);
            b.put_u8(ty);
            b.put_u8(flags);
            b.put_u16_le(reserved);
            b.put_u32_le(call_id);
            b.extend_from_slice(&payload);
            b
        })
}

/// A valid frame's encoding with a few bytes overwritten, inserted or removed (the length
/// field is fixed up half of the time so the damage reaches the payload parser).
fn mutated_frame() -> impl Strategy<Value = Vec<u8>> {
    (
        frame(),
        vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..4),
        any::<bool>(),
    )
        .prop_map(|(f, edits, fix_len)| {
            let mut b = f.to_bytes().to_vec();
            for (at, byte, op) in edits {
                let i = at.index(b.len() + 1);
                match op {
                    0 if i < b.len() => b[i] = byte,
                    1 => b.insert(i, byte),
                    _ if i < b.len() => {
                        b.remove(i);
                    }
                    _ => {}
                }
            }
            if fix_len && b.len() >= HEADER_LEN {
                let n = (b.len() - HEADER_LEN) as u32;
                b[..4].copy_from_slice(&n.to_le_bytes());
            }
            b
        })
}

fn bytes_input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..64),
        framed_garbage(),
        mutated_frame(),
        vec(framed_garbage(), 1..4).prop_map(|v| v.concat()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn every_valid_frame_round_trips(f in frame()) {
        let wire = f.to_bytes();
        prop_assert_eq!(wire.len(), HEADER_LEN + f.payload_len());
        prop_assert_eq!(wire[4], f.frame_type().0);
        prop_assert_eq!(&wire[6..8], &[0, 0], "reserved bytes must be zero");
        prop_assert_eq!(u32::from_le_bytes(wire[8..12].try_into().unwrap()), f.call_id().0);

        // encode_head + the returned body is the full encoding.
        let mut head = BytesMut::new();
        let body = f.encode_head(&mut head).cloned().unwrap_or_default();
        head.extend_from_slice(&body);
        prop_assert_eq!(&head[..], &wire[..]);

        let mut buf = BytesMut::from(&wire[..]);
        let back = FrameDecoder::new(MAX_FRAME).decode(&mut buf).unwrap().unwrap();
        prop_assert!(back == clipped(&f), "decoded frame differs from the encoded one");
        prop_assert!(buf.is_empty());

        // A frame is only complete with its last byte.
        let mut short = BytesMut::from(&wire[..wire.len() - 1]);
        prop_assert_eq!(FrameDecoder::new(MAX_FRAME).decode(&mut short).unwrap(), None);
        prop_assert_eq!(short.len(), wire.len() - 1);
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(input in bytes_input()) {
        let mut buf = BytesMut::from(&input[..]);
        let mut frames = Vec::new();
        let result = decode_available(&mut FrameDecoder::new(MAX_FRAME), &mut buf, &mut frames);
        for f in &frames {
            assert_reencodes(f);
            // Every type number the decoder accepts is a known type or an extension.
            prop_assert!(f.frame_type().name() != "UNKNOWN");
        }
        if let Err(e) = result {
            prop_assert!(e.code != ErrorCode::NO_ERROR, "{e}");
            prop_assert!(!e.reason.is_empty());
        }
    }

    #[test]
    fn decoder_ignores_split_points(
        frames in vec(frame(), 1..8),
        cuts in vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let wire = encode_all(&frames);
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(wire.len() + 1)).collect();
        cuts.push(wire.len());
        cuts.sort_unstable();

        let mut dec = FrameDecoder::new(MAX_FRAME);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut from = 0;
        for to in cuts {
            buf.extend_from_slice(&wire[from..to]);
            from = to;
            decode_available(&mut dec, &mut buf, &mut got).unwrap();
        }
        prop_assert!(buf.is_empty());
        let want: Vec<Frame> = frames.iter().map(clipped).collect();
        // (Compared without printing: a mismatch in a 300 KB text is unreadable anyway.)
        prop_assert!(got == want, "decoded frames differ from the encoded ones");
    }

    #[test]
    fn oversized_frames_are_refused_from_the_header(
        max in MIN_MAX_FRAME_SIZE..=MAX_WINDOW,
        excess in 1..=1000u32,
        ty in any::<u8>(),
    ) {
        let len = max.saturating_add(excess);
        prop_assume!(len > max);
        let mut b = BytesMut::new();
        b.put_u32_le(len);
        b.put_u8(ty);
        b.put_bytes(0, 7);
        let dec = FrameDecoder::new(max);
        prop_assert_eq!(dec.bytes_needed(&b).unwrap_err().code, ErrorCode::FRAME_TOO_LARGE);
        let e = FrameDecoder::new(max).decode(&mut b).unwrap_err();
        prop_assert_eq!(e.code, ErrorCode::FRAME_TOO_LARGE);
    }
}

#[test]
fn unknown_mandatory_types_are_refused() {
    for ty in (0x00..=0x7Fu8).filter(|t| !(0x01..=0x0C).contains(t)) {
        let mut b = BytesMut::new();
        b.put_u32_le(0);
        b.put_u8(ty);
        b.put_bytes(0, 3);
        b.put_u32_le(1);
        let e = FrameDecoder::new(MAX_FRAME).decode(&mut b).unwrap_err();
        assert_eq!(e.code, ErrorCode::UNKNOWN_FRAME_TYPE, "type 0x{ty:02x}");
        assert_eq!(FrameType(ty).name(), "UNKNOWN");
    }
}
