//! Connection lifecycle limits over real sockets: `max_connections`, `max_connection_age` with
//! its grace, the idle timeout of a handshaken-then-silent peer, and a server out of file
//! descriptors.

mod common;

use bytes::Bytes;
use common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use topspin::codec::RawCodec;
use topspin::{Channel, Code, Config, Request, Response, ServerBuilder, Status};
use topspin_proto::frame::{Frame, FrameDecoder};
use topspin_proto::preface::PREFACE;
use topspin_proto::Settings;

/// Answers with the caller's address as the server sees it (one per connection).
const PEER: &str = "/test.Echo/Peer";

fn with_peer(b: ServerBuilder) -> ServerBuilder {
    b.unary(PEER, RawCodec, |req: Request<Bytes>| async move {
        let peer = req.peer_addr().map(|p| p.to_string()).unwrap_or_default();
        Ok(Response::new(Bytes::from(peer)))
    })
}

fn tcp_host_port(a: &topspin::Address) -> String {
    match a {
        topspin::Address::Tcp(hp) => hp.clone(),
        other => panic!("not TCP: {other}"),
    }
}

/// The error of a call on a fresh channel (connecting may succeed: the refusal comes after).
async fn refused_call(addr: &topspin::Address) -> Status {
    match Channel::connect(addr.clone()).await {
        Ok(ch) => unary(&ch, UNARY, "over the limit")
            .await
            .expect_err("the call must be refused"),
        Err(e) => e,
    }
}

/// Every frame in `buf` (after the 8-byte preface).
fn frames(buf: &[u8]) -> Vec<Frame> {
    assert!(buf.len() >= 8 && buf[..8] == PREFACE, "no preface: {buf:?}");
    let mut b = bytes::BytesMut::from(&buf[8..]);
    let mut dec = FrameDecoder::new(1 << 24);
    let mut out = Vec::new();
    while let Ok(Some(f)) = dec.decode(&mut b) {
        out.push(f);
    }
    out
}

#[tokio::test]
async fn past_max_connections_a_call_is_told_why_and_open_connections_go_on() {
    let config = Config::default().with_max_connections(2);
    let server = serve(builder(Probe::default()).config(config), Transport::Tcp).await;
    let a = server.channel().await;
    let b = server.channel().await;
    assert_eq!(unary(&a, UNARY, "a").await.unwrap(), bytes("a"));
    assert_eq!(unary(&b, UNARY, "b").await.unwrap(), bytes("b"));

    let err = within(10, refused_call(&server.addr)).await;
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(
        err.message().contains("max_connections (2) reached"),
        "{err}"
    );

    // The connections already open are not affected.
    assert_eq!(unary(&a, UNARY, "a2").await.unwrap(), bytes("a2"));
    assert_eq!(unary(&b, UNARY, "b2").await.unwrap(), bytes("b2"));

    // Once one closes, a new connection is served (as soon as the server has seen it close).
    drop(a);
    within(10, async {
        loop {
            if let Ok(ch) = Channel::connect(server.addr.clone()).await {
                if let Ok(r) = unary(&ch, UNARY, "c").await {
                    assert_eq!(r, bytes("c"));
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(unary(&b, UNARY, "b3").await.unwrap(), bytes("b3"));
    server.stop().await;
}

#[tokio::test]
async fn a_refused_connection_that_never_calls_is_told_and_closed() {
    let config = Config::default().with_max_connections(1);
    let server = serve(builder(Probe::default()).config(config), Transport::Tcp).await;
    let a = server.channel().await;
    assert_eq!(unary(&a, UNARY, "a").await.unwrap(), bytes("a"));

    let mut sock = tokio::net::TcpStream::connect(tcp_host_port(&server.addr))
        .await
        .unwrap();
    let mut hello = PREFACE.to_vec();
    hello.extend_from_slice(&Frame::Settings(Settings::default()).to_bytes());
    sock.write_all(&hello).await.unwrap();
    // No call: after a short wait the server says why and closes.
    let mut buf = Vec::new();
    within(10, sock.read_to_end(&mut buf)).await.unwrap();
    let frames = frames(&buf);
    assert!(
        matches!(frames.first(), Some(Frame::Settings(_))),
        "{frames:?}"
    );
    let reason = frames
        .iter()
        .find_map(|f| match f {
            Frame::Error { reason, .. } => Some(reason.to_string()),
            _ => None,
        })
        .expect("an ERROR frame");
    assert!(reason.contains("max_connections (1) reached"), "{reason}");
    assert_eq!(unary(&a, UNARY, "a2").await.unwrap(), bytes("a2"));
    server.stop().await;
}

#[tokio::test]
async fn past_max_connection_age_calls_in_flight_finish_and_later_calls_reconnect() {
    let config = Config::default()
        .with_max_connection_age(Some(Duration::from_millis(200)))
        .with_max_connection_age_grace(Duration::from_secs(20));
    let server = serve(
        with_peer(builder(Probe::default())).config(config),
        Transport::Tcp,
    )
    .await;
    let ch = server.channel().await;
    let first = unary(&ch, PEER, "").await.unwrap();

    // A stream started before the age…
    let (tx, requests) = feed();
    let mut replies = ch
        .streaming(RawCodec, BIDI, Request::new(requests))
        .await
        .unwrap()
        .into_inner();
    tx.send(bytes("0")).unwrap();
    assert_eq!(
        within(5, replies.message()).await.unwrap(),
        Some(bytes("echo:0"))
    );
    // …the age (200 ms ± 10%) passes: the server sends GOAWAY.
    tokio::time::sleep(Duration::from_millis(600)).await;

    // Later calls go on a new connection, transparently (each one succeeds; on a busy
    // machine the GOAWAY may take a moment to arrive).
    within(10, async {
        while unary(&ch, PEER, "").await.unwrap() == first {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(unary(&ch, UNARY, "x").await.unwrap(), bytes("x"));

    // The stream goes on within the grace period, and ends normally.
    for i in 1..5 {
        tx.send(Bytes::from(i.to_string())).unwrap();
        let got = within(5, replies.message()).await.unwrap();
        assert_eq!(got, Some(Bytes::from(format!("echo:{i}"))));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(tx);
    assert_eq!(within(5, replies.message()).await.unwrap(), None);
    server.stop().await;
}

#[tokio::test]
async fn past_max_connection_age_and_its_grace_a_call_still_running_ends_unavailable() {
    let config = Config::default()
        .with_max_connection_age(Some(Duration::from_millis(300)))
        .with_max_connection_age_grace(Duration::from_millis(300));
    let probe = Probe::default();
    let server = serve(builder(probe.clone()).config(config), Transport::Unix).await;
    let ch = server.channel().await;
    // SLOW runs for 30 s unless cancelled; it starts before the age passes.
    let started = probe.started.notified();
    let call = tokio::spawn({
        let ch = ch.clone();
        async move { unary(&ch, SLOW, "slow").await }
    });
    within(10, started).await;
    let err = within(10, call)
        .await
        .unwrap()
        .expect_err("the call cannot outlive the grace period");
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    within(10, probe.cancelled_notify.notified()).await; // the handler was stopped
    assert_eq!(probe.cancelled.lock().unwrap().as_slice(), ["slow"]);
    // The channel reconnects for the next call.
    assert_eq!(
        within(10, unary(&ch, UNARY, "next")).await.unwrap(),
        bytes("next")
    );
    server.stop().await;
}

#[tokio::test]
async fn a_handshaken_then_silent_peer_is_closed_by_the_idle_timeout() {
    let config = Config::default().with_idle_timeout(Some(Duration::from_millis(200)));
    let server = serve(builder(Probe::default()).config(config), Transport::Tcp).await;
    let mut sock = tokio::net::TcpStream::connect(tcp_host_port(&server.addr))
        .await
        .unwrap();
    let mut hello = PREFACE.to_vec();
    hello.extend_from_slice(&Frame::Settings(Settings::default()).to_bytes());
    sock.write_all(&hello).await.unwrap();
    // Say nothing more: the server goes away and closes the connection.
    let mut buf = Vec::new();
    within(10, sock.read_to_end(&mut buf)).await.unwrap();
    let go_away = go_away_reason(&buf);
    assert!(go_away.contains("idle"), "{go_away}");
    server.stop().await;
}

/// Regression: the idle time counted from the last byte read, so a peer that sends a PING now
/// and then (or only answers ours) kept its connection, and a `max_connections` slot, for ever.
/// It counts from the last call's end (here: the handshake), as grpc-go's `MaxConnectionIdle`.
#[tokio::test]
async fn a_peer_that_only_pings_is_closed_by_the_idle_timeout() {
    let config = Config::default().with_idle_timeout(Some(Duration::from_millis(500)));
    let server = serve(builder(Probe::default()).config(config), Transport::Tcp).await;
    let sock = tokio::net::TcpStream::connect(tcp_host_port(&server.addr))
        .await
        .unwrap();
    let (mut rd, mut wr) = sock.into_split();
    let mut hello = PREFACE.to_vec();
    hello.extend_from_slice(&Frame::Settings(Settings::default()).to_bytes());
    wr.write_all(&hello).await.unwrap();
    // A PING every 150 ms (well under the PING rate limit), for at most 15 s, until the
    // server closes.
    let pinger = tokio::spawn(async move {
        for i in 0u64..100 {
            let ping = Frame::Ping {
                ack: false,
                data: i.to_be_bytes(),
            };
            if wr.write_all(&ping.to_bytes()).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    });
    let t0 = std::time::Instant::now();
    let mut buf = Vec::new();
    within(10, rd.read_to_end(&mut buf)).await.unwrap();
    let took = t0.elapsed();
    pinger.abort();
    let go_away = go_away_reason(&buf);
    assert!(go_away.contains("idle"), "{go_away}");
    assert!(took < Duration::from_secs(5), "closed only after {took:?}");
    server.stop().await;
}

/// The reason of the first GOAWAY in what the server sent.
fn go_away_reason(buf: &[u8]) -> String {
    frames(buf)
        .into_iter()
        .find_map(|f| match f {
            Frame::GoAway { reason, .. } => Some(reason.to_string()),
            _ => None,
        })
        .expect("a GOAWAY frame")
}

// --- Out of file descriptors ---------------------------------------------------------------

const FD_CHILD: &str = "TOPSPIN_LIFECYCLE_FD_CHILD";
const EMFILE: i32 = 24;

/// The process runs out of file descriptors: the 5 connections it has still move 8 MiB each
/// way (a write that waits needs no new descriptor), the accept loop keeps running and backs
/// off, and it accepts again once descriptors are freed. Runs in a child process with a low
/// descriptor limit (`ulimit -n`), so filling the table does not disturb other tests.
#[test]
fn out_of_file_descriptors_open_connections_go_on_and_accepting_resumes() {
    if std::env::var_os(FD_CHILD).is_some() {
        return fd_child();
    }
    let exe = std::env::current_exe().expect("test binary");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 256 && exec \"$0\" \"$@\"")
        .arg(exe)
        .args([
            "--exact",
            "out_of_file_descriptors_open_connections_go_on_and_accepting_resumes",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(FD_CHILD, "1")
        .output()
        .expect("run the child");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("fd child: done"),
        "the child did not run:\n{text}"
    );
}

fn fd_child() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let server = serve(builder(Probe::default()), Transport::Tcp).await;
        let mut channels = Vec::new();
        for i in 0..5 {
            let ch = server.channel().await;
            assert_eq!(
                unary(&ch, UNARY, "warm").await.unwrap(),
                bytes("warm"),
                "{i}"
            );
            channels.push(ch);
        }

        // Fill the descriptor table.
        let mut hog = Vec::new();
        let err = loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => hog.push(f),
                Err(e) => break e,
            }
            assert!(hog.len() < 100_000, "no descriptor limit");
        };
        assert_eq!(err.raw_os_error(), Some(EMFILE), "{err}");
        // One descriptor for a client that connects now: the server cannot accept it.
        hog.pop();
        let mut waiting = std::net::TcpStream::connect(tcp_host_port(&server.addr))
            .expect("connect (the kernel completes it; accepting needs a descriptor)");
        assert!(
            std::fs::File::open("/dev/null").is_err(),
            "the table is full"
        );

        // 8 MiB each way on every open connection: writes wait for room, and need no
        // descriptor to do so.
        let big = Bytes::from(vec![0x5a; 8 << 20]);
        let calls = channels.iter().map(|ch| {
            let big = big.clone();
            async move { ch.unary(RawCodec, UNARY, Request::new(big)).await }
        });
        let replies = within(60, futures_util::future::join_all(calls)).await;
        for (i, r) in replies.into_iter().enumerate() {
            let r = r.unwrap_or_else(|e| panic!("connection {i}: {e}"));
            assert_eq!(r.get_ref().len(), 8 << 20, "connection {i}");
        }
        // The accept loop has been failing meanwhile (EMFILE) and backs off; free
        // descriptors and it accepts the client that waited…
        drop(hog);
        within(
            10,
            tokio::task::spawn_blocking(move || {
                use std::io::{Read, Write};
                waiting
                    .set_read_timeout(Some(Duration::from_secs(8)))
                    .unwrap();
                // The client speaks first (protocol.md §2): the server tells native
                // topspin from gRPC by the first byte before it answers.
                let _ = waiting.write_all(&PREFACE);
                let mut preface = [0u8; 8];
                waiting
                    .read_exact(&mut preface)
                    .expect("the server accepted and answered");
                assert_eq!(preface, PREFACE);
            }),
        )
        .await
        .unwrap();
        // …and new ones.
        let ch = server.channel().await;
        assert_eq!(unary(&ch, UNARY, "again").await.unwrap(), bytes("again"));
        for ch in &channels {
            assert_eq!(unary(ch, UNARY, "still").await.unwrap(), bytes("still"));
        }
        server.stop().await;
    });
    println!("fd child: done");
}

/// A connection accepted just before a graceful shutdown, whose client speaks only after the
/// shutdown began (its preface and first CALLs in one write), is told by the engine — a
/// GOAWAY — rather than dropped while the plain port sniffs its first byte: only a GOAWAY
/// tells the client its calls were not processed and are safe to send elsewhere (a rolling
/// restart under load lost calls to exactly this race).
#[tokio::test]
async fn a_connection_still_being_sniffed_at_shutdown_is_told_by_goaway() {
    let server = serve(builder(Probe::default()), Transport::Tcp).await;
    let mut sock = tokio::net::TcpStream::connect(tcp_host_port(&server.addr))
        .await
        .unwrap();
    // Accepted, and waiting in the sniff for the client's first byte.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let handle = server.handle().clone();
    let stopping = tokio::spawn(async move { handle.shutdown(Duration::from_secs(5)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut hello = PREFACE.to_vec();
    hello.extend_from_slice(&Frame::Settings(Settings::default()).to_bytes());
    let _ = sock.write_all(&hello).await;
    let mut buf = Vec::new();
    let _ = within(10, sock.read_to_end(&mut buf)).await;
    let frames = frames(&buf);
    assert!(
        frames.iter().any(|f| matches!(f, Frame::GoAway { .. })),
        "{frames:?}"
    );
    within(10, stopping).await.unwrap();
}
