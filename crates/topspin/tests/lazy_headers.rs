//! Streaming calls against a server that sends its response headers late (protocol.md §5.4,
//! §6): with its first message or its END, as the Go, Node and Python servers do — never when
//! the call starts. A client call returns as soon as it is started; the headers come through
//! `Streaming::headers`. (A Rust topspin server sends HEADERS as its streaming handler starts,
//! so the server here is a fake peer on the sans-IO engine.)

mod common;

use bytes::{Bytes, BytesMut};
use common::{feed, within};
use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, Notify};
use topspin::codec::RawCodec;
use topspin::{Channel, Code, Request};
use topspin_proto::{CallId, Connection, Event, Metadata, Settings, Side};

/// Bidi: echoes each request, no HEADERS; ends OK at the client's half-close.
const ECHO: &str = "/fake.F/Echo";
/// Bidi: HEADERS `h: 1` with the first answer, then echoes.
const HEADED: &str = "/fake.F/Headed";
/// Bidi: HEADERS `topspin-encoding: gzip` with the first answer, then the request gzipped.
const ZIPPED: &str = "/fake.F/Zipped";
/// Bidi: HEADERS `topspin-encoding: br` (which no topspin side decodes) with the first answer.
const BROTLI: &str = "/fake.F/Brotli";
/// Server streaming: nothing until the test publishes.
const QUIET: &str = "/fake.F/Quiet";
/// Server streaming: END NOT_FOUND at once, no HEADERS.
const MISSING: &str = "/fake.F/Missing";

struct Fake {
    addr: String,
    publish: broadcast::Sender<Bytes>,
    /// Notified as a QUIET call starts.
    subscribed: Arc<Notify>,
}

/// A topspin server of a few hand-written methods (see the constants above).
async fn fake_server() -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("tcp://{}", listener.local_addr().unwrap());
    let (publish, _) = broadcast::channel(16);
    let subscribed = Arc::new(Notify::new());
    let (p, n) = (publish.clone(), subscribed.clone());
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(serve(sock, p.subscribe(), n.clone()));
        }
    });
    Fake {
        addr,
        publish,
        subscribed,
    }
}

async fn serve(
    mut sock: TcpStream,
    mut published: broadcast::Receiver<Bytes>,
    subscribed: Arc<Notify>,
) {
    let mut conn = Connection::new(Side::Server, Settings::default());
    let mut calls: HashMap<CallId, (String, bool)> = HashMap::new();
    let mut input = BytesMut::with_capacity(64 * 1024);
    loop {
        while let Some(b) = conn.poll_transmit() {
            if sock.write_all(&b).await.is_err() {
                return;
            }
        }
        tokio::select! {
            r = sock.read_buf(&mut input) => match r {
                Ok(n) if n > 0 => {
                    if conn.handle_input(&mut input, Instant::now()).is_err() {
                        return;
                    }
                }
                _ => return,
            },
            m = published.recv() => {
                let Ok(m) = m else { return };
                for (id, (method, _)) in &calls {
                    if method == QUIET {
                        conn.send_message(*id, m.clone(), false).unwrap();
                    }
                }
            }
        }
        while let Some(ev) = conn.poll_event() {
            answer(&mut conn, &mut calls, ev, &subscribed);
        }
    }
}

fn answer(
    conn: &mut Connection,
    calls: &mut HashMap<CallId, (String, bool)>,
    ev: Event,
    subscribed: &Notify,
) {
    match ev {
        Event::CallStarted { id, method, .. } => {
            if &*method == MISSING {
                let st = topspin_proto::Status::not_found("no such key");
                conn.end_call(id, &st, &Metadata::new()).unwrap();
            } else {
                if &*method == QUIET {
                    subscribed.notify_one();
                }
                calls.insert(id, (method.to_string(), false));
            }
        }
        Event::Message {
            id,
            message,
            credit,
        } => {
            conn.grant_credit(id, credit).unwrap();
            let Some((method, answered)) = calls.get_mut(&id) else {
                return;
            };
            if method == QUIET {
                return; // the subscription request: answered only by what is published
            }
            let first = !std::mem::replace(answered, true);
            match method.as_str() {
                HEADED if first => {
                    let md = Metadata::builder().text("h", "1").unwrap().build();
                    conn.send_headers(id, &md).unwrap();
                }
                ZIPPED | BROTLI if first => {
                    let name = if method == ZIPPED { "gzip" } else { "br" };
                    let md = Metadata::builder()
                        .text("topspin-encoding", name)
                        .unwrap()
                        .build();
                    conn.send_headers(id, &md).unwrap();
                }
                _ => {}
            }
            let reply = if method == ZIPPED {
                gzipped(&message)
            } else {
                message
            };
            conn.send_message(id, reply, false).unwrap();
        }
        Event::HalfClosed { id } => {
            match calls.get(&id) {
                Some((m, _)) if m == QUIET => return, // a subscription lasts
                None => return,                       // ended already
                Some(_) => calls.remove(&id),
            };
            conn.end_call(id, &topspin_proto::Status::ok(), &Metadata::new())
                .unwrap();
        }
        Event::Cancelled { id, .. } => {
            calls.remove(&id);
        }
        _ => {}
    }
}

/// A compressed message payload (protocol.md §15): flag byte 1, then gzip.
fn gzipped(m: &[u8]) -> Bytes {
    let mut out = vec![1u8];
    let mut z = flate2::write::GzEncoder::new(&mut out, flate2::Compression::fast());
    z.write_all(m).unwrap();
    z.finish().unwrap();
    Bytes::from(out)
}

async fn channel(fake: &Fake) -> Channel {
    Channel::connect(fake.addr.as_str()).await.unwrap()
}

#[tokio::test]
async fn bidi_call_returns_before_the_server_says_anything() {
    let fake = fake_server().await;
    let ch = channel(&fake).await;
    let (tx, requests) = feed();
    // The server answers only once it has a request: the call must be in the caller's hands
    // before any response header exists.
    let resp = within(5, ch.streaming(RawCodec, ECHO, Request::new(requests)))
        .await
        .unwrap();
    assert!(resp.metadata().is_empty());
    let mut s = resp.into_inner();
    assert!(s.received_headers().is_none());
    tx.send(Bytes::from("hi")).unwrap();
    assert_eq!(
        within(5, s.message()).await.unwrap(),
        Some(Bytes::from("hi"))
    );
    // The server sent no HEADERS: its headers are empty.
    assert!(s.received_headers().is_some_and(|h| h.is_empty()));
    assert!(within(5, s.headers()).await.unwrap().is_empty());
    drop(tx);
    assert_eq!(within(5, s.message()).await.unwrap(), None);
}

#[tokio::test]
async fn subscribing_to_a_quiet_stream_returns_at_once() {
    let fake = fake_server().await;
    let ch = channel(&fake).await;
    let resp = within(5, ch.server_streaming(RawCodec, QUIET, Bytes::from("sub")))
        .await
        .unwrap();
    let mut s = resp.into_inner();
    // Published after the subscription returned, once the call reached the server.
    within(5, fake.subscribed.notified()).await;
    fake.publish.send(Bytes::from("news")).unwrap();
    assert_eq!(
        within(5, s.message()).await.unwrap(),
        Some(Bytes::from("news"))
    );
}

#[tokio::test]
async fn headers_sent_with_the_first_message_are_visible() {
    let fake = fake_server().await;
    let ch = channel(&fake).await;
    let (tx, requests) = feed();
    let mut s = within(5, ch.streaming(RawCodec, HEADED, Request::new(requests)))
        .await
        .unwrap()
        .into_inner();
    tx.send(Bytes::from("one")).unwrap();
    // Waiting for the headers alone: they come with the first answer.
    let h = within(5, s.headers()).await.unwrap();
    assert_eq!(h.get("h"), Some(&b"1"[..]));
    assert_eq!(
        within(5, s.message()).await.unwrap(),
        Some(Bytes::from("one"))
    );
    assert_eq!(
        s.received_headers().and_then(|h| h.get("h")),
        Some(&b"1"[..])
    );
    tx.send(Bytes::from("two")).unwrap();
    assert_eq!(
        within(5, s.message()).await.unwrap(),
        Some(Bytes::from("two"))
    );
}

#[tokio::test]
async fn late_encoding_header_still_decodes_the_stream() {
    let fake = fake_server().await;
    let ch = channel(&fake).await;
    let (tx, requests) = feed();
    let mut s = within(5, ch.streaming(RawCodec, ZIPPED, Request::new(requests)))
        .await
        .unwrap()
        .into_inner();
    let big = Bytes::from(vec![b'z'; 10_000]);
    tx.send(big.clone()).unwrap();
    tx.send(Bytes::from("small")).unwrap();
    assert_eq!(within(5, s.message()).await.unwrap(), Some(big));
    assert_eq!(
        within(5, s.message()).await.unwrap(),
        Some(Bytes::from("small"))
    );
}

#[tokio::test]
async fn a_late_encoding_this_side_lacks_fails_the_stream() {
    let fake = fake_server().await;
    let ch = channel(&fake).await;
    let (tx, requests) = feed();
    let mut s = within(5, ch.streaming(RawCodec, BROTLI, Request::new(requests)))
        .await
        .unwrap()
        .into_inner();
    tx.send(Bytes::from("x")).unwrap();
    let e = within(5, s.message()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{e}");
    assert_eq!(within(5, s.message()).await.unwrap(), None);
    // That call was cancelled; the channel goes on.
    let (tx, requests) = feed();
    let mut s = within(5, ch.streaming(RawCodec, ECHO, Request::new(requests)))
        .await
        .unwrap()
        .into_inner();
    tx.send(Bytes::from("ok")).unwrap();
    assert_eq!(
        within(5, s.message()).await.unwrap(),
        Some(Bytes::from("ok"))
    );
}

#[tokio::test]
async fn a_failure_before_any_message_reaches_the_stream() {
    let fake = fake_server().await;
    let ch = channel(&fake).await;
    let mut s = within(5, ch.server_streaming(RawCodec, MISSING, Bytes::new()))
        .await
        .unwrap()
        .into_inner();
    let e = within(5, s.headers()).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    let e = within(5, s.message()).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    assert_eq!(e.message(), "no such key");
    assert_eq!(within(5, s.message()).await.unwrap(), None);
}

/// A gRPC server (HTTP/2 from h2) whose bidi method sends its response headers only with its
/// first answer, as grpc-go does unless a handler calls `SendHeader`: it echoes each request.
async fn late_grpc_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("grpc://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(sock).await else {
                    return;
                };
                while let Some(Ok((req, respond))) = conn.accept().await {
                    tokio::spawn(grpc_echo(req, respond));
                }
            });
        }
    });
    addr
}

async fn grpc_echo(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) {
    let mut body = req.into_body();
    let mut out = None;
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        if out.is_none() {
            let head = http::Response::builder()
                .header("content-type", "application/grpc")
                .header("x-late", "yes")
                .body(())
                .unwrap();
            out = Some(respond.send_response(head, false).unwrap());
        }
        // Each request arrives whole (the client writes a message as one frame): the
        // length-prefixed message goes back as it came.
        if let Some(out) = out.as_mut() {
            out.send_data(chunk, false).unwrap();
        }
    }
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    match out.as_mut() {
        Some(out) => out.send_trailers(trailers).unwrap(),
        None => {
            let head = http::Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", "0")
                .body(())
                .unwrap();
            respond.send_response(head, true).unwrap();
        }
    }
}

#[tokio::test]
async fn grpc_mode_bidi_call_returns_before_the_server_says_anything() {
    let ch = Channel::connect(late_grpc_server().await).await.unwrap();
    let (tx, requests) = feed();
    let mut s = within(5, ch.streaming(RawCodec, ECHO, Request::new(requests)))
        .await
        .unwrap()
        .into_inner();
    tx.send(Bytes::from("hi")).unwrap();
    assert_eq!(
        within(5, s.message()).await.unwrap(),
        Some(Bytes::from("hi"))
    );
    let h = within(5, s.headers()).await.unwrap();
    assert_eq!(h.get_str("x-late"), Some("yes"));
    drop(tx);
    assert_eq!(within(5, s.message()).await.unwrap(), None);
}
