//! FrameDecoder over arbitrary bytes: never panics; every decoded frame re-encodes to bytes
//! that decode to the same frame; feeding the same bytes in small pieces gives the same
//! frames and the same final error.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use topspin_proto::frame::{Frame, FrameDecoder, HEADER_LEN};
use topspin_proto::{ErrorCode, MIN_MAX_FRAME_SIZE};

/// Decodes frames until more bytes are needed (`Ok`) or an error.
fn drain(
    dec: &mut FrameDecoder,
    buf: &mut BytesMut,
    out: &mut Vec<Frame>,
) -> Result<(), ErrorCode> {
    loop {
        let before = buf.len();
        match dec.decode(buf) {
            Ok(Some(f)) => {
                assert!(buf.len() < before);
                out.push(f);
            }
            Ok(None) => {
                assert_eq!(buf.len(), before);
                assert!(dec.bytes_needed(buf).map_err(|e| e.code)? > 0);
                // Never more than one frame's worth is left waiting.
                assert!(buf.len() < HEADER_LEN + dec.max_frame_size() as usize);
                return Ok(());
            }
            Err(e) => {
                assert!(!e.reason.is_empty());
                return Err(e.code);
            }
        }
    }
}

fn check_round_trip(f: &Frame) {
    let wire = f.to_bytes();
    assert_eq!(wire.len(), HEADER_LEN + f.payload_len());
    let mut buf = BytesMut::from(&wire[..]);
    let back = FrameDecoder::new(u32::MAX)
        .decode(&mut buf)
        .expect("the re-encoding of a decoded frame decodes")
        .expect("and is complete");
    assert_eq!(&back, f);
    assert!(buf.is_empty());
}

fuzz_target!(|data: &[u8]| {
    // All at once.
    let mut dec = FrameDecoder::new(MIN_MAX_FRAME_SIZE);
    let mut buf = BytesMut::from(data);
    let mut whole = Vec::new();
    let whole_end = drain(&mut dec, &mut buf, &mut whole);
    for f in &whole {
        check_round_trip(f);
    }

    // In pieces of 1, 2, 3, … 13 bytes, cycling.
    let mut dec = FrameDecoder::new(MIN_MAX_FRAME_SIZE);
    let mut buf = BytesMut::new();
    let mut pieces = Vec::new();
    let mut piece_end = Ok(());
    let mut at = 0;
    let mut n = 1;
    while at < data.len() && piece_end.is_ok() {
        let to = (at + n).min(data.len());
        buf.extend_from_slice(&data[at..to]);
        at = to;
        n = n % 13 + 1;
        piece_end = drain(&mut dec, &mut buf, &mut pieces);
    }
    assert_eq!(pieces, whole);
    assert_eq!(piece_end, whole_end);
});
