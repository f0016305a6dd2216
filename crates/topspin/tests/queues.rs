//! Queues are bounded and deadlines run while calls wait in them (regression tests for the
//! "one engine" reshaping: an unbounded write queue and a parked call that ignored its
//! deadline).

use bytes::{Bytes, BytesMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use topspin::codec::RawCodec;
use topspin::{Channel, Code, Request, Response, Server};
use topspin_proto::frame::{CallFrame, Frame, MessageFrame};
use topspin_proto::preface::PREFACE;
use topspin_proto::{CallId, Metadata, Settings};

#[tokio::test]
async fn a_call_waiting_for_the_servers_concurrency_limit_keeps_its_deadline() {
    let server = Server::builder()
        .max_concurrent_calls(1)
        .unary("/t.S/Slow", RawCodec, |r: Request<Bytes>| async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Ok(Response::new(r.into_inner()))
        })
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind");
    let addr = server.local_addr().clone();
    tokio::spawn(server.serve());
    let ch = Channel::connect(addr).await.expect("connect");
    // Takes the only slot for 3 s.
    let busy = tokio::spawn({
        let ch = ch.clone();
        async move { ch.unary(RawCodec, "/t.S/Slow", Bytes::new()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t0 = Instant::now();
    let err = ch
        .unary(
            RawCodec,
            "/t.S/Slow",
            Request::new(Bytes::new()).with_timeout(Duration::from_millis(200)),
        )
        .await
        .expect_err("the parked call's deadline passes");
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    // Generous: the point is that it does not wait for the busy call (3 s).
    assert!(
        t0.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t0.elapsed()
    );
    busy.abort();
}

/// Frames of `n` unary calls, each a CALL (method interned after the first) and its one
/// request message.
fn calls(n: u32) -> BytesMut {
    let mut b = BytesMut::new();
    b.extend_from_slice(&PREFACE);
    Frame::Settings(Settings::default()).encode(&mut b);
    for id in 1..=n {
        Frame::Call(CallFrame {
            call_id: CallId(id),
            method_id: 1,
            method_name: (id == 1).then(|| "/t.S/Big".into()),
            codec: 1,
            timeout_us: 0,
            metadata: Metadata::new(),
        })
        .encode(&mut b);
        Frame::Message(MessageFrame {
            call_id: CallId(id),
            end_stream: true,
            total_len: None,
            chunk: Bytes::from_static(b"x"),
        })
        .encode(&mut b);
    }
    b
}

#[tokio::test]
async fn a_server_stops_taking_calls_from_a_client_that_never_reads() {
    const CALLS: u32 = 20_000;
    let handled = Arc::new(AtomicUsize::new(0));
    let reply = Bytes::from(vec![0u8; 1024 * 1024]);
    let server = Server::builder()
        .unary("/t.S/Big", RawCodec, {
            let handled = handled.clone();
            move |_r: Request<Bytes>| {
                handled.fetch_add(1, Ordering::Relaxed);
                let reply = reply.clone();
                async move { Ok(Response::new(reply)) }
            }
        })
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind");
    let addr = server.local_addr().to_string();
    tokio::spawn(server.serve());
    let mut sock = tokio::net::TcpStream::connect(addr.trim_start_matches("tcp://"))
        .await
        .expect("connect");
    // 20,000 calls asking for 1 MiB each (20 GiB of answers), and never a byte read.
    let wire = calls(CALLS);
    let _ = tokio::time::timeout(Duration::from_secs(3), sock.write_all(&wire)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n = handled.load(Ordering::Relaxed);
    eprintln!("calls taken from the client that never reads: {n}");
    // The server takes in at most one read (64 KiB, ~1,770 of these calls) per turn and stops
    // reading once its 4 MiB send buffer is full — not all 20,000.
    assert!(
        n < 4_000,
        "the server took {n} calls from a client that reads nothing"
    );
    // And a well-behaved client on another connection is still served.
    let ch = Channel::connect(format!("tcp://{}", addr.trim_start_matches("tcp://")))
        .await
        .expect("connect");
    let r = ch
        .unary(RawCodec, "/t.S/Big", Bytes::new())
        .await
        .expect("served");
    assert_eq!(r.into_inner().len(), 1024 * 1024);
    drop(sock);
}

/// While a server takes nothing it is sent, a client holds new calls among its bounded pending
/// ones, their deadlines running, instead of queueing (and encoding) them without end.
#[tokio::test]
async fn calls_wait_with_their_deadline_while_the_server_reads_nothing() {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    // A server that completes the handshake and then never reads a byte.
    let server = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.expect("accept");
        let mut hello = BytesMut::new();
        hello.extend_from_slice(&PREFACE);
        Frame::Settings(Settings::default()).encode(&mut hello);
        sock.write_all(&hello).await.expect("hello");
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(sock);
    });
    let ch = Channel::connect(format!("tcp://{addr}"))
        .await
        .expect("connect");
    // 16 MiB of requests: more than the kernel's buffers and the 4 MiB send buffer hold.
    let big: Vec<_> = (0..16)
        .map(|_| {
            let ch = ch.clone();
            tokio::spawn(async move {
                ch.unary(RawCodec, "/t.S/M", Bytes::from(vec![0u8; 1 << 20]))
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let small = (0..3000).map(|_| {
        let ch = ch.clone();
        async move {
            ch.unary(
                RawCodec,
                "/t.S/M",
                Request::new(Bytes::from_static(b"x")).with_timeout(Duration::from_millis(300)),
            )
            .await
        }
    });
    let t0 = Instant::now();
    let results = futures_util::future::join_all(small).await;
    let waited = results
        .iter()
        .filter(|r| {
            r.as_ref().err().is_some_and(|e| {
                e.code() == Code::DeadlineExceeded && e.message().contains("waited")
            })
        })
        .count();
    // Every one of them ends within its deadline (plus slack), having waited to be sent.
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(
        waited,
        results.len(),
        "{:?}",
        results.iter().find_map(|r| r.as_ref().err())
    );
    for b in big {
        b.abort();
    }
    server.abort();
}
