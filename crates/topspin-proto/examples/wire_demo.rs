//! Two protocol engines talking in memory: a unary call and a bidirectional stream, with every
//! frame that crosses the "wire" printed as it goes. No sockets: this is the sans-IO core alone.
//!
//! Run: `cargo run -p topspin-proto --example wire_demo`

use bytes::{Bytes, BytesMut};
use std::time::Instant;
use topspin_proto::frame::{Frame, FrameDecoder, HEADER_LEN};
use topspin_proto::preface::PREFACE_LEN;
use topspin_proto::{Code, Connection, Event, Metadata, Settings, Side, Status};

struct Wire {
    client: Connection,
    server: Connection,
    now: Instant,
    bytes: [usize; 2],
    frames: [usize; 2],
}

fn describe(f: &Frame) -> String {
    match f {
        Frame::Settings(s) => format!(
            "max_frame={} max_calls={} window={} max_message={} max_metadata={}",
            s.max_frame_size(),
            s.max_concurrent_calls(),
            s.initial_call_window(),
            s.max_message_size(),
            s.max_metadata_size()
        ),
        Frame::Call(c) => format!(
            "method_id={} name={:?} codec={} timeout_us={} metadata={:?}",
            c.method_id,
            c.method_name.as_deref(),
            c.codec,
            c.timeout_us,
            c.metadata
        ),
        Frame::Message(m) => format!(
            "{:?}{}{}",
            String::from_utf8_lossy(&m.chunk),
            if m.end_stream { " END_STREAM" } else { "" },
            m.total_len
                .map(|t| format!(" SPLIT total={t}"))
                .unwrap_or_default()
        ),
        Frame::Headers { metadata, .. } => format!("{metadata:?}"),
        Frame::End(e) => format!("{} {:?} trailers={:?}", e.code, &*e.message, e.trailers),
        Frame::Cancel { code, .. } => code.to_string(),
        Frame::Credit { increment, .. } => format!("+{increment}"),
        other => format!("{other:?}"),
    }
}

impl Wire {
    /// Moves bytes both ways until quiet, printing each frame; returns events of both sides.
    fn pump(&mut self) -> (Vec<Event>, Vec<Event>) {
        loop {
            let mut moved = false;
            for dir in 0..2 {
                let (from, to, arrow) = if dir == 0 {
                    (&mut self.client, &mut self.server, "client → server")
                } else {
                    (&mut self.server, &mut self.client, "server → client")
                };
                let mut wire = BytesMut::new();
                while let Some(b) = from.poll_transmit() {
                    wire.extend_from_slice(&b);
                }
                if wire.is_empty() {
                    continue;
                }
                moved = true;
                self.bytes[dir] += wire.len();
                // Print what is on the wire, then deliver it.
                let mut view = wire.clone();
                if view.starts_with(b"TOPSPIN") {
                    println!("{arrow}  PREFACE       {:02x?}", &view[..PREFACE_LEN]);
                    let _ = view.split_to(PREFACE_LEN);
                }
                let mut dec = FrameDecoder::new(u32::MAX >> 1);
                while let Ok(Some(f)) = dec.decode(&mut view) {
                    self.frames[dir] += 1;
                    println!(
                        "{arrow}  {:<13} {:<7} {:>4} B  {}",
                        f.frame_type().name(),
                        f.call_id().0,
                        HEADER_LEN + f.payload_len(),
                        describe(&f)
                    );
                }
                to.handle_input(&mut wire, self.now)
                    .expect("valid protocol");
            }
            if !moved {
                break;
            }
        }
        let mut c = Vec::new();
        let mut s = Vec::new();
        while let Some(e) = self.client.poll_event() {
            c.push(e);
        }
        while let Some(e) = self.server.poll_event() {
            s.push(e);
        }
        (c, s)
    }
}

fn main() {
    let mut w = Wire {
        client: Connection::new(Side::Client, Settings::default()),
        server: Connection::new(Side::Server, Settings::default()),
        now: Instant::now(),
        bytes: [0; 2],
        frames: [0; 2],
    };
    println!("direction        frame         call    size  fields");
    println!("— handshake —");
    w.pump();

    println!("— unary call: /kv.Store/Get —");
    let md = Metadata::builder().text("user", "ann").unwrap().build();
    let id = w
        .client
        .start_call("/kv.Store/Get", 1, None, &md, w.now)
        .unwrap();
    w.client
        .send_message(id, Bytes::from_static(b"apple"), true)
        .unwrap();
    let (_, server_events) = w.pump();
    for e in server_events {
        if let Event::Message { id, message, .. } = e {
            let reply = Bytes::from(format!("{} is red", String::from_utf8_lossy(&message)));
            w.server.send_message(id, reply, false).unwrap();
            w.server
                .end_call(id, &Status::ok(), &Metadata::new())
                .unwrap();
        }
    }
    let (client_events, _) = w.pump();
    for e in &client_events {
        println!("  client event: {e:?}");
    }

    println!("— bidirectional stream: /chat.Chat/Talk (same method twice: interned id) —");
    for round in 0..2 {
        let id = w
            .client
            .start_call("/chat.Chat/Talk", 1, None, &Metadata::new(), w.now)
            .unwrap();
        w.client
            .send_message(id, Bytes::from(format!("hello {round}")), false)
            .unwrap();
        w.client
            .send_message(id, Bytes::from(format!("bye {round}")), false)
            .unwrap();
        w.client.half_close(id).unwrap();
        let (_, events) = w.pump();
        for e in events {
            match e {
                Event::Message { id, message, .. } => {
                    w.server
                        .send_message(id, Bytes::from([b"echo: ", &message[..]].concat()), false)
                        .unwrap();
                }
                Event::HalfClosed { id } => {
                    w.server
                        .end_call(id, &Status::new(Code::Ok, "bye"), &Metadata::new())
                        .unwrap();
                }
                _ => {}
            }
        }
        w.pump();
    }

    println!("— ping —");
    w.client.ping(*b"12345678");
    w.pump();
    println!(
        "total: client → server {} frames, {} bytes; server → client {} frames, {} bytes",
        w.frames[0], w.bytes[0], w.frames[1], w.bytes[1]
    );
}
