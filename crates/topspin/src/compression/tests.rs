use super::*;

/// `decode` with a room of `limit` bytes and no budget.
fn decode(e: Encoding, m: Bytes, limit: usize) -> Result<Bytes, Status> {
    super::decode(e, m, &Room::new(limit, None))
}

#[test]
fn a_message_near_the_budget_decodes_within_it() {
    let budget = topspin_proto::MemoryBudget::new(64 << 20);
    let bomb = zstd::stream::encode_all(&vec![0u8; 60 << 20][..], 3).unwrap();
    let room = Room::new(64 << 20, Some(budget.clone()));
    let m = super::inflate(Encoding::Zstd, &bomb, &room).unwrap();
    assert_eq!(m.len(), 60 << 20);
    assert!(budget.used() <= 64 << 20);
}

#[test]
fn a_decompressed_message_is_charged_to_the_budget_while_it_lives() {
    let budget = topspin_proto::MemoryBudget::new(8 << 20);
    let wire = Compression::new(Encoding::Zstd)
        .encode(&vec![1u8; 3 << 20])
        .unwrap();
    let room = Room::new(16 << 20, Some(budget.clone()));
    let m = super::decode(Encoding::Zstd, wire.clone(), &room).unwrap();
    assert_eq!(m.len(), 3 << 20);
    assert!(budget.used() >= 3 << 20, "{} charged", budget.used());
    let copy = m.slice(10..20);
    drop(m);
    assert!(budget.used() >= 3 << 20, "a slice keeps the charge");
    drop(copy);
    assert_eq!(budget.used(), 0);
    // Two at once pass an 8 MiB budget less 3 MiB held: the third is refused, and what it
    // took is given back.
    let a = super::decode(Encoding::Zstd, wire.clone(), &room).unwrap();
    let b = super::decode(Encoding::Zstd, wire.clone(), &room).unwrap();
    let used = budget.used();
    let e = super::decode(Encoding::Zstd, wire, &room).unwrap_err();
    assert_eq!(e.code(), crate::Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("memory budget"), "{e}");
    assert_eq!(budget.used(), used);
    drop((a, b));
    assert_eq!(budget.used(), 0);
}

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

/// A zstd frame whose header declares `window_descriptor`, holding `content` in one raw
/// block.
fn zstd_frame(header: &[u8], content: &[u8]) -> Bytes {
    let mut f = vec![0x01, 0x28, 0xb5, 0x2f, 0xfd];
    f.extend_from_slice(header);
    let block = 1 | (content.len() as u32) << 3; // last block, raw
    f.extend_from_slice(&block.to_le_bytes()[..3]);
    f.extend_from_slice(content);
    Bytes::from(f)
}

#[test]
fn a_zstd_window_over_8_mib_is_refused_before_allocating() {
    // Window_Descriptor 0x88: 2^27 = 128 MiB (libzstd's own default limit); 0x68: 8 MiB.
    let e = decode(Encoding::Zstd, zstd_frame(&[0x00, 0x88], b"hi"), 64 << 20).unwrap_err();
    assert_eq!(e.code(), crate::Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("window"), "{e}");
    let ok = decode(Encoding::Zstd, zstd_frame(&[0x00, 0x68], b"hi"), 64 << 20).unwrap();
    assert_eq!(&ok[..], b"hi");
    // 8 MiB + 1/8: just over.
    let e = decode(Encoding::Zstd, zstd_frame(&[0x00, 0x69], b"hi"), 64 << 20).unwrap_err();
    assert_eq!(e.code(), crate::Code::ResourceExhausted, "{e}");
}

#[test]
fn a_one_segment_zstd_frame_is_bounded_by_the_message_limit() {
    // Single segment, 4-byte content size of 16 MiB: over a 1 KiB limit, refused at once.
    let e = decode(Encoding::Zstd, zstd_frame(&[0xa0, 0, 0, 0, 1], b"hi"), 1024).unwrap_err();
    assert_eq!(e.code(), crate::Code::ResourceExhausted, "{e}");
    // A real one-segment frame of 12 MiB (its window is its content, past 8 MiB) within a
    // 16 MiB limit decodes.
    let msg = vec![7u8; 12 << 20];
    let mut wire = vec![0x01, 0x28, 0xb5, 0x2f, 0xfd, 0xa0];
    wire.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    let blocks = msg.chunks(128 << 10);
    let last = blocks.len() - 1;
    for (i, b) in blocks.enumerate() {
        let header = u32::from(i == last) | (b.len() as u32) << 3; // raw
        wire.extend_from_slice(&header.to_le_bytes()[..3]);
        wire.extend_from_slice(b);
    }
    let back = decode(Encoding::Zstd, Bytes::from(wire), 16 << 20).unwrap();
    assert_eq!(back.len(), msg.len());
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
    let doc: serde_json::Value = serde_json::from_str(include_str!(
        "../../../../testdata/vectors/compression.json"
    ))
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
