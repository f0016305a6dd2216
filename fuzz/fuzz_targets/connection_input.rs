//! A server-role or client-role Connection fed arbitrary bytes after a valid preface and
//! SETTINGS, in arbitrary chunk sizes, while a simple application answers its events. It must
//! never panic, keep its memory bounded, leave at most one partial frame in the receive
//! buffer, and transmit only well-formed frames.
//!
//! Input layout: byte 0 = options (bit 0: client role; bit 1: grant credit back; bit 2:
//! answer calls; bits 3..: chunking seed), byte 1 = which peer SETTINGS to announce, then the
//! bytes that follow the peer's SETTINGS frame on the wire. Without the two option bytes, the
//! rest of a corpus file is a raw frame stream, so test vectors make good seeds.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};
use topspin_proto::connection::{Connection, Event, Side};
use topspin_proto::frame::{Frame, FrameDecoder, HEADER_LEN};
use topspin_proto::preface::{PREFACE, PREFACE_LEN};
use topspin_proto::{Code, Limits, MemoryBudget, Metadata, Rate, Settings, Status};

/// This side's limits: small enough that a hostile peer can reach every limit and that what
/// it can make the engine hold stays small (8 calls × 256 KiB messages at most).
fn local_settings() -> Settings {
    Settings::default()
        .with_max_frame_size(16 * 1024)
        .with_max_concurrent_calls(8)
        .with_initial_call_window(64 * 1024)
        .with_max_message_size(256 * 1024)
        .with_max_metadata_size(4096)
}

fn peer_settings(choice: u8) -> Settings {
    match choice % 3 {
        0 => Settings::default(),
        1 => Settings::default()
            .with_max_frame_size(16 * 1024)
            .with_max_concurrent_calls(2)
            .with_initial_call_window(100)
            .with_max_message_size(40 * 1024)
            .with_max_metadata_size(64),
        _ => Settings::default()
            .with_max_concurrent_calls(0)
            .with_initial_call_window(0)
            .with_max_message_size(0)
            .with_max_metadata_size(4),
    }
}

/// Checks everything the engine wants to send parses as frames within the peer's limits.
struct OutputChecker {
    buf: BytesMut,
    preface_seen: bool,
    decoder: FrameDecoder,
    frames: usize,
}

impl OutputChecker {
    fn new(peer: &Settings) -> OutputChecker {
        OutputChecker {
            buf: BytesMut::new(),
            preface_seen: false,
            decoder: FrameDecoder::new(peer.max_frame_size()),
            frames: 0,
        }
    }

    fn drain(&mut self, conn: &mut Connection) {
        while let Some(b) = conn.poll_transmit() {
            self.buf.extend_from_slice(&b);
        }
        assert_eq!(conn.transmit_len(), 0);
        if !self.preface_seen {
            if self.buf.len() < PREFACE_LEN {
                return;
            }
            assert_eq!(&self.buf[..PREFACE_LEN], &PREFACE[..]);
            let _ = self.buf.split_to(PREFACE_LEN);
            self.preface_seen = true;
        }
        loop {
            match self.decoder.decode(&mut self.buf) {
                Ok(Some(f)) => {
                    if self.frames == 0 {
                        assert!(matches!(f, Frame::Settings(_)), "first frame {f:?}");
                    }
                    self.frames += 1;
                }
                Ok(None) => break,
                Err(e) => panic!("the engine transmitted an invalid frame: {e}"),
            }
        }
    }
}

/// A tiny deterministic generator for chunk sizes and choices.
struct Rng(u32);

impl Rng {
    fn next(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.0 = x;
        x
    }
}

fn answer(conn: &mut Connection, event: &Event, grant: bool, respond: bool, now: Instant) {
    match event {
        Event::Message {
            id,
            message,
            credit,
        } => {
            if grant {
                let _ = conn.grant_credit(*id, *credit);
            }
            if respond {
                let _ = conn.send_message(*id, message.clone(), false);
            }
        }
        Event::CallStarted { id, .. } if respond => {
            let md = Metadata::builder()
                .text("x", "y")
                .expect("valid metadata")
                .build();
            let _ = conn.send_headers(*id, &md);
        }
        Event::HalfClosed { id } if respond => {
            let _ = conn.end_call(*id, &Status::new(Code::Ok, "done"), &Metadata::new());
        }
        Event::Headers { id, .. } if respond => {
            let _ = conn.half_close(*id);
        }
        Event::Writable { id } if respond => {
            let _ = conn.send_message(*id, Bytes::from_static(b"more"), false);
        }
        Event::Established if conn.side() == Side::Client => {
            // Open a few calls for the hostile server to answer (ids 1, 2, 3).
            for (i, timeout) in [None, Some(Duration::from_millis(5)), None]
                .into_iter()
                .enumerate()
            {
                let method = if i == 1 { "/b.B/B" } else { "/a.A/A" };
                if let Ok(id) = conn.start_call(method, 0, timeout, &Metadata::new(), now) {
                    let _ = conn.send_message(id, Bytes::from_static(b"hello"), i == 2);
                }
            }
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let (opts, choice, rest) = match data {
        [o, c, rest @ ..] => (*o, *c, rest),
        _ => (0, 0, data),
    };
    let side = if opts & 1 != 0 {
        Side::Client
    } else {
        Side::Server
    };
    let grant = opts & 2 != 0;
    let respond = opts & 4 != 0;
    let mut rng = Rng(u32::from(opts >> 3).wrapping_mul(2_654_435_761) | 1);
    let local = local_settings();
    let peer = peer_settings(choice);

    let mut conn = Connection::new(side, local);
    // A small shared memory budget, so that refusing calls and withholding chunk credit are
    // reached too; small flood budgets likewise.
    let budget = MemoryBudget::new(200 * 1024);
    conn.set_memory_budget(budget.clone());
    conn.set_limits(
        Limits::default()
            .with_ping_rate(Rate::new(8, Duration::from_millis(10)))
            .with_rapid_reset_rate(Rate::new(8, Duration::from_millis(10)))
            .with_refused_call_rate(Rate::new(8, Duration::from_millis(10))),
    );
    let mut out = OutputChecker::new(&peer);
    let mut now = Instant::now();

    let mut input = BytesMut::new();
    input.extend_from_slice(&PREFACE);
    Frame::Settings(peer).encode(&mut input);
    conn.handle_input(&mut input, now)
        .expect("a valid preface and SETTINGS");
    assert!(input.is_empty());
    assert!(conn.is_established());

    let mut at = 0;
    let mut failed = false;
    loop {
        // Let the application react to what happened, and take what it wants to send.
        while let Some(ev) = conn.poll_event() {
            if let Event::Closed { .. } = ev {
                assert!(conn.is_closed());
            }
            answer(&mut conn, &ev, grant, respond, now);
        }
        out.drain(&mut conn);
        if side == Side::Server {
            assert!(conn.open_calls() <= local.max_concurrent_calls() as usize);
        } else {
            assert!(conn.open_calls() <= 3);
        }
        if at >= rest.len() || failed {
            break;
        }

        let r = rng.next();
        let n = match r % 8 {
            0 => rest.len() - at,
            1..=3 => 1 + (r >> 8) as usize % 4,
            _ => 1 + (r >> 8) as usize % 64,
        };
        let to = (at + n).min(rest.len());
        input.extend_from_slice(&rest[at..to]);
        at = to;
        match conn.handle_input(&mut input, now) {
            Ok(()) => {
                // At most one partial frame is left waiting.
                assert!(input.len() < HEADER_LEN + local.max_frame_size() as usize);
            }
            Err(e) => {
                assert!(conn.is_closed(), "{e}");
                assert!(conn.handle_input(&mut BytesMut::new(), now).is_err());
                failed = true;
            }
        }
        if r & 0x1000 != 0 {
            now += Duration::from_millis(u64::from(r >> 28));
            conn.handle_timeout(now);
        }
    }
    // Incomplete split messages are charged to the budget, and given back with the connection.
    drop(conn);
    assert_eq!(budget.used(), 0, "the connection left charges in the memory budget");
});
