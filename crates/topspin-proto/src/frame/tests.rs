use super::*;

fn round_trip(f: Frame) -> Bytes {
    let wire = f.to_bytes();
    assert_eq!(wire.len(), HEADER_LEN + f.payload_len());
    let mut buf = BytesMut::from(&wire[..]);
    let mut dec = FrameDecoder::new(crate::Settings::default().max_frame_size);
    let back = dec.decode(&mut buf).unwrap().unwrap();
    assert_eq!(back, f);
    assert!(buf.is_empty());
    wire
}

fn decode_err(bytes: &[u8]) -> ProtocolError {
    let mut buf = BytesMut::from(bytes);
    FrameDecoder::new(1 << 20).decode(&mut buf).unwrap_err()
}

#[test]
fn settings() {
    round_trip(Frame::Settings(crate::Settings::default()));
}

#[test]
fn call_named_and_interned() {
    let md = Metadata::builder().text("k", "v").unwrap().build();
    let named = round_trip(Frame::Call(CallFrame {
        call_id: CallId(1),
        method_id: 1,
        method_name: Some(ByteString::from_static("/echo.Echo/Say")),
        codec: 0,
        timeout_us: 1_500_000,
        metadata: md.clone(),
    }));
    assert_eq!(named[5], FLAG_NAMED);
    let interned = round_trip(Frame::Call(CallFrame {
        call_id: CallId(3),
        method_id: 1,
        method_name: None,
        codec: 1,
        timeout_us: 0,
        metadata: Metadata::new(),
    }));
    assert_eq!(interned.len(), HEADER_LEN + CALL_FIXED_LEN + 2);
}

#[test]
fn message_whole_and_split() {
    round_trip(Frame::Message(MessageFrame {
        call_id: CallId(9),
        end_stream: true,
        total_len: None,
        chunk: Bytes::new(),
    }));
    let w = round_trip(Frame::Message(MessageFrame {
        call_id: CallId(9),
        end_stream: false,
        total_len: Some(100),
        chunk: Bytes::from_static(b"abc"),
    }));
    assert_eq!(w[5], FLAG_SPLIT);
    round_trip(Frame::Continuation {
        call_id: CallId(9),
        chunk: Bytes::from_static(b"def"),
    });
}

#[test]
fn headers_end_cancel_credit_halfclose() {
    round_trip(Frame::Headers {
        call_id: CallId(2),
        metadata: Metadata::builder()
            .binary("x-bin", &[0, 255])
            .unwrap()
            .build(),
    });
    round_trip(Frame::HalfClose { call_id: CallId(2) });
    round_trip(Frame::End(EndFrame {
        call_id: CallId(2),
        code: Code::NotFound,
        message: ByteString::from_static("no such key"),
        trailers: Metadata::new(),
    }));
    round_trip(Frame::Cancel {
        call_id: CallId(2),
        code: Code::DeadlineExceeded,
    });
    round_trip(Frame::Credit {
        call_id: CallId(2),
        increment: MAX_WINDOW_U32,
    });
}

const MAX_WINDOW_U32: u32 = crate::settings::MAX_WINDOW;

#[test]
fn connection_frames() {
    let w = round_trip(Frame::Ping {
        ack: true,
        data: *b"12345678",
    });
    assert_eq!(w[5], FLAG_ACK);
    round_trip(Frame::GoAway {
        last_call_id: CallId(41),
        code: ErrorCode::NO_ERROR,
        reason: ByteString::from_static("server shutting down"),
    });
    round_trip(Frame::Error {
        code: ErrorCode::FLOW_CONTROL,
        reason: ByteString::from_static("no credit"),
    });
    round_trip(Frame::Extension {
        ty: 0x80,
        flags: 3,
        call_id: CallId(0),
        payload: Bytes::from_static(b"future"),
    });
}

#[test]
fn partial_input_waits_and_reports_bytes_needed() {
    let wire = Frame::Credit {
        call_id: CallId(1),
        increment: 5,
    }
    .to_bytes();
    let dec = FrameDecoder::new(1 << 20);
    for cut in 0..wire.len() {
        let mut buf = BytesMut::from(&wire[..cut]);
        let want = if cut < HEADER_LEN {
            HEADER_LEN - cut
        } else {
            wire.len() - cut
        };
        assert_eq!(dec.bytes_needed(&buf).unwrap(), want);
        assert_eq!(dec.clone().decode(&mut buf).unwrap(), None);
        assert_eq!(buf.len(), cut, "nothing consumed from a partial frame");
    }
}

#[test]
fn errors_are_specific() {
    // 4 GB length prefix: refused from the header alone.
    let e = decode_err(&[0xff, 0xff, 0xff, 0xff, 0x03, 0, 0, 0, 1, 0, 0, 0]);
    assert_eq!(e.code, ErrorCode::FRAME_TOO_LARGE);
    assert!(e.reason.contains("MAX_FRAME_SIZE"), "{e}");
    // Unknown strict type.
    assert_eq!(
        decode_err(&[0, 0, 0, 0, 0x0d, 0, 0, 0, 0, 0, 0, 0]).code,
        ErrorCode::UNKNOWN_FRAME_TYPE
    );
    assert_eq!(
        decode_err(&[0, 0, 0, 0, 0x00, 0, 0, 0, 0, 0, 0, 0]).code,
        ErrorCode::UNKNOWN_FRAME_TYPE
    );
    // Connection frame on a call, call frame on the connection.
    assert_eq!(
        decode_err(&[8, 0, 0, 0, 0x0a, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).code,
        ErrorCode::ILLEGAL_FRAME
    );
    assert_eq!(
        decode_err(&[0, 0, 0, 0, 0x06, 0, 0, 0, 0, 0, 0, 0]).code,
        ErrorCode::ILLEGAL_FRAME
    );
    // Wrong fixed sizes.
    assert_eq!(
        decode_err(&[1, 0, 0, 0, 0x06, 0, 0, 0, 1, 0, 0, 0, 0]).code,
        ErrorCode::MALFORMED_FRAME
    );
    assert_eq!(
        decode_err(&[4, 0, 0, 0, 0x09, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]).code,
        ErrorCode::MALFORMED_FRAME
    );
    // Truncated CALL.
    assert_eq!(
        decode_err(&[3, 0, 0, 0, 0x02, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0]).code,
        ErrorCode::MALFORMED_FRAME
    );
    // END with trailing garbage.
    assert_eq!(
        decode_err(&[7, 0, 0, 0, 0x07, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]).code,
        ErrorCode::MALFORMED_FRAME
    );
}

/// Encodes `f`, checks the header's length against the bytes written, and decodes it back.
fn encode_decode(f: &Frame) -> Frame {
    let wire = f.to_bytes();
    let declared = u32::from_le_bytes([wire[0], wire[1], wire[2], wire[3]]) as usize;
    assert_eq!(
        declared,
        wire.len() - HEADER_LEN,
        "declared length != payload written"
    );
    assert_eq!(wire.len(), HEADER_LEN + f.payload_len());
    let mut buf = BytesMut::from(&wire[..]);
    let back = FrameDecoder::new(crate::Settings::default().max_frame_size)
        .decode(&mut buf)
        .expect("decodes")
        .expect("whole");
    assert!(buf.is_empty(), "the frame is exactly what it declares");
    back
}

/// Regression: texts over 65,535 bytes made `Frame::encode` declare the whole text but write
/// 65,535 bytes of it, cut inside a character (an END with 40,000 × "é" declared 80,006 payload
/// bytes and wrote 65,541).
#[test]
fn long_multibyte_texts_are_clipped_at_a_character_boundary() {
    let long = "é".repeat(40_000); // 80,000 bytes
    let clipped = "é".repeat(32_767); // 65,534 bytes: the most whole characters that fit
    let end = Frame::End(EndFrame {
        call_id: CallId(1),
        code: Code::Internal,
        message: ByteString::from(long.clone()),
        trailers: Metadata::new(),
    });
    match encode_decode(&end) {
        Frame::End(e) => assert_eq!(&*e.message, clipped),
        other => panic!("{other:?}"),
    }
    let go_away = Frame::GoAway {
        last_call_id: CallId(3),
        code: ErrorCode::NO_ERROR,
        reason: ByteString::from(long.clone()),
    };
    match encode_decode(&go_away) {
        Frame::GoAway { reason, .. } => assert_eq!(&*reason, clipped),
        other => panic!("{other:?}"),
    }
    let error = Frame::Error {
        code: ErrorCode::INTERNAL_ERROR,
        reason: ByteString::from(long),
    };
    match encode_decode(&error) {
        Frame::Error { reason, .. } => assert_eq!(&*reason, clipped),
        other => panic!("{other:?}"),
    }
}

/// Decoder messages say what was checked.
#[test]
fn short_payload_messages_match_their_checks() {
    // GOAWAY with 7 payload bytes: shorter than its 8 fixed bytes.
    let mut b = vec![7, 0, 0, 0, 0x0B, 0, 0, 0, 0, 0, 0, 0];
    b.extend_from_slice(&[0; 7]);
    let e = decode_err(&b);
    assert!(e.reason.contains("8 fixed bytes"), "{e}");
    // END with 3 payload bytes: shorter than its 4 fixed bytes.
    let mut b = vec![3, 0, 0, 0, 0x07, 0, 0, 0, 1, 0, 0, 0];
    b.extend_from_slice(&[0; 3]);
    let e = decode_err(&b);
    assert!(e.reason.contains("4 fixed bytes"), "{e}");
}

/// The engine writes into its staging `BytesMut` through the inlined sink; every branch of the
/// hot writers (fields and empty blocks folded into one write, or not) puts the same bytes as
/// the public `encode_*` functions into any `BufMut`, and those bytes decode back.
#[test]
fn engine_sink_writes_what_the_public_encoders_write() {
    let md = Metadata::builder().text("k", "v").unwrap().build();
    let empty = Metadata::new();
    for (name, meta) in [
        (None, &empty),
        (None, &md),
        (Some("/a.B/C"), &empty),
        (Some("/a.B/C"), &md),
    ] {
        let mut fast = BytesMut::new();
        write_call(&mut fast, CallId(9), 2, name, 1, 77, meta);
        let mut slow = Vec::new();
        encode_call(&mut slow, CallId(9), 2, name, 1, 77, meta);
        assert_eq!(&fast[..], &slow[..]);
        let f = FrameDecoder::new(1 << 20)
            .decode(&mut fast)
            .unwrap()
            .unwrap();
        let Frame::Call(c) = f else { panic!("{f:?}") };
        assert_eq!(
            (c.method_name.as_deref(), &c.metadata, c.timeout_us),
            (name, meta, 77)
        );
    }
    for (msg, trailers) in [("", &empty), ("", &md), ("oops", &empty), ("oops", &md)] {
        let mut fast = BytesMut::new();
        write_end(&mut fast, CallId(9), Code::Internal, msg, trailers);
        let mut slow = Vec::new();
        encode_end(&mut slow, CallId(9), Code::Internal, msg, trailers);
        assert_eq!(&fast[..], &slow[..]);
        let f = FrameDecoder::new(1 << 20)
            .decode(&mut fast)
            .unwrap()
            .unwrap();
        let Frame::End(e) = f else { panic!("{f:?}") };
        assert_eq!(
            (&*e.message, &e.trailers, e.code),
            (msg, trailers, Code::Internal)
        );
    }
    for total in [None, Some(100)] {
        let mut fast = BytesMut::new();
        write_message_head(&mut fast, CallId(5), true, total, 3);
        let mut slow = Vec::new();
        encode_message_head(&mut slow, CallId(5), true, total, 3);
        assert_eq!(&fast[..], &slow[..]);
    }
    let mut fast = BytesMut::new();
    write_continuation_head(&mut fast, CallId(5), 3);
    write_headers(&mut fast, CallId(5), &md);
    write_half_close(&mut fast, CallId(5));
    write_cancel(&mut fast, CallId(5), Code::Cancelled);
    write_credit(&mut fast, CallId(5), 4096);
    let mut slow = Vec::new();
    encode_continuation_head(&mut slow, CallId(5), 3);
    encode_headers(&mut slow, CallId(5), &md);
    encode_half_close(&mut slow, CallId(5));
    encode_cancel(&mut slow, CallId(5), Code::Cancelled);
    encode_credit(&mut slow, CallId(5), 4096);
    assert_eq!(&fast[..], &slow[..]);
}

/// What [`FrameDecoder::decode`] makes of one whole frame, and what [`Frame::decode`] makes of
/// the same header and payload as a slice: the decoder parses bodiless frames in place and
/// must agree with the slicing path on every frame and every error.
fn both_paths(ty: u8, flags: u8, call_id: u32, payload: &[u8]) {
    let header = Header {
        length: payload.len() as u32,
        ty,
        flags,
        call_id: CallId(call_id),
    };
    let mut wire = BytesMut::new();
    header.encode(&mut wire);
    wire.extend_from_slice(payload);
    let in_place = FrameDecoder::new(1 << 20)
        .decode(&mut wire)
        .map(Option::unwrap);
    assert!(wire.is_empty());
    let sliced = Frame::decode(&header, Bytes::copy_from_slice(payload));
    assert_eq!(
        in_place, sliced,
        "type {ty:#x} flags {flags} call {call_id} {payload:?}"
    );
}

#[test]
fn in_place_decoding_agrees_with_slices() {
    let bare_call = [7, 0, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0];
    for id in [0, 1] {
        both_paths(0x02, 0, id, &bare_call);
        both_paths(0x02, FLAG_NAMED, id, &bare_call);
        both_paths(0x02, 0, id, &bare_call[..13]);
        both_paths(0x02, 0, id, &[7, 0, 1, 9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 0]);
        both_paths(0x07, 0, id, &[0, 0, 0, 0, 0, 0]);
        both_paths(0x07, 0, id, &[13, 0, 0, 0, 0, 0]);
        both_paths(0x07, 0, id, &[13, 0, 0, 0, 0, 0, 0]);
        both_paths(0x07, 0, id, &[13, 0, 1, 0, b'x', 0, 0]);
        both_paths(0x05, 0, id, &[0, 0]);
        both_paths(0x05, 0, id, &[0, 0, 0]);
        both_paths(0x06, 0, id, &[]);
        both_paths(0x08, 0, id, &[1, 0]);
        both_paths(0x09, 0, id, &[0, 16, 0, 0]);
        both_paths(0x09, 0, id, &[0, 0, 0, 0]);
        both_paths(0x0A, 1, id, &[1, 2, 3, 4, 5, 6, 7, 8]);
        both_paths(0x01, 0, id, &[]);
        both_paths(0x01, 0, id, &[1, 0, 0, 0, 0, 1]);
    }
}

proptest::proptest! {
    #[test]
    fn in_place_decoding_agrees_with_slices_on_any_frame(
        ty in 0u8..16,
        flags in 0u8..4,
        call_id in 0u32..3,
        payload in proptest::collection::vec(proptest::prop_oneof![3 => proptest::strategy::Just(0u8), 1 => 0u8..=255], 0..24),
    ) {
        both_paths(ty, flags, call_id, &payload);
    }
}
