//! The server takes a unary call's request whichever way its frames arrive: CALL, MESSAGE and
//! HALF_CLOSE together (the fast path, the call never parks), interleaved with other calls,
//! split over several writes, with no request or with two (the errors of protocol.md).
//! Hand-written frames over a real TCP socket.

mod common;

use common::*;
use std::collections::HashMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use topspin::Code;
use topspin_proto::frame::{CallFrame, EndFrame, Frame, FrameDecoder, MessageFrame};
use topspin_proto::preface::PREFACE;
use topspin_proto::{CallId, Settings};

fn hello() -> Vec<u8> {
    let mut v = PREFACE.to_vec();
    v.extend_from_slice(&Frame::Settings(Settings::default()).to_bytes());
    v
}

fn call(id: u32) -> Vec<u8> {
    Frame::Call(CallFrame {
        call_id: CallId(id),
        method_id: 0,
        method_name: Some(bytestring::ByteString::from_static(UNARY)),
        codec: 1,
        timeout_us: 0,
        metadata: topspin::Metadata::new(),
    })
    .to_bytes()
    .to_vec()
}

fn message(id: u32, body: &'static [u8], end: bool) -> Vec<u8> {
    Frame::Message(MessageFrame {
        call_id: CallId(id),
        end_stream: end,
        total_len: None,
        chunk: bytes::Bytes::from_static(body),
    })
    .to_bytes()
    .to_vec()
}

fn half_close(id: u32) -> Vec<u8> {
    Frame::HalfClose {
        call_id: CallId(id),
    }
    .to_bytes()
    .to_vec()
}

/// Connects, then writes each chunk with its own write (flushed) in order.
async fn connect(server: &TestServer) -> TcpStream {
    let topspin::Address::Tcp(hp) = &server.addr else {
        panic!("not tcp");
    };
    let mut sock = TcpStream::connect(hp.as_str()).await.unwrap();
    sock.write_all(&hello()).await.unwrap();
    sock
}

/// Reads until `n` calls have ended: each call's response message (if any) and END.
async fn ends(sock: &mut TcpStream, n: usize) -> HashMap<u32, (Option<Vec<u8>>, EndFrame)> {
    let mut out: HashMap<u32, (Option<Vec<u8>>, Option<EndFrame>)> = HashMap::new();
    let mut buf = bytes::BytesMut::new();
    let mut dec = FrameDecoder::new(u32::MAX >> 1);
    let mut seen_preface = false;
    within(10, async {
        while out.values().filter(|(_, e)| e.is_some()).count() < n {
            let got = sock.read_buf(&mut buf).await.unwrap();
            assert!(got > 0, "server closed");
            if !seen_preface && buf.len() >= 8 {
                let _ = buf.split_to(8);
                seen_preface = true;
            }
            while let Ok(Some(f)) = dec.decode(&mut buf) {
                match f {
                    Frame::Message(m) => {
                        out.entry(m.call_id.0).or_default().0 = Some(m.chunk.to_vec());
                    }
                    Frame::End(e) => {
                        let id = e.call_id.0;
                        out.entry(id).or_default().1 = Some(e);
                    }
                    _ => {}
                }
            }
        }
    })
    .await;
    out.into_iter()
        .filter_map(|(id, (m, e))| Some((id, (m, e?))))
        .collect()
}

#[tokio::test]
async fn a_unary_request_is_answered_whichever_way_its_frames_arrive() {
    let server = serve(builder(Probe::default()), Transport::Tcp).await;
    let mut sock = connect(&server).await;
    // Call 1: CALL + MESSAGE(end) in one write (the fast path).
    let mut w = call(1);
    w.extend(message(1, b"one", true));
    // Call 3: CALL + MESSAGE + HALF_CLOSE as separate frames, interleaved with call 5.
    w.extend(call(3));
    w.extend(call(5));
    w.extend(message(3, b"three", false));
    w.extend(message(5, b"five", true));
    w.extend(half_close(3));
    sock.write_all(&w).await.unwrap();
    // Call 7: its request in a later write than its start.
    sock.write_all(&call(7)).await.unwrap();
    sock.flush().await.unwrap();
    sock.write_all(&message(7, b"seven", true)).await.unwrap();
    let got = ends(&mut sock, 4).await;
    for (id, body) in [(1, &b"one"[..]), (3, b"three"), (5, b"five"), (7, b"seven")] {
        let (m, end) = &got[&id];
        assert_eq!(end.code, Code::Ok, "call {id}: {}", end.message);
        assert_eq!(m.as_deref(), Some(body), "call {id}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_unary_call_with_two_requests_or_none_fails_alone() {
    let server = serve(builder(Probe::default()), Transport::Tcp).await;
    let mut sock = connect(&server).await;
    // Call 1: two messages right after its start; call 3: a half-close and no message;
    // call 5: a good one after them, in the same write.
    let mut w = call(1);
    w.extend(message(1, b"a", false));
    w.extend(message(1, b"b", true));
    w.extend(call(3));
    w.extend(half_close(3));
    w.extend(call(5));
    w.extend(message(5, b"fine", true));
    sock.write_all(&w).await.unwrap();
    let got = ends(&mut sock, 3).await;
    let (_, e1) = &got[&1];
    assert_eq!(e1.code, Code::InvalidArgument);
    assert!(e1.message.contains("got more"), "{}", e1.message);
    let (_, e3) = &got[&3];
    assert_eq!(e3.code, Code::InvalidArgument);
    assert!(e3.message.contains("got none"), "{}", e3.message);
    let (m5, e5) = &got[&5];
    assert_eq!(e5.code, Code::Ok, "{}", e5.message);
    assert_eq!(m5.as_deref(), Some(&b"fine"[..]));
    server.stop().await;
}
