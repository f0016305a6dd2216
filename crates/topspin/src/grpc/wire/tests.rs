use super::*;
use bytes::Buf;

#[test]
fn timeouts() {
    assert_eq!(parse_timeout(b"100m").unwrap(), Duration::from_millis(100));
    assert_eq!(parse_timeout(b"2S").unwrap(), Duration::from_secs(2));
    assert_eq!(parse_timeout(b"1H").unwrap(), Duration::from_secs(3600));
    assert_eq!(
        parse_timeout(b"99999999n").unwrap(),
        Duration::from_nanos(99_999_999)
    );
    for bad in [&b""[..], b"m", b"123456789m", b"10x", b"-1S", b"1 S"] {
        assert!(parse_timeout(bad).is_err(), "{bad:?}");
    }
}

#[test]
#[cfg(feature = "grpc")]
fn metadata_both_ways() {
    let md = Metadata::builder()
        .text("user", "ann")
        .unwrap()
        .binary("trace-bin", &[0, 1, 0xff])
        .unwrap()
        .build();
    let mut h = HeaderMap::new();
    append_metadata(&mut h, &md);
    assert_eq!(h.get("trace-bin").unwrap(), "AAH/");
    h.insert("grpc-timeout", HeaderValue::from_static("1S"));
    h.insert("content-type", HeaderValue::from_static(CONTENT_TYPE));
    h.append("trace-bin", HeaderValue::from_static("AQ=="));
    let back = metadata_from_headers(&h);
    assert_eq!(back.get_str("user"), Some("ann"));
    let bins: Vec<&[u8]> = back.get_all("trace-bin").collect();
    assert_eq!(bins, vec![&[0, 1, 0xff][..], &[1][..]]);
    assert!(back.get("grpc-timeout").is_none() && back.get("content-type").is_none());
}

#[test]
#[cfg(feature = "grpc")]
fn status_message_is_percent_encoded() {
    let mut h = HeaderMap::new();
    let st = Status::not_found("no 100% grüße\n").with_details(vec![1, 2]);
    status_trailers(&mut h, &st, &Metadata::new());
    assert_eq!(h.get("grpc-status").unwrap(), "5");
    assert_eq!(
        h.get("grpc-message").unwrap(),
        "no 100%25 gr%C3%BC%C3%9Fe%0A"
    );
    assert_eq!(h.get("grpc-status-details-bin").unwrap(), "AQI");
}

#[test]
#[cfg(feature = "grpc")]
fn frames_cut_across_chunks() {
    let mut out = Vec::new();
    for m in [&b"hello"[..], b"", b"a longer message"] {
        let mut f = Frame::new(Bytes::copy_from_slice(m).into(), None).unwrap();
        while f.has_remaining() {
            let c = f.chunk().to_vec();
            f.advance(c.len());
            out.extend_from_slice(&c);
        }
    }
    let mut d = Deframer::new(1 << 20, None);
    let mut got = Vec::new();
    for b in out.chunks(3) {
        d.push(Bytes::copy_from_slice(b));
        while let Some(r) = d.next(1024, None).unwrap() {
            got.push(r.message);
        }
    }
    assert_eq!(got, vec![&b"hello"[..], b"", b"a longer message"]);
    assert!(d.is_empty());
    let mut d = Deframer::new(1 << 20, None);
    d.push(Bytes::from_static(&[0, 0, 0, 4, 1]));
    assert_eq!(
        d.next(1000, None).unwrap_err().code(),
        Code::ResourceExhausted
    );
}

#[test]
#[cfg(feature = "grpc")]
fn compressed_frames() {
    let c = Compression::new(Encoding::Gzip).with_threshold(0);
    let msg = Bytes::from(vec![7u8; 4000]);
    let mut f = Frame::new(msg.clone().into(), Some(c)).unwrap();
    assert_eq!(f.head[0], 1);
    let wire = f.copy_to_bytes(f.remaining());
    let mut d = Deframer::new(1 << 20, None);
    d.push(wire.clone());
    assert_eq!(
        d.next(1 << 20, Some(Encoding::Gzip))
            .unwrap()
            .unwrap()
            .message,
        msg
    );
    d.push(wire);
    assert_eq!(
        d.next(100, Some(Encoding::Gzip)).unwrap_err().code(),
        Code::ResourceExhausted
    );
}

/// A message of segments is framed as its concatenation (read chunk by chunk, in odd
/// steps, and vectored), with and without compression; its large segment is read in place.
#[test]
#[cfg(feature = "grpc")]
fn segmented_frames() {
    use crate::codec::Payload;
    let big: Bytes = (0..100_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect::<Vec<u8>>()
        .into();
    let whole: Bytes = [&b"head"[..], &big, b"", b"tail"].concat().into();
    let p = || {
        Payload::from_segments(vec![
            Bytes::from_static(b"head"),
            big.clone(),
            Bytes::new(),
            Bytes::from_static(b"tail"),
        ])
    };
    let gz = Compression::new(Encoding::Gzip).with_threshold(0);
    for c in [None, Some(gz), Some(gz.with_threshold(1 << 30))] {
        // Chunk by chunk, advancing 7 bytes at a time.
        let mut f = Frame::new(p(), c).unwrap();
        let mut wire = Vec::new();
        let mut in_place = false;
        while f.has_remaining() {
            let ch = f.chunk();
            in_place |= ch.as_ptr() == big.as_ptr();
            let n = ch.len().min(7);
            wire.extend_from_slice(&ch[..n]);
            f.advance(n);
        }
        // Vectored.
        let f = Frame::new(p(), c).unwrap();
        let mut io = [std::io::IoSlice::new(&[]); 8];
        let n = f.chunks_vectored(&mut io);
        let v: Vec<u8> = io[..n].iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(v, wire);
        let enc = c.map(Compression::encoding);
        let mut d = Deframer::new(1 << 20, None);
        d.push(wire.into());
        let got = d.next(1 << 20, enc).unwrap().unwrap().message;
        assert_eq!(got, whole);
        // Sent as is (no compression, or over the threshold), the big segment is read in
        // place, not copied.
        assert_eq!(in_place, c != Some(gz), "{c:?}");
    }
}

#[test]
fn a_frame_cut_into_pieces_is_the_same_bytes() {
    let big = Bytes::from(vec![9u8; 70_000]);
    let p = || crate::codec::Payload::from_segments(vec![Bytes::from_static(b"ab"), big.clone()]);
    let whole: Vec<u8> = {
        let mut f = Frame::encoded(p(), false).unwrap();
        f.copy_to_bytes(f.remaining()).to_vec()
    };
    for size in [1, 3, 5, 6, 7, 4096, 65_536, 1 << 20] {
        let mut f = Frame::encoded(p(), false).unwrap();
        let mut out = Vec::new();
        while f.has_remaining() {
            let piece = f.take_piece(size);
            assert!(piece.remaining() <= size && piece.remaining() > 0);
            // Vectored and chunk by chunk agree on each piece.
            let mut io = [std::io::IoSlice::new(&[]); 8];
            let n = piece.chunks_vectored(&mut io);
            let v: Vec<u8> = io[..n].iter().flat_map(|s| s.iter().copied()).collect();
            assert_eq!(v.len(), piece.remaining(), "size {size}");
            let mut piece = piece;
            while piece.has_remaining() {
                let k = piece.chunk().len();
                assert!(k > 0);
                out.extend_from_slice(piece.chunk());
                piece.advance(k);
            }
        }
        assert_eq!(out, whole, "size {size}");
    }
}

#[test]
fn timeout_encoding() {
    let t = |d| timeout_header(d).to_str().unwrap().to_owned();
    assert_eq!(t(Duration::from_nanos(5)), "5n");
    assert_eq!(t(Duration::from_millis(250)), "250000u");
    assert_eq!(t(Duration::from_secs(5)), "5000000u");
    assert_eq!(t(Duration::from_secs(500)), "500000m");
    assert_eq!(t(Duration::from_secs(200_000)), "200000S");
    assert_eq!(t(Duration::from_secs(u64::MAX / 4)), "99999999H");
}

#[test]
fn statuses() {
    let mut m = HeaderMap::new();
    assert_eq!(status_of(&m, "/a").code(), Code::Internal);
    m.insert("grpc-status", HeaderValue::from_static("x1"));
    assert_eq!(status_of(&m, "/a").code(), Code::Internal);
    m.insert("grpc-status", HeaderValue::from_static("99"));
    assert_eq!(status_of(&m, "/a").code(), Code::Unknown);
    m.insert("grpc-status", HeaderValue::from_static("5"));
    m.insert(
        "grpc-message",
        HeaderValue::from_static("no%20key%20%F0%9F%8D%8E"),
    );
    m.insert("grpc-status-details-bin", HeaderValue::from_static("AQID"));
    m.insert("x-retry-bin", HeaderValue::from_static("AAE="));
    let s = status_of(&m, "/a");
    assert_eq!(s.code(), Code::NotFound);
    assert_eq!(s.message(), "no key 🍎");
    assert_eq!(s.details().as_ref(), &[1, 2, 3]);
    assert_eq!(s.metadata().get("x-retry-bin"), Some(&[0u8, 1][..]));
    assert_eq!(s.metadata().get("grpc-message"), None);
    assert_eq!(
        http_status_code(http::StatusCode::NOT_FOUND),
        Code::Unimplemented
    );
    assert_eq!(
        http_status_code(http::StatusCode::IM_A_TEAPOT),
        Code::Unknown
    );
}

#[test]
fn metadata_to_headers_is_strict() {
    let md = Metadata::builder()
        .text("x-user", "ann")
        .unwrap()
        .binary("x-raw-bin", &[0, 255, 7])
        .unwrap()
        .text("topspin-encoding", "gzip")
        .unwrap()
        .build();
    let mut h = HeaderMap::new();
    metadata_to_headers(&md, &mut h).unwrap();
    assert_eq!(h.get("x-raw-bin").unwrap(), "AP8H");
    assert!(h.get("topspin-encoding").is_none());
    let back = metadata_from_headers(&h);
    assert_eq!(back.get_str("x-user"), Some("ann"));
    assert_eq!(back.get("x-raw-bin"), Some(&[0u8, 255, 7][..]));
    let bad = Metadata::builder().text("x", "grüße").unwrap().build();
    let e = metadata_to_headers(&bad, &mut HeaderMap::new()).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

/// What [`deframe`] gives: the messages with their credit, and each part's rest.
type Deframed = (Vec<(Bytes, usize)>, Vec<usize>);

/// Feeds `parts` to `d`, draining it after each: the messages and each one's credit, and
/// for each part what it left to an incomplete message (its length less that credit).
fn deframe(d: &mut Deframer, parts: &[&[u8]], limit: usize) -> Result<Deframed, Status> {
    let (mut got, mut rest) = (Vec::new(), Vec::new());
    for part in parts {
        d.push(Bytes::copy_from_slice(part));
        let mut credit = 0;
        while let Some(r) = d.next(limit, None)? {
            credit += r.credit;
            got.push((r.message, r.credit));
        }
        rest.push(part.len() - credit);
    }
    Ok((got, rest))
}

/// Each message's credit, worked out from where its bytes are: those of the part that
/// completed it (the earlier parts' were an incomplete message's).
fn credits_at(messages: &[&[u8]], cuts: &[usize]) -> Vec<usize> {
    let mut at = 0;
    messages
        .iter()
        .map(|m| {
            let (start, end) = (at, at + PREFIX + m.len());
            at = end;
            let part_start = cuts.iter().copied().filter(|&c| c < end).max().unwrap_or(0);
            end - start.max(part_start)
        })
        .collect()
}

#[test]
fn deframes_across_chunks_with_credit() {
    let messages: [&[u8]; 3] = [b"hello", b"", b"0123456789"];
    let wire = wire_of(&messages);
    for cut in 0..wire.len() {
        let mut d = Deframer::new(1 << 20, None);
        let (got, rest) = deframe(&mut d, &[&wire[..cut], &wire[cut..]], 64).unwrap();
        assert!(d.is_empty());
        let credit: usize = got.iter().map(|(_, c)| c).sum::<usize>() + rest.iter().sum::<usize>();
        assert_eq!(credit, wire.len(), "cut {cut}");
        let (got, credits): (Vec<Bytes>, Vec<usize>) = got.into_iter().unzip();
        assert_eq!(got, messages, "cut {cut}");
        assert_eq!(credits, credits_at(&messages, &[cut]), "cut {cut}");
    }
    let mut d = Deframer::new(1 << 20, None);
    d.push(Bytes::from_static(&[0, 0, 0, 1, 0]));
    assert_eq!(
        d.next(64, None).unwrap_err().code(),
        Code::ResourceExhausted
    );
    let mut d = Deframer::new(1 << 20, None);
    d.push(Bytes::from_static(&[7, 0, 0, 0, 0]));
    assert_eq!(d.next(64, None).unwrap_err().code(), Code::Internal);
}

/// What `timeout_header` writes, `parse_timeout` reads back: never shorter, and longer by
/// less than one unit of the encoding.
#[test]
fn timeout_round_trip() {
    for d in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_nanos(99_999_999),
        Duration::from_nanos(100_000_001),
        Duration::from_millis(250),
        Duration::from_secs(5),
        Duration::from_secs(99_999_999),
        Duration::from_secs(100_000_000),
        Duration::from_secs(7 * 24 * 3600),
    ] {
        let v = timeout_header(d);
        let back = parse_timeout(v.as_bytes()).unwrap();
        assert!(back >= d, "{d:?} -> {v:?} -> {back:?}");
        let unit = match v.as_bytes().last() {
            Some(b'n') => Duration::from_nanos(1),
            Some(b'u') => Duration::from_micros(1),
            Some(b'm') => Duration::from_millis(1),
            Some(b'S') => Duration::from_secs(1),
            Some(b'M') => Duration::from_secs(60),
            _ => Duration::from_secs(3600),
        };
        assert!(back - d < unit, "{d:?} -> {v:?} -> {back:?}");
    }
    // Past 99999999 hours: the largest there is.
    let v = timeout_header(Duration::MAX);
    assert_eq!(v, "99999999H");
    assert_eq!(
        parse_timeout(v.as_bytes()).unwrap(),
        Duration::from_secs(99_999_999 * 3600)
    );
}

fn sample_metadata() -> Metadata {
    Metadata::builder()
        .text("x-user", "ann")
        .unwrap()
        .binary("x-raw-bin", &[0, 0xff, 7, b','])
        .unwrap()
        .binary("x-empty-bin", &[])
        .unwrap()
        .text("x-user", "bob")
        .unwrap()
        // Never sent: gRPC's and topspin's own.
        .text("grpc-timeout", "1S")
        .unwrap()
        .text(compression::ENCODING_KEY, "gzip")
        .unwrap()
        .build()
}

fn sent_entries(md: &Metadata) -> Vec<(String, Vec<u8>)> {
    md.iter().map(|(k, v)| (k.to_owned(), v.to_vec())).collect()
}

/// The client's request metadata, read by the server: the same entries in the same order
/// (`-bin` values through base64), reserved ones left out.
#[test]
fn metadata_round_trip_client_to_server() {
    let md = sample_metadata();
    let mut h = HeaderMap::new();
    metadata_to_headers(&md, &mut h).unwrap();
    assert!(h.get("grpc-timeout").is_none());
    assert!(h.get(compression::ENCODING_KEY).is_none());
    assert_eq!(h.get("x-raw-bin").unwrap(), "AP8HLA");
    let back = metadata_from_headers(&h);
    assert_eq!(
        sent_entries(&back),
        vec![
            ("x-user".to_owned(), b"ann".to_vec()),
            ("x-user".to_owned(), b"bob".to_vec()),
            ("x-raw-bin".to_owned(), vec![0, 0xff, 7, b',']),
            ("x-empty-bin".to_owned(), vec![]),
        ]
    );
}

/// `-bin` values as other gRPC stacks send them: padded or not, several in one header
/// (comma-separated); invalid base64 is left out, the rest kept.
#[test]
fn bin_values_padded_joined_or_bad() {
    let mut h = HeaderMap::new();
    h.append("a-bin", HeaderValue::from_static("AAE="));
    h.append("a-bin", HeaderValue::from_static("AQ, Ag=="));
    h.append("b-bin", HeaderValue::from_static("!!!"));
    h.append("c", HeaderValue::from_static("text"));
    let md = metadata_from_headers(&h);
    let a: Vec<&[u8]> = md.get_all("a-bin").collect();
    assert_eq!(a, vec![&[0u8, 1][..], &[1][..], &[2][..]]);
    assert!(md.get("b-bin").is_none());
    assert_eq!(md.get_str("c"), Some("text"));
    assert_eq!(decode_bin(b"AP8HLA"), Some(vec![0, 0xff, 7, b',']));
    assert_eq!(decode_bin(b"AP8HLA=="), Some(vec![0, 0xff, 7, b',']));
    assert_eq!(decode_bin(b"A"), None);
}

/// The server's response metadata and status trailers, read by the client: code, message
/// (percent-encoded on the wire, `%` and non-ASCII included), details and trailing
/// metadata come back as they were.
#[test]
#[cfg(feature = "grpc")]
fn status_round_trip_server_to_client() {
    let md = sample_metadata();
    let mut h = response_headers(&md, None, true);
    assert_eq!(h.get("content-type").unwrap(), CONTENT_TYPE);
    assert_eq!(h.get("grpc-accept-encoding").unwrap(), ACCEPT);
    h.remove("content-type");
    h.remove("grpc-accept-encoding");
    let back = metadata_from_headers(&h);
    assert_eq!(back.len(), 4);
    assert_eq!(back.get("x-raw-bin"), Some(&[0u8, 0xff, 7, b','][..]));

    for code in 0..17u16 {
        let code = Code::from_u16(code);
        for message in [
            "",
            "plain",
            "100% sure",
            "grüße 🍎\r\n\ttab",
            "%41 is not A",
        ] {
            let st = Status::new(code, message)
                .with_details(vec![8, 0, 0xff])
                .with_metadata(
                    Metadata::builder()
                        .binary("why-bin", &[1, 2])
                        .unwrap()
                        .build(),
                );
            let trailing = Metadata::builder().text("t", "v").unwrap().build();
            let mut h = HeaderMap::new();
            status_trailers(&mut h, &st, &trailing);
            let m = h.get("grpc-message").map(|v| v.as_bytes().to_vec());
            assert!(
                m.iter().flatten().all(|b| (0x20..0x7f).contains(b)),
                "{m:?}"
            );
            let got = status_of(&h, "/t.T/M");
            assert_eq!(got.code(), code);
            assert_eq!(got.message(), message);
            assert_eq!(got.details().as_ref(), &[8, 0, 0xff]);
            assert_eq!(got.metadata().get_str("t"), Some("v"));
            assert_eq!(got.metadata().get("why-bin"), Some(&[1u8, 2][..]));
            assert!(got.metadata().get("grpc-status").is_none());
        }
    }
}

fn wire_of(messages: &[&[u8]]) -> Vec<u8> {
    let mut wire = Vec::new();
    for m in messages {
        wire.extend_from_slice(&prefix(false, m.len()).unwrap());
        wire.extend_from_slice(m);
    }
    wire
}

/// The deframer (as the server's face uses it: a window of 8 to reserve) cut at every byte
/// (prefix included): the same messages, each once, and a length over the limit refused on
/// its prefix alone.
#[test]
fn server_deframer_every_cut() {
    let messages: [&[u8]; 3] = [b"hello", b"", b"0123456789"];
    let wire = wire_of(&messages);
    for cut in 0..=wire.len() {
        let mut d = Deframer::new(8, None);
        let mut got = Vec::new();
        let mut wire_len = 0;
        for part in [&wire[..cut], &wire[cut..]] {
            d.push(Bytes::copy_from_slice(part));
            while let Some(r) = d.next(64, None).unwrap() {
                wire_len += r.wire_len;
                got.push(r.message);
            }
        }
        assert_eq!(got, messages, "cut {cut}");
        assert_eq!(wire_len, wire.len(), "cut {cut}");
        assert!(d.is_empty(), "cut {cut}");
    }
    // Over the limit: refused as soon as the prefix is complete, split or not.
    let mut d = Deframer::new(8, None);
    d.push(Bytes::from_static(&[0, 0, 0]));
    assert!(d.next(64, None).unwrap().is_none());
    d.push(Bytes::from_static(&[0, 65]));
    assert_eq!(
        d.next(64, None).unwrap_err().code(),
        Code::ResourceExhausted
    );
    let mut d = Deframer::new(8, None);
    d.push(Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff]));
    assert_eq!(
        d.next((u32::MAX - 1) as usize, None).unwrap_err().code(),
        Code::ResourceExhausted
    );
    let mut d = Deframer::new(8, None);
    d.push(Bytes::from_static(&[2, 0, 0, 0, 0]));
    assert_eq!(d.next(64, None).unwrap_err().code(), Code::Internal);
}

/// The deframer (as the client mode uses it) over input cut in three at every pair of
/// points: the messages, each one's credit, and what each part left to an incomplete message;
/// and the largest length a prefix can say refused, or, within the limit, accepted without a
/// buffer past the window.
#[test]
fn credit_deframer_three_cuts_and_oversize() {
    let messages: [&[u8]; 3] = [b"hello", b"", b"0123456789"];
    let wire = wire_of(&messages);
    for a in 0..=wire.len() {
        for b in a..=wire.len() {
            let mut d = Deframer::new(65_535, None);
            let (got, rest) = deframe(&mut d, &[&wire[..a], &wire[a..b], &wire[b..]], 10).unwrap();
            let (got, credits): (Vec<Bytes>, Vec<usize>) = got.into_iter().unzip();
            assert_eq!(got, messages, "cuts {a} {b}");
            assert_eq!(credits, credits_at(&messages, &[a, b]), "cuts {a} {b}");
            assert_eq!(
                credits.iter().sum::<usize>() + rest.iter().sum::<usize>(),
                wire.len()
            );
            assert!(d.is_empty());
        }
    }
    let mut d = Deframer::new(8, None);
    let (got, rest) = deframe(&mut d, &[&[0, 0xff]], 10).unwrap();
    assert!(got.is_empty() && rest == [2] && !d.is_empty());
    // 4 GiB - 1 is within a 64-bit limit: accepted as a length, its body not yet here, and no
    // more than the window reserved for it (there is no budget to reserve it whole against).
    let (got, rest) = deframe(&mut d, &[&[0xff, 0xff, 0xff]], usize::MAX >> 1).unwrap();
    assert!(got.is_empty() && rest == [3] && !d.is_empty());
    assert!(d.buf.capacity() <= 8, "{}", d.buf.capacity());
    let mut d = Deframer::new(8, None);
    let e = deframe(&mut d, &[&[0, 0, 0, 0, 11, 1]], 10).unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
}

/// The client mode's response deframer charges a message split over DATA chunks to the
/// memory budget while it gathers it (else a server could make a client hold up to
/// max_message_size per call outside the budget), keeps it charged while the message is held,
/// and gives all of it back once the message is dropped. The credit is the chunks' bytes.
#[test]
fn client_split_message_is_charged_to_the_budget() {
    let budget = topspin_proto::MemoryBudget::new(1 << 20);
    let body = vec![7u8; 100_000];
    let wire = wire_of(&[&body]);
    // As the client mode builds it: its call's window, the channel's budget.
    let mut d = Deframer::new(65_535, Some(budget.clone()));
    let mut got = Vec::new();
    let mut credit = 0;
    for (i, part) in wire.chunks(16_384).enumerate() {
        let (m, rest) = deframe(&mut d, &[part], 1 << 20).unwrap();
        credit += rest[0] + m.iter().map(|(_, c)| c).sum::<usize>();
        got.extend(m.into_iter().map(|(m, _)| m));
        let gathered = ((i + 1) * 16_384).min(wire.len());
        assert!(
            budget.used() >= gathered - PREFIX,
            "{} bytes of the budget charged for {gathered} bytes gathered",
            budget.used()
        );
    }
    assert_eq!(credit, wire.len());
    assert_eq!(got, [&body[..]]);
    drop(d);
    assert!(budget.used() >= body.len(), "the message held is charged");
    drop(got);
    assert_eq!(budget.used(), 0);
}

/// A split message is gathered in the connection's kept buffer (`Spare`) when the one handed
/// out from it is gone — the next call's deframer too — so a large message costs no fresh
/// allocation (whose pages the kernel faults in anew); while the last one is still held, a
/// new buffer is used. The kept buffer is charged to the budget, and given back with it.
///
/// Failed before the spare (every split message a fresh allocation: the pointers differ); a
/// 1 MiB response cost the `grpc://` client ~500 page faults a call.
#[test]
fn a_split_message_reuses_the_connections_buffer_once_the_last_is_dropped() {
    let budget = topspin_proto::MemoryBudget::new(1 << 24);
    let spare = std::sync::Arc::new(Spare::new(Some(budget.clone())));
    let body = vec![7u8; 300_000];
    let wire = wire_of(&[&body]);
    let gather = |spare: &std::sync::Arc<Spare>| {
        // A call's deframer, as each mode builds it.
        let mut d = Deframer::new(65_535, Some(budget.clone())).with_spare(spare.clone());
        let parts: Vec<&[u8]> = wire.chunks(16_384).collect();
        let (mut got, _) = deframe(&mut d, &parts, 1 << 20).unwrap();
        assert_eq!(got.len(), 1);
        got.remove(0).0
    };
    let first = gather(&spare);
    let at = first.as_ptr();
    drop(first);
    let second = gather(&spare);
    assert_eq!(second, body);
    assert_eq!(second.as_ptr(), at, "the kept allocation was not reused");
    // Still held: the next message cannot reuse it, and takes a buffer of its own.
    let third = gather(&spare);
    assert_eq!(third, body);
    assert_ne!(third.as_ptr(), second.as_ptr());
    drop((second, third));
    assert!(budget.used() > 0, "the kept buffer is charged");
    drop(spare);
    assert_eq!(budget.used(), 0, "the kept buffer's charge went with it");
}

/// With the budget spent, the client mode's deframer says so (its caller then withholds the
/// incomplete message's credit, as the face withholds its window) until there is room; the
/// bytes then charged are given back when it is dropped.
#[test]
fn client_deframer_must_wait_on_a_spent_budget() {
    let budget = topspin_proto::MemoryBudget::new(16_384);
    assert!(budget.try_reserve(12_000)); // someone else's
    let wire = wire_of(&[&[1u8; 20_000]]);
    let mut d = Deframer::new(1024, Some(budget.clone()));
    let (got, rest) = deframe(&mut d, &[&wire[..10_000]], 1 << 20).unwrap();
    assert!(got.is_empty() && rest == [10_000]);
    assert!(d.must_wait());
    budget.release(12_000);
    assert!(!d.must_wait());
    assert!(budget.used() >= 10_000, "{}", budget.used());
    drop(d);
    assert_eq!(budget.used(), 0);
}

/// The framer as the client mode uses it: a message as topspin's codec left it, its flag byte
/// first when the call compresses (that byte becomes the prefix's flag), read back by the one
/// deframer; a flagged message without its byte is refused.
#[test]
fn encoded_frames_round_trip() {
    use crate::codec::Payload;
    let segs = |s: &[&'static [u8]]| {
        Payload::from_segments(s.iter().map(|b| Bytes::from_static(b)).collect())
    };
    for (p, flagged, flag, body) in [
        (segs(&[b"ab", b"", b"cd"]), false, 0, &b"abcd"[..]),
        (segs(&[b"\x00ab", b"cd"]), true, 0, b"abcd"),
        (segs(&[b"", b"\x01", b"xyz"]), true, 1, b"xyz"),
        (segs(&[]), false, 0, b""),
    ] {
        let mut f = Frame::encoded(p, flagged).unwrap();
        let wire = f.copy_to_bytes(f.remaining());
        assert_eq!(wire[0], flag);
        assert_eq!(
            &wire[..],
            [&prefix(flag == 1, body.len()).unwrap()[..], body].concat()
        );
        if flag == 0 {
            let mut d = Deframer::new(64, None);
            d.push(wire);
            assert_eq!(d.next(64, None).unwrap().unwrap().message, body);
        }
    }
    let e = Frame::encoded(segs(&[b""]), true).unwrap_err();
    assert_eq!(e.code(), Code::Internal);
    assert_eq!(Frame::empty().remaining(), 0);
}
