//! Property tests of the connection state machine: a client and a server `Connection` wired
//! back to back in memory run random sequences of commands (calls, messages of every size,
//! half-closes, cancels, headers, ends, credit, pings, go-aways, deadlines) with bytes
//! delivered in random pieces, and must always end in a consistent state on both sides.
//!
//! The harness keeps a model of what each application did and saw, and checks after every
//! step and at the end that:
//! - no side reports a protocol error or closes;
//! - every call the client started ends exactly once on the client (an `Ended` event or its
//!   own `cancel`), and every call the server saw start ends exactly once on the server (a
//!   `Cancelled` event or its own `end_call`); no event names a call that is over;
//! - the server saw `CallStarted` (with the right method, codec, metadata) for every call it did
//!   not refuse; when bytes are delivered promptly, it refuses none;
//! - messages arrive in order and intact: what a side received on a call is a prefix of what
//!   the other sent, and all of it when the call completed normally;
//! - commands fail only for reasons the model can justify, and `open_calls` agrees;
//! - flow control stays live: once all received messages' credit is given back, a sender that
//!   was refused with `WouldBlock` has had its `Writable`; every PING gets its answer.
//!
//! The fixed tests at the end of this file are regressions for engine bugs these properties
//! found (END over the metadata limit, overdrawn credit grants, huge timeouts, stale deadlines).

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use topspin_proto::connection::{CallError, Connection, Event, Side};
use topspin_proto::frame::{Frame, Header, HEADER_LEN};
use topspin_proto::{CallId, Code, ErrorCode, Metadata, Settings, Status, MAX_WINDOW};

const METHODS: [&str; 4] = ["/a.A/One", "/a.A/Two", "/b.B/Three", "/c.C/ünïcödé"];

fn method(i: u8) -> String {
    match i % 6 {
        4 => format!("/long.L/{}", "x".repeat(1024 - 8)),
        5 => "é".repeat(512),
        i => METHODS[usize::from(i)].to_owned(),
    }
}

fn metadata(i: u8) -> Metadata {
    let b = Metadata::builder();
    match i % 5 {
        0 => Metadata::new(),
        1 => b.text("k", "v").unwrap().build(),
        2 => b.text("greeting", "grüße 👋").unwrap().build(),
        3 => b
            .binary("trace-bin", &[0, 0xff, 0x80, 1])
            .unwrap()
            .text("a", "1")
            .unwrap()
            .text("a", "2")
            .unwrap()
            .build(),
        _ => b.text("big", &"m".repeat(300)).unwrap().build(),
    }
}

/// A message whose bytes say which call, direction and position it is.
fn message(id: u32, to_server: bool, seq: usize, len: usize) -> Bytes {
    let seed = id
        .wrapping_mul(31)
        .wrapping_add(seq as u32 * 7)
        .wrapping_add(u32::from(to_server));
    Bytes::from(
        (0..len)
            .map(|i| (seed as usize + i * 13) as u8)
            .collect::<Vec<u8>>(),
    )
}

/// Which open call a command applies to: an index modulo the number of open calls.
#[derive(Clone, Copy, Debug)]
struct Pick(u8);

#[derive(Clone, Debug)]
enum Cmd {
    Start {
        method: u8,
        codec: u8,
        timeout_ms: Option<u8>,
        md: u8,
    },
    ClientSend {
        call: Pick,
        len: usize,
        end_stream: bool,
    },
    HalfClose {
        call: Pick,
    },
    Cancel {
        call: Pick,
        code: u8,
    },
    Headers {
        call: Pick,
        md: u8,
    },
    ServerSend {
        call: Pick,
        len: usize,
    },
    End {
        call: Pick,
        code: u8,
        msg_len: u32,
        md: u8,
    },
    Grant {
        client: bool,
        call: Pick,
        extra: u32,
    },
    Ping {
        client: bool,
        data: [u8; 8],
    },
    GoAway {
        client: bool,
    },
    Advance {
        ms: u8,
    },
    Deliver {
        to_server: bool,
        max: u16,
    },
    Pump,
}

fn msg_len() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 0..64usize,
        3 => 64..2000usize,
        2 => 15_000..50_000usize,
    ]
}

fn pick() -> impl Strategy<Value = Pick> {
    any::<u8>().prop_map(Pick)
}

/// Credit granted beyond what was consumed, up to grants that overflow the window.
fn grant_extra() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), 0..70_000u32, 0..1u32 << 20, Just(1u32 << 31)]
}

fn cmd() -> impl Strategy<Value = Cmd> {
    let start = (
        any::<u8>(),
        0..3u8,
        proptest::option::weighted(0.3, 1..40u8),
        any::<u8>(),
    )
        .prop_map(|(method, codec, timeout_ms, md)| Cmd::Start {
            method,
            codec,
            timeout_ms,
            md,
        });
    let client_send =
        (pick(), msg_len(), proptest::bool::weighted(0.2)).prop_map(|(call, len, end_stream)| {
            Cmd::ClientSend {
                call,
                len,
                end_stream,
            }
        });
    let end = (
        pick(),
        any::<u8>(),
        // Past 65,535 bytes too: the message is then cut at a character boundary.
        prop_oneof![10 => 0..20u32, 10 => 0..600u32, 1 => 60_000..80_000u32],
        any::<u8>(),
    )
        .prop_map(|(call, code, msg_len, md)| Cmd::End {
            call,
            code,
            msg_len,
            md,
        });
    let grant =
        (any::<bool>(), pick(), grant_extra()).prop_map(|(client, call, extra)| Cmd::Grant {
            client,
            call,
            extra,
        });
    let deliver = (any::<bool>(), prop_oneof![1..40u16, 1..20_000u16])
        .prop_map(|(to_server, max)| Cmd::Deliver { to_server, max });
    prop_oneof![
        7 => start,
        6 => client_send,
        2 => pick().prop_map(|call| Cmd::HalfClose { call }),
        1 => (pick(), any::<u8>()).prop_map(|(call, code)| Cmd::Cancel { call, code }),
        2 => (pick(), any::<u8>()).prop_map(|(call, md)| Cmd::Headers { call, md }),
        6 => (pick(), msg_len()).prop_map(|(call, len)| Cmd::ServerSend { call, len }),
        3 => end,
        3 => grant,
        1 => (any::<bool>(), any::<[u8; 8]>()).prop_map(|(client, data)| Cmd::Ping { client, data }),
        1 => proptest::bool::weighted(0.3).prop_map(|client| Cmd::GoAway { client }),
        1 => (1..30u8).prop_map(|ms| Cmd::Advance { ms }),
        6 => deliver,
        2 => Just(Cmd::Pump),
    ]
}

fn settings(server: bool) -> impl Strategy<Value = Settings> {
    (
        prop_oneof![Just(16_384u32), 16_384..40_000u32],
        if server {
            prop_oneof![1 => Just(0u32), 4 => 1..4u32, 3 => Just(1024)].boxed()
        } else {
            Just(1024u32).boxed()
        },
        prop_oneof![1 => Just(0u32), 2 => 1..200u32, 5 => 1000..70_000u32, 2 => Just(1 << 20)],
        prop_oneof![1 => Just(0u32), 1 => 1..100u32, 5 => Just(64 * 1024 * 1024), 3 => 20_000..60_000u32],
        prop_oneof![1 => Just(4u32), 1 => 4..64u32, 2 => 64..400u32, 6 => Just(16 * 1024)],
    )
        .prop_map(|(f, c, w, m, md)| Settings::default().with_max_frame_size(f).with_max_concurrent_calls(c).with_initial_call_window(w).with_max_message_size(m).with_max_metadata_size(md))
}

#[derive(Debug, Default)]
struct ClientCall {
    method: String,
    codec: u8,
    metadata: Metadata,
    timeout: bool,
    sent: Vec<Bytes>,
    received: Vec<Bytes>,
    headers: Option<Metadata>,
    half_closed: bool,
    /// A command got WouldBlock and no Writable followed yet.
    blocked: bool,
    /// Ended events seen, plus 1 if the application cancelled.
    ends: u32,
    status: Option<(Status, Metadata)>,
    owed: u64,
}

#[derive(Debug, Default)]
struct ServerCall {
    received: Vec<Bytes>,
    sent: Vec<Bytes>,
    headers: Option<Metadata>,
    half_closed: bool,
    /// A command got WouldBlock and no Writable followed yet.
    blocked: bool,
    /// Cancelled events seen, plus 1 if the application ended the call.
    ends: u32,
    end: Option<(Status, Metadata)>,
    owed: u64,
}

/// Checks every frame an engine writes: decoding it and encoding the result with the frame
/// module's encoders gives back exactly the bytes the engine wrote (one encoder for all).
#[derive(Default)]
struct WireCheck {
    buf: BytesMut,
    preface_seen: bool,
}

impl WireCheck {
    fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        if !self.preface_seen {
            if self.buf.len() < topspin_proto::preface::PREFACE_LEN {
                return;
            }
            let _ = self.buf.split_to(topspin_proto::preface::PREFACE_LEN);
            self.preface_seen = true;
        }
        while self.buf.len() >= HEADER_LEN {
            let head: &[u8; HEADER_LEN] = self.buf[..HEADER_LEN].try_into().unwrap();
            let header = Header::parse(head);
            let total = HEADER_LEN + header.length as usize;
            if self.buf.len() < total {
                return;
            }
            let raw = self.buf.split_to(total).freeze();
            let frame = Frame::decode(&header, raw.slice(HEADER_LEN..))
                .unwrap_or_else(|e| panic!("the engine wrote an undecodable frame: {e}"));
            assert!(
                frame.to_bytes() == raw,
                "the engine's bytes for a {} frame differ from Frame::encode of the same frame",
                frame.frame_type().name()
            );
        }
    }
}

struct Harness {
    client: Connection,
    server: Connection,
    cs: Settings,
    ss: Settings,
    now: Instant,
    /// Bytes sent by one side and not yet delivered to the other.
    to_server: BytesMut,
    to_client: BytesMut,
    /// Receive buffers (may hold a partial frame).
    server_rx: BytesMut,
    client_rx: BytesMut,
    ccalls: BTreeMap<u32, ClientCall>,
    scalls: BTreeMap<u32, ServerCall>,
    auto_grant: bool,
    /// Ping data sent and not answered yet, per side (client, server).
    pings: [std::collections::VecDeque<[u8; 8]>; 2],
    /// A PING was sent and no answer has arrived since.
    pinged: [bool; 2],
    go_away_sent: [bool; 2],
    go_away_seen: [bool; 2],
    log: Vec<String>,
    /// What each side wrote, frame by frame (client, server).
    wire_checks: [WireCheck; 2],
}

impl Harness {
    fn new(cs: Settings, ss: Settings, auto_grant: bool) -> Harness {
        Harness {
            client: Connection::new(Side::Client, cs),
            server: Connection::new(Side::Server, ss),
            cs,
            ss,
            now: Instant::now(),
            to_server: BytesMut::new(),
            to_client: BytesMut::new(),
            server_rx: BytesMut::new(),
            client_rx: BytesMut::new(),
            ccalls: BTreeMap::new(),
            scalls: BTreeMap::new(),
            auto_grant,
            pings: Default::default(),
            pinged: [false; 2],
            go_away_sent: [false; 2],
            go_away_seen: [false; 2],
            log: Vec::new(),
            wire_checks: Default::default(),
        }
    }

    fn open_client_calls(&self) -> Vec<u32> {
        self.ccalls
            .iter()
            .filter(|(_, c)| c.ends == 0)
            .map(|(&id, _)| id)
            .collect()
    }

    fn open_server_calls(&self) -> Vec<u32> {
        self.scalls
            .iter()
            .filter(|(_, c)| c.ends == 0)
            .map(|(&id, _)| id)
            .collect()
    }

    fn collect_transmit(&mut self) {
        while let Some(b) = self.client.poll_transmit() {
            self.wire_checks[0].feed(&b);
            self.to_server.extend_from_slice(&b);
        }
        while let Some(b) = self.server.poll_transmit() {
            self.wire_checks[1].feed(&b);
            self.to_client.extend_from_slice(&b);
        }
    }

    fn deliver(&mut self, to_server: bool, max: usize) {
        self.collect_transmit();
        let (wire, rx, conn) = if to_server {
            (&mut self.to_server, &mut self.server_rx, &mut self.server)
        } else {
            (&mut self.to_client, &mut self.client_rx, &mut self.client)
        };
        let n = max.min(wire.len());
        if n == 0 {
            return;
        }
        rx.extend_from_slice(&wire.split_to(n));
        if let Err(e) = conn.handle_input(rx, self.now) {
            panic!(
                "protocol error on the {}: {e}\nlog:\n{}",
                if to_server { "server" } else { "client" },
                self.log.join("\n")
            );
        }
        self.events();
    }

    /// Delivers everything both ways until nothing is left to send.
    fn pump(&mut self) {
        for _ in 0..10_000 {
            self.collect_transmit();
            if self.to_server.is_empty() && self.to_client.is_empty() {
                return;
            }
            self.deliver(true, usize::MAX);
            self.deliver(false, usize::MAX);
        }
        panic!("the connections never went quiet");
    }

    fn events(&mut self) {
        while let Some(ev) = self.client.poll_event() {
            self.log
                .push(format!("client event {ev:?}").chars().take(200).collect());
            self.client_event(ev);
        }
        while let Some(ev) = self.server.poll_event() {
            self.log
                .push(format!("server event {ev:?}").chars().take(200).collect());
            self.server_event(ev);
        }
        assert_eq!(
            self.client.open_calls(),
            self.open_client_calls().len(),
            "client open calls"
        );
        assert_eq!(
            self.server.open_calls(),
            self.open_server_calls().len(),
            "server open calls"
        );
    }

    fn client_event(&mut self, ev: Event) {
        match ev {
            Event::Established => {}
            Event::Writable { id } => {
                if let Some(c) = self.ccalls.get_mut(&id.0) {
                    c.blocked = false;
                }
            }
            Event::Headers { id, metadata } => {
                let c = self
                    .ccalls
                    .get_mut(&id.0)
                    .expect("headers for an unknown call");
                assert_eq!(c.ends, 0, "headers on an ended call");
                assert!(
                    c.headers.is_none() && c.received.is_empty(),
                    "headers twice or late"
                );
                c.headers = Some(metadata);
            }
            Event::Message {
                id,
                message,
                credit,
            } => {
                let c = self
                    .ccalls
                    .get_mut(&id.0)
                    .expect("message for an unknown call");
                assert_eq!(c.ends, 0, "message on an ended call");
                c.received.push(message);
                c.owed += u64::from(credit);
                if self.auto_grant {
                    self.client.grant_credit(id, credit).unwrap();
                    self.ccalls.get_mut(&id.0).unwrap().owed -= u64::from(credit);
                }
            }
            Event::Ended {
                id,
                status,
                trailers,
            } => {
                let c = self.ccalls.get_mut(&id.0).expect("end of an unknown call");
                assert_eq!(c.ends, 0, "call {id:?} ended twice on the client");
                c.ends = 1;
                c.status = Some((status, trailers));
            }
            Event::Pong { data } => {
                pong(&mut self.pings[0], data);
                self.pinged[0] = false;
            }
            Event::GoAway { .. } => self.go_away_seen[0] = true,
            other => panic!(
                "unexpected client event {other:?}\nlog:\n{}",
                self.log.join("\n")
            ),
        }
    }

    fn server_event(&mut self, ev: Event) {
        match ev {
            Event::Established => {}
            Event::Writable { id } => {
                if let Some(c) = self.scalls.get_mut(&id.0) {
                    c.blocked = false;
                }
            }
            Event::CallStarted {
                id,
                method,
                codec,
                deadline,
                metadata,
                ..
            } => {
                let c = self
                    .ccalls
                    .get(&id.0)
                    .expect("the client never started this call");
                assert_eq!(&*method, c.method);
                assert_eq!(codec, c.codec);
                assert_eq!(metadata, c.metadata);
                assert_eq!(deadline.is_some(), c.timeout);
                let prev = self.scalls.insert(id.0, ServerCall::default());
                assert!(prev.is_none(), "call {id:?} started twice");
            }
            Event::Message {
                id,
                message,
                credit,
            } => {
                let c = self
                    .scalls
                    .get_mut(&id.0)
                    .expect("message for a call never started");
                assert_eq!(c.ends, 0, "message on an ended call");
                assert!(!c.half_closed, "message after half-close");
                c.received.push(message);
                c.owed += u64::from(credit);
                if self.auto_grant {
                    self.server.grant_credit(id, credit).unwrap();
                    self.scalls.get_mut(&id.0).unwrap().owed -= u64::from(credit);
                }
            }
            Event::HalfClosed { id } => {
                let c = self
                    .scalls
                    .get_mut(&id.0)
                    .expect("half-close of a call never started");
                assert_eq!(c.ends, 0, "half-close on an ended call");
                assert!(!c.half_closed, "half-closed twice");
                c.half_closed = true;
            }
            Event::Cancelled { id, .. } => {
                let c = self
                    .scalls
                    .get_mut(&id.0)
                    .expect("cancel of a call never started");
                assert_eq!(c.ends, 0, "call {id:?} ended twice on the server");
                c.ends = 1;
            }
            Event::Pong { data } => {
                pong(&mut self.pings[1], data);
                self.pinged[1] = false;
            }
            Event::GoAway { .. } => self.go_away_seen[1] = true,
            other => panic!(
                "unexpected server event {other:?}\nlog:\n{}",
                self.log.join("\n")
            ),
        }
    }

    fn run(&mut self, cmd: &Cmd) {
        self.log.push(format!("{cmd:?}"));
        let open_c = self.open_client_calls();
        let open_s = self.open_server_calls();
        let pick =
            |v: &[u32], i: &Pick| (!v.is_empty()).then(|| CallId(v[usize::from(i.0) % v.len()]));
        match cmd {
            Cmd::Start {
                method: m,
                codec,
                timeout_ms,
                md,
            } => {
                let name = method(*m);
                let md = metadata(*md);
                let timeout = timeout_ms.map(|t| Duration::from_millis(u64::from(t)));
                let r = self
                    .client
                    .start_call(&name, *codec, timeout, &md, self.now);
                let going_away = self.go_away_sent[0] || self.go_away_seen[0];
                let too_many = open_c.len() >= self.ss.max_concurrent_calls() as usize;
                let md_too_big = md.encoded_len() > self.ss.max_metadata_size() as usize;
                match r {
                    Ok(id) => {
                        assert!(
                            !going_away && !too_many && !md_too_big,
                            "start_call should fail"
                        );
                        assert!(self.ccalls.keys().all(|&k| k < id.0), "call ids must grow");
                        self.ccalls.insert(
                            id.0,
                            ClientCall {
                                method: name,
                                codec: *codec,
                                metadata: md,
                                timeout: timeout.is_some(),
                                ..ClientCall::default()
                            },
                        );
                    }
                    Err(CallError::GoingAway) => assert!(going_away),
                    Err(CallError::TooManyCalls { .. }) => assert!(too_many),
                    Err(CallError::MetadataTooLarge { .. }) => assert!(md_too_big),
                    Err(e) => panic!("start_call: unexpected {e}"),
                }
            }
            Cmd::ClientSend {
                call,
                len,
                end_stream,
            } => {
                let Some(id) = pick(&open_c, call) else {
                    return;
                };
                let c = &self.ccalls[&id.0];
                let msg = message(id.0, true, c.sent.len(), *len);
                let half_closed = c.half_closed;
                match self.client.send_message(id, msg.clone(), *end_stream) {
                    Ok(()) => {
                        assert!(!half_closed);
                        assert!(*len <= self.ss.max_message_size() as usize);
                        let c = self.ccalls.get_mut(&id.0).unwrap();
                        c.sent.push(msg);
                        c.half_closed |= *end_stream;
                    }
                    Err(CallError::MessageTooLarge { .. }) => {
                        assert!(*len > self.ss.max_message_size() as usize)
                    }
                    Err(CallError::NotAllowed(_)) => assert!(half_closed),
                    Err(CallError::WouldBlock) => {
                        self.ccalls.get_mut(&id.0).unwrap().blocked = true
                    }
                    Err(e) => panic!("send_message on open {id:?}: unexpected {e}"),
                }
            }
            Cmd::HalfClose { call } => {
                let Some(id) = pick(&open_c, call) else {
                    return;
                };
                let half_closed = self.ccalls[&id.0].half_closed;
                match self.client.half_close(id) {
                    Ok(()) => {
                        assert!(!half_closed);
                        self.ccalls.get_mut(&id.0).unwrap().half_closed = true;
                    }
                    Err(CallError::NotAllowed(_)) => assert!(half_closed),
                    Err(CallError::WouldBlock) => {
                        self.ccalls.get_mut(&id.0).unwrap().blocked = true
                    }
                    Err(e) => panic!("half_close on open {id:?}: unexpected {e}"),
                }
            }
            Cmd::Cancel { call, code } => {
                let Some(id) = pick(&open_c, call) else {
                    return;
                };
                let code = [
                    Code::Cancelled,
                    Code::DeadlineExceeded,
                    Code::ResourceExhausted,
                ][usize::from(*code % 3)];
                self.client.cancel(id, code).unwrap();
                self.ccalls.get_mut(&id.0).unwrap().ends += 1;
            }
            Cmd::Headers { call, md } => {
                let Some(id) = pick(&open_s, call) else {
                    return;
                };
                let md = metadata(*md);
                let c = &self.scalls[&id.0];
                let late = c.headers.is_some() || !c.sent.is_empty();
                let too_big = md.encoded_len() > self.cs.max_metadata_size() as usize;
                match self.server.send_headers(id, &md) {
                    Ok(()) => {
                        assert!(!late && !too_big);
                        self.scalls.get_mut(&id.0).unwrap().headers = Some(md);
                    }
                    Err(CallError::NotAllowed(_)) => assert!(late),
                    Err(CallError::MetadataTooLarge { .. }) => assert!(too_big),
                    Err(e) => panic!("send_headers on open {id:?}: unexpected {e}"),
                }
            }
            Cmd::ServerSend { call, len } => {
                let Some(id) = pick(&open_s, call) else {
                    return;
                };
                let msg = message(id.0, false, self.scalls[&id.0].sent.len(), *len);
                match self.server.send_message(id, msg.clone(), false) {
                    Ok(()) => {
                        assert!(*len <= self.cs.max_message_size() as usize);
                        self.scalls.get_mut(&id.0).unwrap().sent.push(msg);
                    }
                    Err(CallError::MessageTooLarge { .. }) => {
                        assert!(*len > self.cs.max_message_size() as usize)
                    }
                    Err(CallError::WouldBlock) => {
                        self.scalls.get_mut(&id.0).unwrap().blocked = true
                    }
                    Err(e) => panic!("send_message on open {id:?}: unexpected {e}"),
                }
            }
            Cmd::End {
                call,
                code,
                msg_len,
                md,
            } => {
                let Some(id) = pick(&open_s, call) else {
                    return;
                };
                self.end(
                    id,
                    Code::from_u16(u16::from(*code % 17)),
                    *msg_len as usize,
                    *md,
                );
            }
            Cmd::Grant {
                client,
                call,
                extra,
            } => {
                let (open, conn, owed) = if *client {
                    let id = pick(&open_c, call);
                    (
                        id,
                        &mut self.client,
                        id.map(|id| &mut self.ccalls.get_mut(&id.0).unwrap().owed),
                    )
                } else {
                    let id = pick(&open_s, call);
                    (
                        id,
                        &mut self.server,
                        id.map(|id| &mut self.scalls.get_mut(&id.0).unwrap().owed),
                    )
                };
                let (Some(id), Some(owed)) = (open, owed) else {
                    return;
                };
                let give = *owed + u64::from(*extra);
                *owed = 0;
                conn.grant_credit(id, u32::try_from(give).unwrap()).unwrap();
            }
            Cmd::Ping { client, data } => {
                if *client {
                    self.client.ping(*data);
                    self.pings[0].push_back(*data);
                    self.pinged[0] = true;
                } else {
                    self.server.ping(*data);
                    self.pings[1].push_back(*data);
                    self.pinged[1] = true;
                }
            }
            Cmd::GoAway { client } => {
                if *client {
                    self.client.go_away(ErrorCode::NO_ERROR, "client leaving");
                    self.go_away_sent[0] = true;
                } else {
                    self.server.go_away(ErrorCode::NO_ERROR, "server draining");
                    self.go_away_sent[1] = true;
                }
            }
            Cmd::Advance { ms } => {
                self.now += Duration::from_millis(u64::from(*ms));
                self.client.handle_timeout(self.now);
                self.server.handle_timeout(self.now);
            }
            Cmd::Deliver { to_server, max } => self.deliver(*to_server, usize::from(*max)),
            Cmd::Pump => self.pump(),
        }
        self.events();
    }

    /// The server application ends a call; false if the engine refused (metadata too large).
    fn end(&mut self, id: CallId, code: Code, msg_len: usize, md: u8) -> bool {
        let text = format!("end of call {} ", id.0);
        let fill = msg_len.saturating_sub(text.len());
        // Long messages in two-byte characters, so cutting them must respect boundaries.
        let fill = if fill > 1000 {
            "é".repeat(fill / 2)
        } else {
            "s".repeat(fill)
        };
        let msg = format!("{text}{fill}");
        let status = Status::new(code, msg.clone());
        // What the client can receive: the message cut to 65,535 bytes at a boundary.
        let received = Status::new(
            code,
            topspin_proto::frame::clip(&msg, usize::MAX).to_owned(),
        );
        let trailers = metadata(md);
        // protocol.md §5.6/§9: what counts against the client's limit is END's payload less
        // its code: the msg_len field, the message and the trailers block.
        let size = 2 + received.message().len() + trailers.encoded_len();
        // ... and never more than fits the client's frame limit with END's 2-byte code.
        let limit =
            (self.cs.max_metadata_size() as usize).min(self.cs.max_frame_size() as usize - 2);
        match self.server.end_call(id, &status, &trailers) {
            Ok(()) => {
                let c = self.scalls.get_mut(&id.0).unwrap();
                c.ends += 1;
                // Over the client's limit the engine keeps the code but drops the trailers and
                // replaces the message, so the client's status differs from what was asked.
                if size <= limit {
                    c.end = Some((received, trailers));
                }
                true
            }
            Err(CallError::WouldBlock) => {
                self.scalls.get_mut(&id.0).unwrap().blocked = true;
                true
            }
            Err(e) => panic!("end_call on open {id:?}: unexpected {e}"),
        }
    }

    /// Flow-control liveness: once each side has given back the credit of every message it
    /// received and everything is delivered, a call that was refused with WouldBlock has had
    /// its Writable (unless the peer's window is 0: then only an explicit grant helps).
    fn check_writable(&mut self) {
        for _ in 0..100 {
            for id in self.open_client_calls() {
                let owed = std::mem::take(&mut self.ccalls.get_mut(&id).unwrap().owed);
                self.client.grant_credit(CallId(id), owed as u32).unwrap();
            }
            for id in self.open_server_calls() {
                let owed = std::mem::take(&mut self.scalls.get_mut(&id).unwrap().owed);
                self.server.grant_credit(CallId(id), owed as u32).unwrap();
            }
            self.pump();
            let owed = self
                .ccalls
                .values()
                .filter(|c| c.ends == 0)
                .any(|c| c.owed > 0)
                || self
                    .scalls
                    .values()
                    .filter(|c| c.ends == 0)
                    .any(|c| c.owed > 0);
            if !owed {
                break;
            }
        }
        for (id, s) in self.scalls.iter().filter(|(_, s)| s.ends == 0) {
            let Some(c) = self.ccalls.get(id).filter(|c| c.ends == 0) else {
                continue;
            };
            assert!(
                !(c.blocked && self.ss.initial_call_window() > 0),
                "client call {id} still blocked after all credit was given back\nlog:\n{}",
                self.log.join("\n")
            );
            assert!(
                !(s.blocked && self.cs.initial_call_window() > 0),
                "server call {id} still blocked after all credit was given back\nlog:\n{}",
                self.log.join("\n")
            );
        }
    }

    /// Ends every call from the server and runs the connections until they are quiet.
    fn finish(&mut self) {
        self.auto_grant = true;
        self.check_writable();
        for _ in 0..1000 {
            for id in self.open_client_calls() {
                let owed = std::mem::take(&mut self.ccalls.get_mut(&id).unwrap().owed);
                self.client.grant_credit(CallId(id), owed as u32).unwrap();
            }
            for id in self.open_server_calls() {
                let owed = std::mem::take(&mut self.scalls.get_mut(&id).unwrap().owed);
                self.server.grant_credit(CallId(id), owed as u32).unwrap();
                if !self.end(CallId(id), Code::Ok, 0, 0) {
                    // Refused only while a message is still being sent: cancel instead.
                    if self.ccalls.get(&id).is_some_and(|c| c.ends == 0) {
                        self.client.cancel(CallId(id), Code::Cancelled).unwrap();
                        self.ccalls.get_mut(&id).unwrap().ends += 1;
                    }
                }
            }
            self.events();
            self.pump();
            if self.open_client_calls().is_empty() && self.open_server_calls().is_empty() {
                return;
            }
        }
        panic!(
            "calls never finished: client {:?}, server {:?}\nlog:\n{}",
            self.open_client_calls(),
            self.open_server_calls(),
            self.log.join("\n")
        );
    }

    fn check_final(&self, prompt: bool) {
        assert!(!self.client.is_closed() && !self.server.is_closed());
        assert_eq!(self.client.open_calls(), 0);
        assert_eq!(self.server.open_calls(), 0);
        // PINGs that arrive while an answer is unsent share it (protocol.md §9): the last
        // PING sent was answered, by its own answer or one queued before it was received.
        assert!(self.pinged.iter().all(|p| !p), "every ping answered");
        assert_eq!(
            self.go_away_sent,
            [self.go_away_seen[1], self.go_away_seen[0]]
        );
        for (&id, c) in &self.ccalls {
            assert_eq!(c.ends, 1, "call {id} ended {} times on the client", c.ends);
            let ended = c.status.as_ref().map(|(s, _)| s);
            let Some(s) = self.scalls.get(&id) else {
                // Not started on the server: it was refused (too many calls, or above the
                // server's go-away), and the client learnt it from the refusal or had already
                // ended the call itself (cancel: no status; deadline). Never with prompt
                // delivery, where every CALL arrives before anything else happens.
                assert!(!prompt, "call {id} never reached the server: {ended:?}");
                let local = ended.is_none_or(|s| {
                    matches!(
                        s.code(),
                        Code::ResourceExhausted | Code::Unavailable | Code::DeadlineExceeded
                    ) && !s.message().starts_with("end of call")
                });
                assert!(
                    local,
                    "call {id} never reached the server but ended with {ended:?}"
                );
                continue;
            };
            assert_eq!(s.ends, 1, "call {id} ended {} times on the server", s.ends);
            assert!(s.received.len() <= c.sent.len());
            assert_eq!(
                s.received[..],
                c.sent[..s.received.len()],
                "call {id}: client messages"
            );
            if s.half_closed {
                assert_eq!(
                    s.received, c.sent,
                    "call {id}: all client messages before half-close"
                );
            }
            assert!(c.received.len() <= s.sent.len());
            assert_eq!(
                c.received[..],
                s.sent[..c.received.len()],
                "call {id}: server messages"
            );
            if let (Some((status, trailers)), Some((sent, sent_trailers))) = (&c.status, &s.end) {
                if status == sent {
                    // The client got the server's END: it saw everything sent before it.
                    assert_eq!(trailers, sent_trailers);
                    assert_eq!(
                        c.received, s.sent,
                        "call {id}: all server messages before END"
                    );
                    assert_eq!(c.headers, s.headers, "call {id}: response headers");
                }
            }
            if c.headers.is_some() {
                assert_eq!(c.headers, s.headers);
            }
        }
        for id in self.scalls.keys() {
            assert!(self.ccalls.contains_key(id));
        }
    }
}

fn run(cs: Settings, ss: Settings, auto_grant: bool, prompt: bool, cmds: &[Cmd]) -> Harness {
    let mut h = Harness::new(cs, ss, auto_grant);
    h.pump();
    assert!(h.client.is_established() && h.server.is_established());
    for cmd in cmds {
        h.run(cmd);
        if prompt {
            h.pump();
        }
    }
    h.finish();
    h.check_final(prompt);
    h
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, max_shrink_iters: 4000, ..ProptestConfig::default() })]

    /// Bytes delivered in random pieces at random times.
    #[test]
    fn random_delivery_stays_consistent(
        cs in settings(false),
        ss in settings(true),
        auto_grant in any::<bool>(),
        cmds in proptest::collection::vec(cmd(), 1..100),
    ) {
        run(cs, ss, auto_grant, false, &cmds);
    }

    /// Everything delivered after every command: no call may be refused.
    #[test]
    fn prompt_delivery_stays_consistent(
        cs in settings(false),
        ss in settings(true),
        auto_grant in any::<bool>(),
        cmds in proptest::collection::vec(cmd(), 1..100),
    ) {
        run(cs, ss, auto_grant, true, &cmds);
    }
}

#[test]
fn large_messages_both_ways_with_small_windows() {
    let small = Settings::default()
        .with_max_frame_size(16_384)
        .with_initial_call_window(100);
    let cmds = [
        Cmd::Start {
            method: 0,
            codec: 1,
            timeout_ms: None,
            md: 1,
        },
        Cmd::ClientSend {
            call: Pick(0),
            len: 100_000,
            end_stream: false,
        },
        Cmd::ServerSend {
            call: Pick(0),
            len: 70_000,
        },
        Cmd::ClientSend {
            call: Pick(0),
            len: 10,
            end_stream: true,
        },
    ];
    for auto_grant in [false, true] {
        let h = run(small, small, auto_grant, false, &cmds);
        let c = &h.ccalls[&1];
        assert_eq!(h.scalls[&1].received.len(), c.sent.len());
        assert_eq!(c.received.len(), h.scalls[&1].sent.len());
    }
}

/// An established client/server pair with one call open on both sides.
fn one_call(cs: Settings, ss: Settings) -> Harness {
    let mut h = Harness::new(cs, ss, true);
    h.pump();
    h.run(&Cmd::Start {
        method: 0,
        codec: 0,
        timeout_ms: None,
        md: 0,
    });
    h.pump();
    assert_eq!(h.open_server_calls(), [1]);
    h
}

/// Regression (was an engine bug): `end_call` refused every END when the client's
/// `max_metadata_size` was below 4 (the size of an empty END). protocol.md §4 now makes 4 the
/// smallest valid value, so the smallest END always fits and a call can always be ended.
#[test]
fn a_call_can_always_be_ended() {
    let cs = Settings::default().with_max_metadata_size(4);
    let mut h = one_call(cs, Settings::default());
    let r = h
        .server
        .end_call(CallId(1), &Status::ok(), &Metadata::new());
    assert_eq!(r, Ok(()), "the server cannot end call 1");
}

/// Regression (was an engine bug): protocol.md §5.6 and §9 limit END's "msg_len + metadata size" (message
/// bytes plus the trailers block) by the client's `max_metadata_size`; the engine counts 2
/// more bytes (the msg_len field) on both sides, so a conforming END of exactly the limit is
/// refused by `end_call`, and when another implementation sends it, reported by the client as
/// RESOURCE_EXHAUSTED instead of its status.
#[test]
fn end_within_the_metadata_limit_is_accepted() {
    let cs = Settings::default().with_max_metadata_size(10);
    // 2 (msg_len) + 6 message bytes + 2 bytes of empty trailers = 10 = the client's limit.
    let status = Status::new(Code::NotFound, "123456");

    let mut h = one_call(cs, Settings::default());
    let sent = h.server.end_call(CallId(1), &status, &Metadata::new());

    // What the client does with such an END from any server.
    let mut h = one_call(cs, Settings::default());
    let mut end = BytesMut::new();
    topspin_proto::frame::Frame::End(topspin_proto::frame::EndFrame {
        call_id: CallId(1),
        code: Code::NotFound,
        message: "123456".into(),
        trailers: Metadata::new(),
    })
    .encode(&mut end);
    h.client.handle_input(&mut end, h.now).unwrap();
    let got = h.client.poll_event();

    assert_eq!(sent, Ok(()), "end_call refused an END within the limit");
    assert!(
        matches!(&got, Some(Event::Ended { status: s, .. }) if *s == status),
        "client reported {got:?}"
    );
}

/// Regression (was an engine bug): `grant_credit` caps a grant at `MAX_WINDOW - recv_window`, which is
/// above 2^31 - 1 while the call is overdrawn (recv_window < 0), and sends it as one CREDIT
/// frame; the peer rejects the increment (protocol.md §5.8: 1 ..= 2147483647) with
/// MALFORMED_FRAME and the connection dies. Here: window 1, one empty message (cost 12, window
/// now -11), then a grant of 2^31 = 12 owed + 2147483636.
#[test]
fn huge_grant_on_an_overdrawn_call_is_a_valid_credit() {
    let cs = Settings::default().with_initial_call_window(1);
    let mut h = one_call(cs, Settings::default());
    h.auto_grant = false;
    h.run(&Cmd::ServerSend {
        call: Pick(0),
        len: 0,
    });
    h.pump();
    h.client.grant_credit(CallId(1), 1 << 31).unwrap();
    h.collect_transmit();
    let mut dec = topspin_proto::frame::FrameDecoder::new(1 << 20);
    while let Some(f) = dec
        .decode(&mut h.to_server)
        .expect("the client sent an invalid frame")
    {
        if let topspin_proto::frame::Frame::Credit { increment, .. } = f {
            assert!(increment <= MAX_WINDOW, "CREDIT increment {increment}");
        }
    }
}

/// Regression (was an engine bug): `start_call` with a timeout of `Duration::MAX` (a common "no deadline"
/// sentinel) panics computing `now + timeout` ("overflow when adding duration to instant").
#[test]
fn start_call_with_a_huge_timeout_does_not_panic() {
    let mut h = Harness::new(Settings::default(), Settings::default(), true);
    h.pump();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        h.client
            .start_call("/a.A/One", 0, Some(Duration::MAX), &Metadata::new(), h.now)
            .map(|_| ())
    }));
    assert!(matches!(r, Ok(Ok(()))), "start_call panicked or failed");
}

/// Regression (was an engine bug, unbounded memory): a call's deadline stays in the deadline heap after the
/// call ends, until the deadline passes. A client that repeats CALL with `timeout_us` =
/// u64::MAX (about 584 000 years) + CANCEL grows the server's heap by one entry per call for
/// ever, whatever MAX_CONCURRENT_CALLS is; `poll_timeout` also keeps reporting the deadline
/// of a call that is over.
#[test]
fn deadlines_of_ended_calls_are_forgotten() {
    let mut h = Harness::new(Settings::default(), Settings::default(), true);
    h.pump();
    for _ in 0..3 {
        h.run(&Cmd::Start {
            method: 0,
            codec: 0,
            timeout_ms: Some(1),
            md: 0,
        });
        h.run(&Cmd::Cancel {
            call: Pick(0),
            code: 0,
        });
        h.pump();
    }
    assert_eq!(h.client.open_calls() + h.server.open_calls(), 0);
    assert_eq!(
        h.server.poll_timeout(),
        None,
        "server still has a deadline to wait for"
    );
    assert_eq!(
        h.client.poll_timeout(),
        None,
        "client still has a deadline to wait for"
    );
}

/// A PING answer: it answers a PING still waiting, and every one sent before it (those the
/// peer received while an earlier answer was unsent shared that answer).
fn pong(waiting: &mut std::collections::VecDeque<[u8; 8]>, data: [u8; 8]) {
    let pos = waiting.iter().position(|d| *d == data);
    let pos = pos.unwrap_or_else(|| panic!("PONG {data:?} answers no waiting PING"));
    waiting.drain(..=pos);
}
