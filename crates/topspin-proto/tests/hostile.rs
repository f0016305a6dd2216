//! Hostile peers against the engine, two engines back to back in memory (tests/pair.rs style):
//! what a peer can make a connection reserve, hold or do, and the decisions of the hostile-peers
//! issue (protocol.md §7, §9).

mod support;

use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use support::{Dir, Pair};
use topspin_proto::{
    CallError, CallId, Code, Connection, ErrorCode, Event, Limits, MemoryBudget, Metadata, Rate,
    Settings, Side, Status,
};

const RAW: u8 = 1;
const MIB: usize = 1 << 20;

fn start(p: &mut Pair, method: &str) -> CallId {
    p.client
        .start_call(method, RAW, None, &Metadata::new(), p.now)
        .unwrap()
}

fn raw(ty: u8, flags: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(&[ty, flags, 0, 0]);
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// A CALL without name binding (method id 0, NAMED), no deadline, no metadata.
fn call(id: u32) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&0u16.to_le_bytes()); // method_id
    p.extend_from_slice(&[RAW, 0]);
    p.extend_from_slice(&0u64.to_le_bytes());
    p.extend_from_slice(&6u16.to_le_bytes());
    p.extend_from_slice(b"/p.S/M");
    p.extend_from_slice(&0u16.to_le_bytes());
    raw(0x02, 0x01, id, &p)
}

/// The first chunk of a split message announcing `total` bytes.
fn split_start(id: u32, total: u32, chunk: &[u8]) -> Vec<u8> {
    let mut p = total.to_le_bytes().to_vec();
    p.extend_from_slice(chunk);
    raw(0x03, 0x02, id, &p)
}

fn ended(events: &[Event], call: CallId) -> Option<Status> {
    events.iter().find_map(|e| match e {
        Event::Ended { id, status, .. } if *id == call => Some(status.clone()),
        _ => None,
    })
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

/// A server engine that has seen a client's preface and SETTINGS, sharing `budget`.
fn server(budget: &Arc<MemoryBudget>) -> (Connection, bytes::BytesMut, std::time::Instant) {
    server_with(Settings::default(), budget)
}

fn server_with(
    settings: Settings,
    budget: &Arc<MemoryBudget>,
) -> (Connection, bytes::BytesMut, std::time::Instant) {
    let mut s = Connection::new(Side::Server, settings);
    s.set_memory_budget(budget.clone());
    let now = std::time::Instant::now();
    let mut wire = bytes::BytesMut::from(&topspin_proto::preface::PREFACE[..]);
    wire.extend_from_slice(&raw(0x01, 0, 0, &[]));
    s.handle_input(&mut wire, now).unwrap();
    (s, wire, now)
}

/// Regression (spec-review row 2): the engine reserved `total_len` up front, so 1000 calls each
/// announcing a 63 MiB message with a 1-byte chunk made it reserve 63 GB. Now it holds about
/// what arrived, and gives it all back when the calls end or the connection goes.
#[test]
fn split_messages_reserve_only_what_arrived() {
    let budget = MemoryBudget::unlimited();
    let (mut s, mut wire, now) = server(&budget);
    for id in 1..=1000u32 {
        wire.extend_from_slice(&call(id));
        wire.extend_from_slice(&split_start(id, 63 * MIB as u32, b"x"));
    }
    s.handle_input(&mut wire, now).unwrap();
    assert_eq!(s.open_calls(), 1000);
    assert!(
        budget.used() <= 4 * 1024,
        "1000 one-byte chunks reserved {} bytes",
        budget.used()
    );
    for id in 1..=500u32 {
        wire.extend_from_slice(&raw(0x08, 0, id, &1u16.to_le_bytes())); // CANCEL
    }
    s.handle_input(&mut wire, now).unwrap();
    assert!(budget.used() <= 2 * 1024);
    drop(s); // the Connection gives back the rest
    assert_eq!(budget.used(), 0);
}

/// A split message's buffer never holds more than twice what arrived, nor more than its total.
#[test]
fn a_split_message_grows_as_its_chunks_arrive() {
    let budget = MemoryBudget::unlimited();
    let (mut s, mut wire, now) = server(&budget);
    wire.extend_from_slice(&call(1));
    wire.extend_from_slice(&split_start(1, 100_000, &[7; 1000]));
    s.handle_input(&mut wire, now).unwrap();
    assert!(budget.used() <= 2000, "{}", budget.used());
    let mut arrived = 1000;
    while arrived < 100_000 {
        let n = (100_000 - arrived).min(9_000);
        wire.extend_from_slice(&raw(0x04, 0, 1, &vec![7; n]));
        s.handle_input(&mut wire, now).unwrap();
        arrived += n;
        if arrived < 100_000 {
            assert!(
                budget.used() <= 2 * arrived,
                "{} for {arrived}",
                budget.used()
            );
        }
    }
    let ev: Vec<Event> = std::iter::from_fn(|| s.poll_event()).collect();
    let got = messages(&ev, CallId(1));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].len(), 100_000);
    assert_eq!(budget.used(), 0, "a complete message is no longer charged");
}

/// While the shared budget is spent, a new call is refused with RESOURCE_EXHAUSTED; once the
/// budget has room again, calls are accepted.
#[test]
fn a_spent_budget_refuses_new_calls_and_recovers() {
    let budget = MemoryBudget::new(MIB);
    let mut p = Pair::default_pair();
    p.server.set_memory_budget(budget.clone());
    assert!(budget.try_reserve(MIB)); // other connections hold it all
    let id = start(&mut p, "/p.S/M");
    p.drive();
    let st = ended(&p.take_client(), id).expect("refused");
    assert_eq!(st.code(), Code::ResourceExhausted);
    assert!(
        st.message()
            .contains("process memory budget for incoming messages exhausted (1048576 bytes)"),
        "{st:?}"
    );
    assert!(p.take_server().is_empty());
    budget.release(MIB);
    let id = start(&mut p, "/p.S/M");
    p.client
        .send_message(id, Bytes::from_static(b"hi"), true)
        .unwrap();
    p.drive();
    assert!(matches!(p.take_server()[0], Event::CallStarted { .. }));
}

/// Two split messages that together exceed the budget: chunk credit is withheld while it is
/// spent, one message per connection goes on regardless, and when it completes the other gets
/// its withheld credit (via handle_timeout), so nothing waits for ever.
#[test]
fn withheld_chunk_credit_is_granted_again() {
    let budget = MemoryBudget::new(300 * 1024);
    let small = Settings::default()
        .with_max_frame_size(16 * 1024)
        .with_initial_call_window(64 * 1024);
    let mut p = Pair::new(small, small);
    p.server.set_memory_budget(budget.clone());
    let a = start(&mut p, "/p.S/A");
    let b = start(&mut p, "/p.S/B");
    let big = Bytes::from(vec![1u8; MIB]);
    for id in [a, b] {
        match p.client.send_message(id, big.clone(), true) {
            Ok(()) | Err(CallError::WouldBlock) => {}
            Err(e) => panic!("{e}"),
        }
    }
    p.drive();
    // A went on while the budget was spent and completed; B's chunk credit was withheld and
    // waits for the engine's recheck.
    let mut ev = p.take_server();
    assert_eq!(messages(&ev, a).len(), 1, "message A never completed");
    assert!(messages(&ev, b).is_empty(), "the test must make B wait");
    assert!(p.server.poll_timeout().is_some(), "a recheck is due");
    for _ in 0..1000 {
        let Some(t) = p.server.poll_timeout() else {
            break;
        };
        p.now = p.now.max(t);
        p.server.handle_timeout(p.now);
        p.drive();
        // A client whose credit came back resumes its split message by itself.
    }
    ev.extend(p.take_server());
    assert_eq!(messages(&ev, b).len(), 1, "message B never completed");
    assert_eq!(budget.used(), 0);
    assert!(p.server.poll_timeout().is_none());
}

/// Attacked from outside: one connection uploaded 20 split messages announcing 60 MiB each
/// (681 MiB sent), spent the whole process budget and then went quiet, and every other
/// connection's new calls were refused `RESOURCE_EXHAUSTED` for as long as it stayed open.
/// Now a connection holds at most its share of the budget (1/8) in incomplete messages, plus
/// the one message that always goes on; the rest of its messages wait for credit, and other
/// connections' calls are served.
#[test]
fn one_connection_holds_at_most_its_share_of_the_budget() {
    let budget = MemoryBudget::new(16 * MIB);
    let share = 16 * MIB / topspin_proto::SHARE_OF_BUDGET;
    let small = Settings::default()
        .with_max_frame_size(16 * 1024)
        .with_initial_call_window(64 * 1024);
    let mut p = Pair::new(small, small);
    p.server.set_memory_budget(budget.clone());
    let big = Bytes::from(vec![1u8; 4 * MIB]);
    let ids: Vec<CallId> = (0..20).map(|_| start(&mut p, "/p.S/Upload")).collect();
    for &id in &ids {
        match p.client.send_message(id, big.clone(), false) {
            Ok(()) | Err(CallError::WouldBlock) => {}
            Err(e) => panic!("{e}"),
        }
    }
    p.drive();
    // The one message that goes on may complete (and is then no longer charged); the others
    // hold what arrived up to the share, each at most twice its arrived bytes.
    let held = budget.used();
    assert!(
        held <= share + 4 * MIB + 20 * 2 * 64 * 1024,
        "one connection holds {held} bytes of a {} budget",
        budget.limit()
    );
    assert!(!budget.is_spent());
    // Another connection of the process starts a call: served, not RESOURCE_EXHAUSTED.
    let mut q = Pair::default_pair();
    q.server.set_memory_budget(budget.clone());
    let id = start(&mut q, "/p.S/M");
    q.client
        .send_message(id, Bytes::from_static(b"hi"), true)
        .unwrap();
    q.drive();
    assert!(
        matches!(q.take_server().first(), Some(Event::CallStarted { .. })),
        "another connection's call was refused"
    );
    // Given time (the engine's rechecks), every message of the first connection completes.
    let mut ev = p.take_server();
    for _ in 0..10_000 {
        let Some(t) = p.server.poll_timeout() else {
            break;
        };
        p.now = p.now.max(t);
        p.server.handle_timeout(p.now);
        p.drive();
        ev.extend(p.take_server());
    }
    for &id in &ids {
        assert_eq!(messages(&ev, id).len(), 1, "a message never completed");
    }
}

/// A split message that stops arriving (its first chunk, then nothing while its credit is
/// open) closes the connection with TIMEOUT after `message_timeout`, and its buffer goes back
/// to the budget. Time while this side withholds every open message's credit does not count,
/// but one message per connection always has credit (protocol.md §9), so a spent budget does
/// not shelter a peer that stops. Found from outside: 20 such messages were held for as long as
/// the peer kept its connection.
#[test]
fn a_split_message_that_stops_arriving_is_cut_at_the_message_timeout() {
    let budget = MemoryBudget::new(64 * MIB);
    let (mut s, mut wire, t0) = server(&budget);
    s.set_limits(Limits::default().with_message_timeout(Some(Duration::from_secs(1))));
    wire.extend_from_slice(&call(1));
    wire.extend_from_slice(&split_start(1, MIB as u32, &[7; 100]));
    s.handle_input(&mut wire, t0).unwrap();
    assert!(budget.used() > 0);
    let due = s.poll_timeout().expect("a timer for the stalled message");
    assert!(due <= t0 + Duration::from_secs(1));
    s.handle_timeout(t0 + Duration::from_millis(999));
    assert!(!s.is_closed(), "cut early");
    s.handle_timeout(t0 + Duration::from_secs(1));
    assert!(s.is_closed(), "not cut at the message timeout");
    drop(s);
    assert_eq!(budget.used(), 0);

    // With the budget spent (by others), one message per connection still has credit: a peer
    // that stops sending it is cut too, so a spent budget or share cannot shelter it.
    let budget = MemoryBudget::new(64 * MIB);
    let (mut s, mut wire, t0) =
        server_with(Settings::default().with_initial_call_window(1000), &budget);
    s.set_limits(Limits::default().with_message_timeout(Some(Duration::from_secs(1))));
    wire.extend_from_slice(&call(1));
    wire.extend_from_slice(&split_start(1, MIB as u32, &[7; 980])); // 4 bytes of window left
    s.handle_input(&mut wire, t0).unwrap();
    assert!(budget.try_reserve(budget.limit() - budget.used()));
    wire.extend_from_slice(&raw(0x04, 0, 1, &[7; 100])); // overdraws; goes on regardless
    s.handle_input(&mut wire, t0).unwrap();
    s.handle_timeout(t0 + Duration::from_millis(500));
    assert!(!s.is_closed(), "cut early");
    s.handle_timeout(t0 + Duration::from_secs(1));
    assert!(
        s.is_closed(),
        "the message that goes on was not cut when it stopped"
    );
}

/// spec-review row 13: credit granted for a split message's chunks as they arrive is not
/// granted again when the application consumes the message: afterwards the sender's credit is
/// back to the window, never above.
#[test]
fn chunk_credit_is_not_granted_twice() {
    let s = Settings::default()
        .with_max_frame_size(16 * 1024)
        .with_initial_call_window(32 * 1024);
    let mut p = Pair::new(s, s);
    let id = start(&mut p, "/p.S/M");
    p.client
        .send_message(id, Bytes::from(vec![0u8; 200_000]), false)
        .unwrap();
    p.drive();
    let ev = p.take_server();
    let credit = ev
        .iter()
        .find_map(|e| match e {
            Event::Message { credit, .. } => Some(*credit),
            _ => None,
        })
        .expect("the message arrived");
    p.server.grant_credit(id, credit).unwrap();
    p.drive();
    let left = p.client.send_credit(id).unwrap();
    assert!(left <= 32 * 1024, "the sender got {left} bytes of credit");
    assert!(left > 0);
}

/// Regression (spec-review row 1): with INITIAL_CALL_WINDOW 0 on both sides, nothing granted
/// the first credit, so no message could ever be sent. The receiver now grants it when the
/// call starts, and the sender waits (WouldBlock, then Writable) instead of failing.
#[test]
fn window_zero_calls_complete() {
    let zero = Settings::default().with_initial_call_window(0);
    let mut p = Pair::new(zero, zero);
    for round in 0..3u8 {
        let id = start(&mut p, "/p.S/Echo");
        assert_eq!(
            p.client
                .send_message(id, Bytes::from(vec![round; 10]), true),
            Err(CallError::WouldBlock),
            "no credit before the server's first grant"
        );
        p.drive();
        assert!(p.take_client().contains(&Event::Writable { id }));
        p.client
            .send_message(id, Bytes::from(vec![round; 10]), true)
            .unwrap();
        p.drive();
        let ev = p.take_server();
        let got = messages(&ev, id);
        assert_eq!(got.len(), 1);
        // Three replies: the first uses the client's first grant, the rest wait for credit
        // the client gives back as it consumes.
        for i in 0..3 {
            let r = p.server.send_message(id, got[0].clone(), false);
            if i > 0 {
                assert_eq!(r, Err(CallError::WouldBlock));
                p.drive();
                let ev = p.take_client();
                for m in ev.iter() {
                    if let Event::Message { credit, .. } = m {
                        p.client.grant_credit(id, *credit).unwrap();
                    }
                }
                p.drive();
                assert!(p.take_server().contains(&Event::Writable { id }));
                p.server.send_message(id, got[0].clone(), false).unwrap();
            } else {
                r.unwrap();
            }
        }
        p.server
            .end_call(id, &Status::ok(), &Metadata::new())
            .unwrap();
        p.drive();
        let ev = p.take_client();
        assert!(ended(&ev, id).unwrap().is_ok());
    }
}

/// PINGs at a keep-alive pace stay within the default rate for ever; a flood is closed with
/// GOAWAY and ERROR ENHANCE_YOUR_CALM, and answers never pile up meanwhile.
#[test]
fn ping_rate_allows_keepalive_and_closes_a_flood() {
    let mut p = Pair::default_pair();
    for i in 0..200u64 {
        p.now += Duration::from_millis(100);
        p.client.ping(i.to_le_bytes());
        p.drive();
    }
    assert!(!p.server.is_closed());
    assert_eq!(p.take_client().len(), 200, "every keep-alive PING answered");

    let mut flood = Vec::new();
    for i in 0..100u64 {
        flood.extend_from_slice(&raw(0x0A, 0, 0, &i.to_le_bytes()));
    }
    let err = p.inject(Dir::ToServer, &flood).unwrap_err();
    assert_eq!(err.code, ErrorCode::ENHANCE_YOUR_CALM);
    assert!(err.reason.contains("too_many_pings"), "{err}");
    let mut acks = 0;
    let mut wire = bytes::BytesMut::new();
    while let Some(b) = p.server.poll_transmit() {
        wire.extend_from_slice(&b);
    }
    let mut dec = topspin_proto::frame::FrameDecoder::new(1 << 24);
    let mut kinds = Vec::new();
    while let Ok(Some(f)) = dec.decode(&mut wire) {
        if matches!(f, topspin_proto::frame::Frame::Ping { ack: true, .. }) {
            acks += 1;
        }
        kinds.push(f.frame_type().name());
    }
    assert_eq!(
        acks, 1,
        "PINGs while an answer is unsent share it: {kinds:?}"
    );
    assert_eq!(kinds[kinds.len() - 2..], ["GOAWAY", "ERROR"]);
}

/// Rapid Reset: calls cancelled before an answer, past the budget, close the connection;
/// calls cancelled after the server answered them do not count.
#[test]
fn rapid_reset_is_bounded_and_answered_calls_do_not_count() {
    let mut p = Pair::default_pair();
    p.server
        .set_limits(Limits::default().with_rapid_reset_rate(Rate::new(10, Duration::from_secs(1))));
    for _ in 0..50 {
        let id = start(&mut p, "/p.S/M");
        p.drive();
        p.server.send_headers(id, &Metadata::new()).unwrap();
        p.drive();
        p.client.cancel(id, Code::Cancelled).unwrap();
        p.drive();
    }
    assert!(
        !p.server.is_closed(),
        "cancelled after an answer: not a reset"
    );
    for _ in 0..10 {
        let id = start(&mut p, "/p.S/M");
        p.client.cancel(id, Code::Cancelled).unwrap();
    }
    p.drive();
    assert!(!p.server.is_closed(), "within the burst");
    let id = start(&mut p, "/p.S/M");
    p.client.cancel(id, Code::Cancelled).unwrap();
    p.drive();
    let err = p.server_error.clone().expect("closed");
    assert_eq!(err.code, ErrorCode::ENHANCE_YOUR_CALM);
    assert!(err.reason.contains("too_many_resets"), "{err}");
    let ev = p.take_client();
    assert!(ev
        .iter()
        .any(|e| matches!(e, Event::GoAway { code, .. } if *code == ErrorCode::ENHANCE_YOUR_CALM)));
}

/// A client that keeps starting calls over MAX_CONCURRENT_CALLS (the Rust client queues; this
/// one ignores the limit) is closed past the refused-call budget.
#[test]
fn refused_calls_past_the_budget_close_the_connection() {
    let zero = Settings::default().with_max_concurrent_calls(0);
    let (mut s, mut wire, now) = server_with(zero, &MemoryBudget::unlimited());
    s.set_limits(Limits::default().with_refused_call_rate(Rate::new(5, Duration::from_secs(1))));
    for id in 1..=5 {
        wire.extend_from_slice(&call(id));
    }
    s.handle_input(&mut wire, now).unwrap();
    wire.extend_from_slice(&call(6));
    let err = s.handle_input(&mut wire, now).unwrap_err();
    assert_eq!(err.code, ErrorCode::ENHANCE_YOUR_CALM);
    assert!(err.reason.contains("max_concurrent_calls"), "{err}");
}

/// spec-review row 6/17: an END too large for the client keeps the code and truncates the
/// message at a character boundary (it used to be replaced by a clipped note).
#[test]
fn an_end_too_large_is_truncated_not_replaced() {
    let cs = Settings::default().with_max_metadata_size(9);
    let mut p = Pair::new(cs, Settings::default());
    let id = start(&mut p, "/p.S/M");
    p.drive();
    p.take_server();
    p.server
        .end_call(id, &Status::new(Code::NotFound, "ééé"), &Metadata::new())
        .unwrap();
    p.drive();
    let st = ended(&p.take_client(), id).unwrap();
    assert_eq!(st.code(), Code::NotFound);
    assert_eq!(st.message(), "éé");
}

/// spec-review row 11: a NAMED CALL binding id 1024 names the real cause.
#[test]
fn a_named_call_binding_id_1024_says_so() {
    let (mut s, mut wire, now) = server(&MemoryBudget::unlimited());
    let mut p = Vec::new();
    p.extend_from_slice(&1024u16.to_le_bytes());
    p.extend_from_slice(&[RAW, 0]);
    p.extend_from_slice(&0u64.to_le_bytes());
    p.extend_from_slice(&6u16.to_le_bytes());
    p.extend_from_slice(b"/p.S/M");
    p.extend_from_slice(&0u16.to_le_bytes());
    wire.extend_from_slice(&raw(0x02, 0x01, 1, &p));
    let err = s.handle_input(&mut wire, now).unwrap_err();
    assert_eq!(err.code, ErrorCode::METHOD_ID_ERROR);
    assert!(
        err.reason.contains("NAMED CALL binds method id 1024"),
        "{err}"
    );
}

/// spec-review row 4: a client never sends an already expired deadline (timeout_us 0 would
/// mean "none").
#[test]
fn an_expired_deadline_is_never_sent() {
    let mut p = Pair::default_pair();
    let r = p
        .client
        .start_call("/p.S/M", RAW, Some(Duration::ZERO), &Metadata::new(), p.now);
    assert_eq!(r, Err(CallError::DeadlineExceeded));
    p.drive();
    assert!(p.take_server().is_empty());
    let id = p
        .client
        .start_call(
            "/p.S/M",
            RAW,
            Some(Duration::from_nanos(1)),
            &Metadata::new(),
            p.now,
        )
        .unwrap();
    p.drive();
    let ev = p.take_server();
    assert!(
        matches!(&ev[0], Event::CallStarted { id: i, deadline: Some(_), .. } if *i == id),
        "{ev:?}"
    );
}

/// Regression: a half-close refused while a split message was still going out was only
/// signalled (Writable) once the call had credit again, which a receiver that grants on
/// consumption may never give: the half-close (or a server's END) waited for ever. HALF_CLOSE
/// and END need no credit, so Writable now follows as soon as the message is out.
#[test]
fn a_half_close_behind_a_split_message_needs_no_credit() {
    let zero = Settings::default()
        .with_initial_call_window(0)
        .with_max_frame_size(16 * 1024);
    let mut p = Pair::new(Settings::default(), zero);
    let id = start(&mut p, "/p.S/M");
    p.drive();
    p.client
        .send_message(id, Bytes::from(vec![5u8; 100_000]), false)
        .unwrap();
    assert_eq!(p.client.half_close(id), Err(CallError::WouldBlock));
    p.drive();
    assert!(
        p.client.send_credit(id).unwrap() <= 0,
        "the test needs no credit left"
    );
    assert!(p.take_client().contains(&Event::Writable { id }));
    p.client.half_close(id).unwrap();
    p.drive();
    assert!(p.take_server().contains(&Event::HalfClosed { id }));
}
