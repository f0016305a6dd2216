//! Two engines back to back in memory: every call kind, concurrency, cancellation, flow
//! control, deadlines, go-away, limits and protocol errors, deterministically.

mod support;

use bytes::Bytes;
use bytestring::ByteString;
use std::time::Duration;
use support::{Dir, Pair};
use topspin_proto::frame::{CallFrame, Frame, MessageFrame};
use topspin_proto::{CallError, CallId, Code, ErrorCode, Event, Metadata, Settings, Status};

const RAW: u8 = 1;

fn md(k: &str, v: &str) -> Metadata {
    Metadata::builder().text(k, v).unwrap().build()
}

fn start(p: &mut Pair, method: &str) -> CallId {
    p.client
        .start_call(method, RAW, None, &Metadata::new(), p.now)
        .unwrap()
}

fn messages(events: &[Event], call: CallId) -> Vec<Bytes> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Message { id, message, .. } if *id == call => Some(message.clone()),
            _ => None,
        })
        .collect()
}

fn ended(events: &[Event], call: CallId) -> Option<Status> {
    events.iter().find_map(|e| match e {
        Event::Ended { id, status, .. } if *id == call => Some(status.clone()),
        _ => None,
    })
}

fn cancelled(events: &[Event], call: CallId) -> Option<Status> {
    events.iter().find_map(|e| match e {
        Event::Cancelled { id, status } if *id == call => Some(status.clone()),
        _ => None,
    })
}

#[test]
fn unary_call_with_headers_trailers_and_interning() {
    let mut p = Pair::default_pair();
    let id = p
        .client
        .start_call("/kv.Store/Get", 0, None, &md("user", "ann"), p.now)
        .unwrap();
    p.client
        .send_message(id, Bytes::from_static(b"key"), true)
        .unwrap();
    p.drive();
    let ev = p.take_server();
    assert!(
        matches!(&ev[0], Event::CallStarted { id: i, method, codec: 0, deadline: None, metadata, .. }
        if *i == id && &**method == "/kv.Store/Get" && metadata.get_str("user") == Some("ann"))
    );
    assert!(matches!(&ev[1], Event::Message { message, .. } if &message[..] == b"key"));
    assert_eq!(ev[2], Event::HalfClosed { id });
    assert_eq!(ev.len(), 3);

    p.server.send_headers(id, &md("server", "s1")).unwrap();
    p.server
        .send_message(id, Bytes::from_static(b"value"), false)
        .unwrap();
    let trailers = Metadata::builder()
        .binary("cost-bin", &[1, 2])
        .unwrap()
        .build();
    p.server.end_call(id, &Status::ok(), &trailers).unwrap();
    p.drive();
    let ev = p.take_client();
    assert!(
        matches!(&ev[0], Event::Headers { metadata, .. } if metadata.get_str("server") == Some("s1"))
    );
    assert_eq!(messages(&ev, id), vec![Bytes::from_static(b"value")]);
    assert!(
        matches!(&ev[2], Event::Ended { status, trailers: t, .. } if status.is_ok() && t.get("cost-bin") == Some(&[1u8, 2][..]))
    );
    assert_eq!(p.client.open_calls(), 0);
    assert_eq!(p.server.open_calls(), 0);

    // The second call to the same method uses the interned id: the name is not sent again.
    let before = p.bytes_to_server;
    let id2 = start(&mut p, "/kv.Store/Get");
    p.drive();
    let call_frame_len = p.bytes_to_server - before;
    assert_eq!(call_frame_len, 12 + 12 + 2, "CALL without name or metadata");
    assert!(
        matches!(&p.take_server()[0], Event::CallStarted { method, id, .. } if &**method == "/kv.Store/Get" && *id == id2)
    );
}

/// A call ended with a status that carries headers (`Status::with_headers`): HEADERS, then the
/// END, when the call sent no headers yet; the END alone when it did (HEADERS go once).
#[test]
fn a_failing_status_sends_its_headers_first_unless_headers_went() {
    let mut p = Pair::default_pair();
    let failing = || Status::unavailable("draining").with_headers(md("early", "yes"));
    let id = start(&mut p, "/kv.Store/Get");
    p.drive();
    p.take_server();
    p.server.end_call(id, &failing(), &Metadata::new()).unwrap();
    p.drive();
    let ev = p.take_client();
    assert!(
        matches!(&ev[0], Event::Headers { id: i, metadata } if *i == id && metadata.get_str("early") == Some("yes")),
        "{ev:?}"
    );
    assert!(
        matches!(&ev[1], Event::Ended { status, trailers, .. } if status.code() == Code::Unavailable && trailers.is_empty()),
        "{ev:?}"
    );
    assert_eq!(ev.len(), 2);

    let id = start(&mut p, "/kv.Store/Get");
    p.drive();
    p.take_server();
    p.server.send_headers(id, &md("first", "1")).unwrap();
    p.server.end_call(id, &failing(), &Metadata::new()).unwrap();
    p.drive();
    let ev = p.take_client();
    assert!(
        matches!(&ev[0], Event::Headers { metadata, .. } if metadata.get_str("first") == Some("1") && metadata.get_str("early").is_none()),
        "{ev:?}"
    );
    assert!(matches!(&ev[1], Event::Ended { .. }), "{ev:?}");
    assert_eq!(ev.len(), 2);
}

/// Calls to several methods in turn, repeating and alternating: each CALL names its own method
/// (the client checks the previous call's method first, then its table), and each is sent
/// by name only the first time.
#[test]
fn interning_alternating_methods_names_each_call_right() {
    let mut p = Pair::default_pair();
    let order = [
        "/a.S/X", "/a.S/X", "/a.S/Y", "/a.S/X", "/a.S/Z", "/a.S/Y", "/a.S/Y", "/a.S/Z",
    ];
    let mut seen = std::collections::HashSet::new();
    for method in order {
        let before = p.bytes_to_server;
        let id = start(&mut p, method);
        p.drive();
        let named = seen.insert(method);
        let name_len = if named { 2 + method.len() } else { 0 };
        assert_eq!(
            p.bytes_to_server - before,
            12 + 12 + name_len + 2,
            "{method}"
        );
        assert!(
            matches!(&p.take_server()[0], Event::CallStarted { method: m, id: i, .. } if &**m == method && *i == id),
            "{method}"
        );
    }
}

#[test]
fn server_streaming() {
    let mut p = Pair::default_pair();
    let id = start(&mut p, "/feed.Feed/Watch");
    p.client
        .send_message(id, Bytes::from_static(b"q"), true)
        .unwrap();
    p.drive();
    p.take_server();
    for i in 0..5u8 {
        p.server
            .send_message(id, Bytes::from(vec![i; 10]), false)
            .unwrap();
    }
    p.server
        .end_call(id, &Status::ok(), &Metadata::new())
        .unwrap();
    p.drive();
    let ev = p.take_client();
    let got = messages(&ev, id);
    assert_eq!(got.len(), 5);
    for (i, m) in got.iter().enumerate() {
        assert_eq!(&m[..], &[i as u8; 10][..]);
    }
    assert!(ended(&ev, id).unwrap().is_ok());
}

#[test]
fn client_streaming_with_half_close_frame() {
    let mut p = Pair::default_pair();
    let id = start(&mut p, "/up.Upload/Put");
    for i in 0..4u8 {
        p.client
            .send_message(id, Bytes::from(vec![i; 3]), false)
            .unwrap();
    }
    p.client.half_close(id).unwrap();
    assert!(matches!(
        p.client.half_close(id),
        Err(CallError::NotAllowed(_))
    ));
    assert!(matches!(
        p.client.send_message(id, Bytes::new(), false),
        Err(CallError::NotAllowed(_))
    ));
    p.drive();
    let ev = p.take_server();
    assert_eq!(messages(&ev, id).len(), 4);
    assert_eq!(ev.last(), Some(&Event::HalfClosed { id }));
    p.server
        .send_message(id, Bytes::from_static(b"4 parts"), false)
        .unwrap();
    p.server
        .end_call(id, &Status::ok(), &Metadata::new())
        .unwrap();
    p.drive();
    let ev = p.take_client();
    assert_eq!(messages(&ev, id), vec![Bytes::from_static(b"4 parts")]);
}

#[test]
fn bidirectional_interleaved() {
    let mut p = Pair::default_pair();
    let id = start(&mut p, "/chat.Chat/Talk");
    for round in 0..10u8 {
        p.client
            .send_message(id, Bytes::from(vec![round]), false)
            .unwrap();
        p.drive();
        let got = messages(&p.take_server(), id);
        assert_eq!(got, vec![Bytes::from(vec![round])]);
        p.server
            .send_message(id, Bytes::from(vec![round, round]), false)
            .unwrap();
        p.drive();
        assert_eq!(
            messages(&p.take_client(), id),
            vec![Bytes::from(vec![round, round])]
        );
    }
    p.client.half_close(id).unwrap();
    p.drive();
    assert_eq!(p.take_server(), vec![Event::HalfClosed { id }]);
    p.server
        .end_call(id, &Status::ok(), &Metadata::new())
        .unwrap();
    p.drive();
    assert!(ended(&p.take_client(), id).unwrap().is_ok());
}

#[test]
fn many_concurrent_calls_answered_in_any_order() {
    let mut p = Pair::default_pair();
    let ids: Vec<CallId> = (0..200)
        .map(|i| {
            let id = start(&mut p, if i % 2 == 0 { "/a.A/X" } else { "/a.A/Y" });
            p.client
                .send_message(id, Bytes::from(format!("req {i}")), true)
                .unwrap();
            id
        })
        .collect();
    p.drive();
    assert_eq!(p.server.open_calls(), 200);
    p.take_server();
    for (i, id) in ids.iter().enumerate().rev() {
        p.server
            .send_message(*id, Bytes::from(format!("resp {i}")), false)
            .unwrap();
        p.server
            .end_call(*id, &Status::ok(), &Metadata::new())
            .unwrap();
    }
    p.drive();
    let ev = p.take_client();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(messages(&ev, *id), vec![Bytes::from(format!("resp {i}"))]);
        assert!(ended(&ev, *id).unwrap().is_ok());
    }
}

#[test]
fn client_cancel_stops_server_and_crossing_frames_are_ignored() {
    let mut p = Pair::default_pair();
    let id = start(&mut p, "/s.S/Long");
    p.drive();
    p.take_server();
    // The server sends while the client cancels: both cross on the wire.
    p.server
        .send_message(id, Bytes::from_static(b"late"), false)
        .unwrap();
    p.client.cancel(id, Code::Cancelled).unwrap();
    p.drive();
    let sev = p.take_server();
    assert_eq!(cancelled(&sev, id).unwrap().code(), Code::Cancelled);
    assert!(p.take_client().is_empty(), "late message ignored, no event");
    assert_eq!(
        p.server.send_message(id, Bytes::new(), false),
        Err(CallError::NotOpen(id))
    );
    assert!(p.client_error.is_none() && p.server_error.is_none());
    // The connection is fine.
    let id2 = start(&mut p, "/s.S/Long");
    p.drive();
    assert!(matches!(&p.take_server()[0], Event::CallStarted { id, .. } if *id == id2));
}

#[test]
fn server_ends_call_early_and_crossing_client_frames_are_ignored() {
    let mut p = Pair::default_pair();
    let id = start(&mut p, "/s.S/Upload");
    p.drive();
    p.take_server();
    p.server
        .end_call(
            id,
            &Status::new(Code::PermissionDenied, "no uploads today"),
            &Metadata::new(),
        )
        .unwrap();
    p.client
        .send_message(id, Bytes::from_static(b"data"), false)
        .unwrap();
    p.drive();
    let st = ended(&p.take_client(), id).unwrap();
    assert_eq!(st.code(), Code::PermissionDenied);
    assert_eq!(st.message(), "no uploads today");
    assert!(p.take_server().is_empty());
    assert!(p.client_error.is_none() && p.server_error.is_none());
}

#[test]
fn flow_control_stalls_the_sender_and_resumes_on_credit() {
    let window = 1000u32;
    let client = Settings::default().with_initial_call_window(window);
    let mut p = Pair::new(client, Settings::default());
    let id = start(&mut p, "/f.F/Stream");
    p.client
        .send_message(id, Bytes::from_static(b"go"), true)
        .unwrap();
    p.drive();
    p.take_server();
    let msg = Bytes::from(vec![7u8; 88]); // 100 bytes on the wire
    let mut sent = 0;
    while p.server.send_message(id, msg.clone(), false).is_ok() {
        sent += 1;
    }
    assert_eq!(sent, 10, "1000 bytes of credit allow ten 100-byte frames");
    assert_eq!(p.server.send_credit(id), Some(0));
    assert_eq!(
        p.server.send_message(id, msg.clone(), false),
        Err(CallError::WouldBlock)
    );
    p.drive();
    let ev = p.take_client();
    let got: Vec<u32> = ev
        .iter()
        .filter_map(|e| match e {
            Event::Message { credit, .. } => Some(*credit),
            _ => None,
        })
        .collect();
    assert_eq!(got.len(), 10);
    // Nothing more moves until the client gives credit back.
    p.drive();
    assert!(p.take_server().is_empty());
    for c in &got[..4] {
        p.client.grant_credit(id, *c).unwrap(); // window not yet at half: batched
    }
    p.drive();
    assert!(
        p.take_server().is_empty(),
        "credit is batched until half the window is free"
    );
    for c in &got[4..] {
        p.client.grant_credit(id, *c).unwrap();
    }
    p.drive();
    assert_eq!(p.take_server(), vec![Event::Writable { id }]);
    assert_eq!(p.server.send_credit(id), Some(1000));
    p.server.send_message(id, msg, false).unwrap();
    p.server
        .end_call(id, &Status::ok(), &Metadata::new())
        .unwrap();
    p.drive();
    let ev = p.take_client();
    assert_eq!(messages(&ev, id).len(), 1);
    assert!(ended(&ev, id).unwrap().is_ok());
}

#[test]
fn flow_control_bounds_what_a_slow_reader_buffers() {
    // A server streaming 64 MiB to a client that reads slowly never has more than the window
    // plus one frame outstanding.
    let window = 64 * 1024;
    let client = Settings::default().with_initial_call_window(window);
    let mut p = Pair::new(client, Settings::default());
    let id = start(&mut p, "/f.F/Big");
    p.client.send_message(id, Bytes::new(), true).unwrap();
    p.drive();
    p.take_server();
    let chunk = Bytes::from(vec![1u8; 16 * 1024]);
    let mut delivered = 0usize;
    let mut sent = 0usize;
    while delivered < 64 << 20 {
        while sent < 64 << 20 && p.server.send_message(id, chunk.clone(), false).is_ok() {
            sent += chunk.len();
        }
        let outstanding = sent - delivered;
        assert!(
            outstanding <= window as usize + chunk.len() + 12,
            "{outstanding}"
        );
        p.drive();
        // The slow reader consumes one message per round.
        let ev = p.take_client();
        for e in ev {
            if let Event::Message {
                message, credit, ..
            } = e
            {
                delivered += message.len();
                p.client.grant_credit(id, credit).unwrap();
            }
        }
        p.drive();
        p.take_server();
    }
    assert_eq!(delivered, 64 << 20);
}

#[test]
fn split_messages_larger_than_frame_and_window_complete() {
    let small = Settings::default()
        .with_max_frame_size(16 * 1024)
        .with_initial_call_window(20_000);
    let mut p = Pair::new(small, small);
    let id = start(&mut p, "/b.B/Blob");
    let big: Bytes = (0..300_000u32)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    p.client.send_message(id, big.clone(), true).unwrap();
    assert!(matches!(
        p.client.send_message(id, Bytes::new(), false),
        Err(CallError::NotAllowed(_))
    ));
    p.drive();
    let ev = p.take_server();
    assert_eq!(messages(&ev, id), vec![big.clone()]);
    assert_eq!(ev.last(), Some(&Event::HalfClosed { id }));
    // And back, with the server waiting for Writable before it ends the call.
    p.server.send_message(id, big.clone(), false).unwrap();
    let r = p.server.end_call(id, &Status::ok(), &Metadata::new());
    assert_eq!(r, Err(CallError::WouldBlock));
    p.drive();
    assert!(p.take_server().contains(&Event::Writable { id }));
    p.server
        .end_call(id, &Status::ok(), &Metadata::new())
        .unwrap();
    p.drive();
    let ev = p.take_client();
    assert_eq!(messages(&ev, id), vec![big]);
    assert!(ended(&ev, id).unwrap().is_ok());
    assert!(p.client_error.is_none() && p.server_error.is_none());
}

#[test]
fn deadlines_expire_on_both_sides() {
    let mut p = Pair::default_pair();
    let id = p
        .client
        .start_call(
            "/d.D/Slow",
            RAW,
            Some(Duration::from_millis(100)),
            &Metadata::new(),
            p.now,
        )
        .unwrap();
    let other = start(&mut p, "/d.D/Slow");
    p.drive();
    let ev = p.take_server();
    let deadline = ev.iter().find_map(|e| match e {
        Event::CallStarted {
            id: i, deadline, ..
        } if *i == id => *deadline,
        _ => None,
    });
    assert_eq!(deadline, Some(p.now + Duration::from_millis(100)));
    assert_eq!(
        p.client.poll_timeout(),
        Some(p.now + Duration::from_millis(100))
    );
    p.advance(Duration::from_millis(99));
    assert!(p.take_client().is_empty() && p.take_server().is_empty());
    p.advance(Duration::from_millis(1));
    let cev = p.take_client();
    let sev = p.take_server();
    assert_eq!(ended(&cev, id).unwrap().code(), Code::DeadlineExceeded);
    assert_eq!(cancelled(&sev, id).unwrap().code(), Code::DeadlineExceeded);
    assert_eq!(
        cev.len(),
        1,
        "the server's END crossed the client's CANCEL and was ignored"
    );
    assert_eq!(sev.len(), 1);
    // The call without a deadline is unaffected.
    assert_eq!(p.client.open_calls(), 1);
    p.server
        .end_call(other, &Status::ok(), &Metadata::new())
        .unwrap();
    p.drive();
    assert!(ended(&p.take_client(), other).unwrap().is_ok());
}

#[test]
fn go_away_lets_calls_in_flight_finish_and_refuses_later_ones() {
    let mut p = Pair::default_pair();
    let a = start(&mut p, "/g.G/M");
    let b = start(&mut p, "/g.G/M");
    p.drive();
    p.take_server();
    p.server.go_away(ErrorCode::NO_ERROR, "restarting");
    // A call the client starts before it hears of the go-away.
    let late = start(&mut p, "/g.G/M");
    p.client
        .send_message(late, Bytes::from_static(b"x"), true)
        .unwrap();
    p.step(Dir::ToServer);
    assert!(
        p.take_server().is_empty(),
        "call above last_call_id is not processed"
    );
    p.step(Dir::ToClient);
    let ev = p.take_client();
    let st = ended(&ev, late).unwrap();
    assert_eq!(st.code(), Code::Unavailable);
    assert!(st.message().contains("safe to retry"), "{st}");
    assert!(ev
        .iter()
        .any(|e| matches!(e, Event::GoAway { last_call_id, .. } if *last_call_id == b)));
    assert_eq!(
        p.client
            .start_call("/g.G/M", RAW, None, &Metadata::new(), p.now),
        Err(CallError::GoingAway)
    );
    assert!(!p.server.is_drained());
    for id in [a, b] {
        p.server
            .send_message(id, Bytes::from_static(b"done"), false)
            .unwrap();
        p.server
            .end_call(id, &Status::ok(), &Metadata::new())
            .unwrap();
    }
    p.drive();
    let ev = p.take_client();
    assert!(ended(&ev, a).unwrap().is_ok() && ended(&ev, b).unwrap().is_ok());
    assert!(p.server.is_drained() && p.client.is_drained());
    assert!(p.client_error.is_none() && p.server_error.is_none());
}

#[test]
fn call_errors_end_one_call_and_keep_the_connection() {
    let server = Settings::default()
        .with_max_message_size(1000)
        .with_max_metadata_size(64)
        .with_max_concurrent_calls(2);
    let client = Settings::default().with_max_message_size(500);
    let mut p = Pair::new(client, server);
    // Sender-side checks know the peer's limits.
    let id = start(&mut p, "/l.L/M");
    assert_eq!(
        p.client.send_message(id, Bytes::from(vec![0; 1001]), true),
        Err(CallError::MessageTooLarge {
            size: 1001,
            limit: 1000
        })
    );
    let big_md = md("k", &"v".repeat(100));
    assert!(matches!(
        p.client.start_call("/l.L/M", RAW, None, &big_md, p.now),
        Err(CallError::MetadataTooLarge { .. })
    ));
    let _second = start(&mut p, "/l.L/M");
    assert_eq!(
        p.client
            .start_call("/l.L/M", RAW, None, &Metadata::new(), p.now),
        Err(CallError::TooManyCalls { limit: 2 })
    );
    p.drive();
    p.take_server();
    // The server, too, will not send more than the client accepts.
    assert_eq!(
        p.server.send_message(id, Bytes::from(vec![0; 600]), false),
        Err(CallError::MessageTooLarge {
            size: 600,
            limit: 500
        })
    );
    // A server that sends it anyway: the client cancels and reports it.
    p.inject(Dir::ToClient, &raw(600, 0x03, 0, id.0, &[0; 600]))
        .unwrap();
    p.drive();
    let st = ended(&p.take_client(), id).unwrap();
    assert_eq!(st.code(), Code::ResourceExhausted);
    assert!(st.message().contains("max_message_size"), "{st}");
    let sev = p.take_server();
    assert_eq!(cancelled(&sev, id).unwrap().code(), Code::ResourceExhausted);
    assert!(p.client_error.is_none() && p.server_error.is_none());
}

#[test]
fn server_enforces_limits_against_a_client_that_ignores_them() {
    let server = Settings::default()
        .with_max_message_size(100)
        .with_max_metadata_size(16)
        .with_max_concurrent_calls(1);
    let mut p = Pair::new(Settings::default(), server);
    let call = |id: u32, metadata: Metadata| {
        Frame::Call(CallFrame {
            call_id: CallId(id),
            method_id: 0,
            method_name: Some(ByteString::from_static("/l.L/M")),
            codec: RAW,
            timeout_us: 0,
            metadata,
        })
        .to_bytes()
    };
    let message = |id: u32, n: usize| {
        Frame::Message(MessageFrame {
            call_id: CallId(id),
            end_stream: true,
            total_len: None,
            chunk: Bytes::from(vec![1; n]),
        })
        .to_bytes()
    };
    // Metadata over the limit.
    p.inject(Dir::ToServer, &call(1, md("key", &"x".repeat(40))))
        .unwrap();
    // A message over the limit.
    p.inject(Dir::ToServer, &call(2, Metadata::new())).unwrap();
    p.inject(Dir::ToServer, &message(2, 101)).unwrap();
    // Too many calls: 3 is open, 4 is refused.
    p.inject(Dir::ToServer, &call(3, Metadata::new())).unwrap();
    p.inject(Dir::ToServer, &call(4, Metadata::new())).unwrap();
    p.inject(Dir::ToServer, &message(4, 1)).unwrap(); // frames of a refused call are ignored
    let sev = p.take_server();
    assert_eq!(
        cancelled(&sev, CallId(2)).unwrap().code(),
        Code::ResourceExhausted
    );
    assert_eq!(
        sev.iter()
            .filter(|e| matches!(e, Event::CallStarted { .. }))
            .count(),
        2
    );
    let mut ends = Vec::new();
    while let Some(b) = p.server.poll_transmit() {
        let mut buf = bytes::BytesMut::from(&b[..]);
        let mut dec = topspin_proto::frame::FrameDecoder::new(1 << 24);
        while let Some(f) = dec.decode(&mut buf).unwrap() {
            if let Frame::End(e) = f {
                ends.push((e.call_id.0, e.code, e.message.to_string()));
            }
        }
    }
    assert_eq!(ends.len(), 3, "{ends:?}");
    assert_eq!((ends[0].0, ends[0].1), (1, Code::ResourceExhausted));
    assert!(ends[0].2.contains("max_metadata_size"));
    assert_eq!((ends[1].0, ends[1].1), (2, Code::ResourceExhausted));
    assert!(ends[1].2.contains("max_message_size"));
    assert_eq!((ends[2].0, ends[2].1), (4, Code::ResourceExhausted));
    assert!(ends[2].2.contains("max_concurrent_calls"));
    assert!(p.server_error.is_none());
    assert_eq!(p.server.open_calls(), 1);
}

#[test]
fn ping_pong() {
    let mut p = Pair::default_pair();
    p.client.ping(*b"rtt-0001");
    p.drive();
    assert_eq!(p.take_client(), vec![Event::Pong { data: *b"rtt-0001" }]);
    assert!(p.take_server().is_empty());
}

#[test]
fn eof_fails_open_calls_as_unavailable() {
    let mut p = Pair::default_pair();
    let id = start(&mut p, "/e.E/M");
    p.drive();
    p.client.handle_eof();
    let ev = p.take_client();
    assert_eq!(ended(&ev, id).unwrap().code(), Code::Unavailable);
    assert_eq!(ev.last(), Some(&Event::Closed { error: None }));
    assert_eq!(
        p.client
            .start_call("/e.E/M", RAW, None, &Metadata::new(), p.now),
        Err(CallError::Closed)
    );
}

/// Feeds `bytes` to a fresh established server (or client) and returns the error it reports,
/// after checking the peer is told with an ERROR frame and every open call fails.
fn protocol_error(to: Dir, bytes: &[u8]) -> ErrorCode {
    let mut p = Pair::default_pair();
    let open = start(&mut p, "/p.P/Open");
    p.drive();
    p.take_server();
    let err = p.inject(to, bytes).unwrap_err();
    match to {
        Dir::ToServer => {
            assert_eq!(
                cancelled(&p.take_server(), open).unwrap().code(),
                Code::Unavailable
            );
            assert!(p.server.is_closed());
            p.step(Dir::ToClient);
            let ev = p.take_client();
            assert_eq!(ended(&ev, open).unwrap().code(), Code::Unavailable);
            assert!(
                matches!(ev.last(), Some(Event::Closed { error: Some(e) }) if e.code == err.code),
                "{ev:?}"
            );
        }
        Dir::ToClient => {
            assert_eq!(
                ended(&p.take_client(), open).unwrap().code(),
                Code::Unavailable
            );
            if err.reason.starts_with("the peer closed") {
                // An ERROR received is not answered with another.
                assert!(p.client.poll_transmit().is_none());
                return err.code;
            }
            p.step(Dir::ToServer);
            let ev = p.take_server();
            assert!(
                matches!(ev.last(), Some(Event::Closed { error: Some(e) }) if e.code == err.code),
                "{ev:?} {err}"
            );
        }
    }
    assert!(!err.reason.is_empty());
    err.code
}

fn raw(len: u32, ty: u8, flags: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&[ty, flags, 0, 0]);
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(payload);
    v
}

#[test]
fn every_protocol_error_closes_the_connection_with_its_code() {
    let call_named = |id: u32, mid: u16| {
        let mut pl = Vec::new();
        pl.extend_from_slice(&mid.to_le_bytes());
        pl.extend_from_slice(&[RAW, 0]);
        pl.extend_from_slice(&0u64.to_le_bytes());
        pl.extend_from_slice(&3u16.to_le_bytes());
        pl.extend_from_slice(b"/x/");
        pl.extend_from_slice(&[0, 0]);
        raw(pl.len() as u32, 0x02, 1, id, &pl)
    };
    let cases: Vec<(Dir, Vec<u8>, ErrorCode)> = vec![
        (
            Dir::ToServer,
            raw(0, 0x01, 0, 0, &[]),
            ErrorCode::SETTINGS_ERROR,
        ),
        (
            Dir::ToServer,
            raw(u32::MAX, 0x03, 0, 1, &[]),
            ErrorCode::FRAME_TOO_LARGE,
        ),
        (
            Dir::ToServer,
            raw(0, 0x0d, 0, 0, &[]),
            ErrorCode::UNKNOWN_FRAME_TYPE,
        ),
        (
            Dir::ToServer,
            raw(3, 0x09, 0, 1, &[1, 0, 0]),
            ErrorCode::MALFORMED_FRAME,
        ),
        (
            Dir::ToServer,
            raw(6, 0x07, 0, 1, &[0; 6]),
            ErrorCode::ILLEGAL_FRAME,
        ),
        (Dir::ToClient, call_named(5, 0), ErrorCode::ILLEGAL_FRAME),
        (
            Dir::ToClient,
            raw(0, 0x03, 1, 1, &[]),
            ErrorCode::ILLEGAL_FRAME,
        ),
        (
            Dir::ToServer,
            raw(0, 0x03, 0, 99, &[]),
            ErrorCode::UNKNOWN_CALL,
        ),
        (
            Dir::ToClient,
            raw(0, 0x03, 0, 99, &[]),
            ErrorCode::UNKNOWN_CALL,
        ),
        (Dir::ToServer, call_named(1, 0), ErrorCode::DUPLICATE_CALL),
        (Dir::ToServer, call_named(9, 1), ErrorCode::METHOD_ID_ERROR), // id 1 already bound to /p.P/Open
        (
            Dir::ToServer,
            raw(4, 0x09, 0, 1, &0x7fff_ffffu32.to_le_bytes()),
            ErrorCode::FLOW_CONTROL,
        ),
        (
            Dir::ToServer,
            raw(0, 0x04, 0, 1, &[]),
            ErrorCode::MESSAGE_LENGTH_MISMATCH,
        ),
        (
            Dir::ToServer,
            raw(6, 0x03, 2, 1, &[2, 0, 0, 0, 1, 2]),
            ErrorCode::MESSAGE_LENGTH_MISMATCH,
        ),
        (
            Dir::ToClient,
            raw(6, 0x0c, 0, 0, &[13, 0, 2, 0, b'h', b'i']),
            ErrorCode::TIMEOUT,
        ),
    ];
    for (dir, bytes, want) in cases {
        assert_eq!(protocol_error(dir, &bytes), want, "{bytes:02x?}");
    }
}

#[test]
fn handshake_errors() {
    use topspin_proto::{Connection, Side};
    let now = std::time::Instant::now();
    for (bytes, want) in [
        (&b"GET / HTTP/1.1\r\n"[..], ErrorCode::BAD_PREFACE),
        (&b"TOPSPIN\x02"[..], ErrorCode::UNSUPPORTED_VERSION),
        (
            &b"TOPSPIN\x01\x08\x00\x00\x00\x0a\x00\x00\x00\x00\x00\x00\x0012345678"[..],
            ErrorCode::SETTINGS_ERROR,
        ),
    ] {
        let mut s = Connection::new(Side::Server, Settings::default());
        let mut buf = bytes::BytesMut::from(bytes);
        assert_eq!(s.handle_input(&mut buf, now).unwrap_err().code, want);
        assert!(s.is_closed());
        // It still tells the peer, after its own preface and settings.
        let mut out = Vec::new();
        while let Some(b) = s.poll_transmit() {
            out.extend_from_slice(&b);
        }
        assert_eq!(&out[..8], b"TOPSPIN\x01");
        assert_eq!(out[8 + 12 + 30 + 4], 0x0c, "ERROR frame follows SETTINGS");
    }
}

#[test]
fn flow_control_violation_by_a_sender_without_credit() {
    let client = Settings::default().with_initial_call_window(100);
    let mut p = Pair::new(client, Settings::default());
    let id = start(&mut p, "/f.F/M");
    p.drive();
    p.take_server();
    // The server's first frame overdraws (allowed); a second one has no credit.
    let frame = raw(200, 0x03, 0, id.0, &[0; 200]);
    p.inject(Dir::ToClient, &frame).unwrap();
    let err = p.inject(Dir::ToClient, &frame).unwrap_err();
    assert_eq!(err.code, ErrorCode::FLOW_CONTROL);
}

/// Regression: with the smallest legal `max_frame_size` and a `max_metadata_size` as large, a
/// status, response headers or request metadata at the metadata limit made a frame over the
/// frame limit, and the peer closed the whole connection (FRAME_TOO_LARGE). Every frame an
/// engine sends now fits the peer's limits (protocol.md §9).
#[test]
fn metadata_at_the_limit_never_makes_a_frame_over_the_peers_frame_limit() {
    let small = Settings::default()
        .with_max_frame_size(16384)
        .with_max_metadata_size(16384);
    let mut p = Pair::new(small, small);
    // A metadata block of exactly `size` bytes (one text entry).
    let block = |size: usize| md("k", &"v".repeat(size - 6));
    assert_eq!(block(16384).encoded_len(), 16384);

    // END: a status at the metadata limit (2 msg_len + message + trailers = 16,384).
    let id = start(&mut p, "/t.S/End");
    p.client
        .send_message(id, Bytes::from_static(b"x"), true)
        .unwrap();
    p.drive();
    let trailers = block(16384 - 2);
    p.server
        .end_call(id, &Status::new(Code::NotFound, ""), &trailers)
        .unwrap();
    p.drive();
    assert!(p.client_error.is_none(), "{:?}", p.client_error);
    let st = ended(&p.take_client(), id).expect("the call ended");
    assert_eq!(st.code(), Code::NotFound, "the code survives: {st:?}");

    // HEADERS at the metadata limit: refused locally, nothing over the frame limit is sent.
    let id = start(&mut p, "/t.S/Headers");
    p.client
        .send_message(id, Bytes::from_static(b"x"), true)
        .unwrap();
    p.drive();
    match p.server.send_headers(id, &block(16384)) {
        Err(CallError::MetadataTooLarge { limit, .. }) => assert!(limit <= 16384),
        Ok(()) => {}
        Err(e) => panic!("{e}"),
    }
    p.server
        .end_call(id, &Status::ok(), &Metadata::new())
        .unwrap();
    p.drive();
    assert!(p.client_error.is_none(), "{:?}", p.client_error);

    // CALL: request metadata at the limit plus a method name would pass the frame limit.
    let err = p
        .client
        .start_call("/t.S/Call", RAW, None, &block(16384), p.now)
        .unwrap_err();
    assert!(
        matches!(err, CallError::MetadataTooLarge { limit, .. } if (limit as usize) + 12 + 2 + 9 <= 16384),
        "{err}"
    );
    p.drive();
    assert!(p.server_error.is_none() && p.client_error.is_none());
    // And the connection is still good.
    let id = start(&mut p, "/t.S/After");
    p.client
        .send_message(id, Bytes::from_static(b"x"), true)
        .unwrap();
    p.drive();
    p.server
        .end_call(id, &Status::ok(), &Metadata::new())
        .unwrap();
    p.drive();
    assert!(ended(&p.take_client(), id).is_some_and(|s| s.is_ok()));
}
