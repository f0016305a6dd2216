//! Messages sent as a [`Payload`] of several segments: byte for byte the frames the same
//! message sent as one `Bytes` makes, whatever the split (frame boundaries inside segments
//! and at their edges, credit stalls mid-message, empty segments), large pieces handed to the
//! transport by reference, and the size limit applied to the total.

use bytes::{Bytes, BytesMut};
use std::time::Instant;
use topspin_proto::connection::{Connection, Event, Payload, Side};
use topspin_proto::{CallError, Metadata, Settings};

/// Frames of 16 KiB, an initial window of 40 KiB: a 200 KiB message is split into 13 frames
/// and stalls for credit several times.
fn server_settings() -> Settings {
    Settings::default()
        .with_max_frame_size(16 * 1024)
        .with_initial_call_window(40 * 1024)
        .with_max_message_size(300 * 1024)
}

struct Run {
    /// Everything the client wrote after the handshake.
    wire: Vec<u8>,
    /// The chunks `poll_transmit` gave, in order.
    chunks: Vec<Bytes>,
    /// The message the server received.
    received: Bytes,
}

fn pump(from: &mut Connection, to: &mut Connection, now: Instant, log: Option<&mut Run>) -> usize {
    let mut wire = BytesMut::new();
    let mut chunks = Vec::new();
    while let Some(b) = from.poll_transmit() {
        wire.extend_from_slice(&b);
        chunks.push(b);
    }
    let n = wire.len();
    if let Some(log) = log {
        log.wire.extend_from_slice(&wire);
        log.chunks.extend(chunks);
    }
    to.handle_input(&mut wire, now).expect("valid input");
    n
}

/// Sends `message` on a fresh call and moves bytes both ways (granting credit back as the
/// server's application would) until the server has it.
fn run(message: impl Into<Payload>) -> Run {
    let now = Instant::now();
    let mut client = Connection::new(Side::Client, Settings::default());
    let mut server = Connection::new(Side::Server, server_settings());
    pump(&mut client, &mut server, now, None);
    pump(&mut server, &mut client, now, None);
    while client.poll_event().is_some() {}
    while server.poll_event().is_some() {}
    let id = client
        .start_call("/t.S/M", 1, None, &Metadata::new(), now)
        .expect("starts");
    client.send_message(id, message, true).expect("sent");
    let mut r = Run {
        wire: Vec::new(),
        chunks: Vec::new(),
        received: Bytes::new(),
    };
    for _ in 0..1000 {
        let moved = pump(&mut client, &mut server, now, Some(&mut r));
        while let Some(e) = server.poll_event() {
            if let Event::Message {
                id: got,
                message,
                credit,
            } = e
            {
                server.grant_credit(got, credit).expect("grants");
                r.received = message;
            }
        }
        let back = pump(&mut server, &mut client, now, None);
        while client.poll_event().is_some() {}
        if moved == 0 && back == 0 {
            return r;
        }
    }
    panic!("no progress");
}

fn data(n: usize) -> Bytes {
    (0..n)
        .map(|i| (i * 7 + i / 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// Cuts `whole` at these offsets into segments.
fn cut(whole: &Bytes, at: &[usize]) -> Vec<Bytes> {
    let mut v = Vec::new();
    let mut from = 0;
    for &a in at {
        v.push(whole.slice(from..a));
        from = a;
    }
    v.push(whole.slice(from..));
    v
}

#[test]
fn segmented_messages_make_the_same_frames_as_one_bytes() {
    const F: usize = 16 * 1024;
    for len in [10, 5000, F - 4, F, F + 1, 200 * 1024] {
        let whole = data(len);
        let reference = run(whole.clone());
        assert_eq!(reference.received, whole, "len {len}");
        let mut splits: Vec<Vec<usize>> = vec![
            vec![0],        // an empty first segment
            vec![len / 2],  // two halves
            vec![len, len], // empty segments at the end
            vec![1, 2, 3],  // tiny ones first
            vec![len / 3, len / 3, 2 * len / 3],
        ];
        if len > F {
            // At the first frame's edge (its body is F - 4 bytes), and at a continuation's.
            splits.push(vec![F - 4]);
            splits.push(vec![F - 5, F - 3, 2 * F - 4, 2 * F - 3]);
            splits.push((1..len / 4096).map(|i| i * 4096).collect());
        }
        for at in splits {
            let at: Vec<usize> = at.into_iter().map(|a| a.min(len)).collect();
            let r = run(Payload::from_segments(cut(&whole, &at)));
            assert_eq!(r.wire, reference.wire, "len {len}, cut at {at:?}");
            assert_eq!(r.received, whole, "len {len}, cut at {at:?}");
        }
    }
}

/// A large segment goes to the transport by reference: some chunk `poll_transmit` returns
/// points into the caller's own buffer, and all of its bytes go that way.
#[test]
fn large_segments_are_transmitted_by_reference() {
    let head = Bytes::from_static(b"\x0a\x80\x80\x0c"); // a small, copied part
    let body = data(150 * 1024);
    let tail = Bytes::from_static(b"\x10\x01");
    let p = Payload::from_segments(vec![head.clone(), body.clone(), tail.clone()]);
    let r = run(p);
    let range = body.as_ptr() as usize..body.as_ptr() as usize + body.len();
    let by_ref: usize = r
        .chunks
        .iter()
        .filter(|c| range.contains(&(c.as_ptr() as usize)))
        .map(Bytes::len)
        .sum();
    assert_eq!(
        by_ref,
        body.len(),
        "every byte of the body went by reference"
    );
    let mut want = BytesMut::new();
    want.extend_from_slice(&head);
    want.extend_from_slice(&body);
    want.extend_from_slice(&tail);
    assert_eq!(r.received, want.freeze());
}

#[test]
fn the_size_limit_applies_to_the_total() {
    let now = Instant::now();
    let mut client = Connection::new(Side::Client, Settings::default());
    let mut server = Connection::new(Side::Server, server_settings());
    pump(&mut client, &mut server, now, None);
    pump(&mut server, &mut client, now, None);
    let id = client
        .start_call("/t.S/M", 1, None, &Metadata::new(), now)
        .expect("starts");
    let seg = data(200 * 1024);
    let p = Payload::from_segments(vec![seg.clone(), seg]);
    match client.send_message(id, p, true) {
        Err(CallError::MessageTooLarge { size, limit }) => {
            assert_eq!((size, limit), (400 * 1024, 300 * 1024));
        }
        other => panic!("{other:?}"),
    }
    // A second message is refused while a split one is still going out (credit stall).
    client
        .send_message(id, Payload::from_segments(vec![data(100 * 1024)]), false)
        .expect("sent");
    assert_eq!(
        client.send_message(id, Bytes::from_static(b"x"), false),
        Err(CallError::WouldBlock)
    );
}
