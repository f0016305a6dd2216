//! Graceful shutdown: go-away, in-flight calls finish within the grace period, the rest end —
//! over every transport.

mod common;

use bytes::Bytes;
use common::*;
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::{Code, Request, Response, Server};

fn gated() -> (
    topspin::ServerBuilder,
    std::sync::Arc<tokio::sync::Notify>,
    std::sync::Arc<tokio::sync::Notify>,
) {
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let (s, r) = (started.clone(), release.clone());
    let b = Server::builder()
        .unary(UNARY, RawCodec, |req: Request<Bytes>| async move {
            Ok(Response::new(req.into_inner()))
        })
        .unary("/t.G/Gated", RawCodec, move |req: Request<Bytes>| {
            let (s, r) = (s.clone(), r.clone());
            async move {
                s.notify_one();
                r.notified().await;
                Ok(Response::new(req.into_inner()))
            }
        });
    (b, started, release)
}

/// Why the tonic server does not serve [`gated`].
#[tokio::test]
async fn in_flight_calls_finish_within_the_grace_period() {
    each_transport(&[], |t| async move {
        let probe = Probe::default();
        let server = std::sync::Arc::new(serve(standard(probe.clone()), t).await);
        let ch = server.channel().await;
        let call = tokio::spawn({
            let ch = ch.clone();
            async move { unary(&ch, GATED, "in flight").await }
        });
        within(5, probe.started.notified()).await;
        let shutdown = tokio::spawn({
            let server = server.clone();
            async move { server.shutdown(Duration::from_secs(30)).await }
        });
        // New calls are refused once the go-away arrives (no new connections are accepted).
        within(5, async {
            loop {
                match unary(&ch, UNARY, "new").await {
                    Err(e) => {
                        assert_eq!(e.code(), Code::Unavailable, "{e}");
                        break;
                    }
                    Ok(_) => tokio::task::yield_now().await,
                }
            }
        })
        .await;
        probe.release.notify_one();
        assert_eq!(within(5, call).await.unwrap().unwrap(), bytes("in flight"));
        within(5, shutdown).await.unwrap();
        let Ok(server) = std::sync::Arc::try_unwrap(server) else {
            panic!("the shutdown kept the server")
        };
        within(5, server.task).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn calls_past_the_grace_period_end_unavailable() {
    each_transport(&[], |t| async move {
        let probe = Probe::default();
        let server = serve(standard(probe.clone()), t).await;
        let ch = server.channel().await;
        let call = tokio::spawn({
            let ch = ch.clone();
            async move { unary(&ch, GATED, "stuck").await }
        });
        within(5, probe.started.notified()).await;
        within(5, server.shutdown(Duration::from_millis(200))).await;
        let err = within(5, call).await.unwrap().unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
        // A topspin server says why; tonic's graceful shutdown has no grace period of its own:
        // the test server drops its connections after it, and the client says so ("lost").
        let why = if t == Transport::GrpcTonic {
            "lost"
        } else {
            "shut down"
        };
        assert!(err.message().contains(why), "{err}");
        within(5, server.task).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn serve_with_shutdown_stops_on_a_signal() {
    let (b, _, _) = gated();
    let server = b.bind(listen_addr(Transport::Unix)).await.unwrap();
    let addr = server.local_addr().clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.serve_with_shutdown(
        async {
            let _ = rx.await;
        },
        Duration::from_secs(1),
    ));
    let ch = topspin::Channel::connect(addr).await.unwrap();
    assert_eq!(unary(&ch, UNARY, "hi").await.unwrap(), bytes("hi"));
    tx.send(()).unwrap();
    within(5, task).await.unwrap();
}

/// Reads from `tcp` into the client engine until `until` holds; the bytes the engine queues
/// are not written.
async fn read_until(
    tcp: &mut tokio::net::TcpStream,
    engine: &mut topspin_proto::Connection,
    mut until: impl FnMut(&mut topspin_proto::Connection) -> bool,
) {
    use tokio::io::AsyncReadExt;
    let mut buf = bytes::BytesMut::with_capacity(64 * 1024);
    while !until(engine) {
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read_buf(&mut buf))
            .await
            .expect("the server answers")
            .expect("read");
        assert!(n > 0, "the server closed early");
        engine
            .handle_input(&mut buf, std::time::Instant::now())
            .expect("the server speaks the protocol");
    }
}

#[tokio::test]
async fn a_server_going_away_reads_what_the_client_still_sends_before_it_closes() {
    // A client that has not heard the GOAWAY yet keeps sending. Were the server to close its
    // socket with those bytes unread, the kernel would reset the connection — and a reset
    // throws away what the server sent and the client has not read yet (its GOAWAY, its last
    // ENDs). The server reads until the client closes its side, then closes: no reset.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use topspin_proto::{Connection, Event, Settings, Side};
    let (b, _started, _release) = gated();
    let server = b.bind("tcp://127.0.0.1:0").await.expect("bind");
    let addr = server.local_addr().to_string();
    let handle = server.shutdown_handle();
    let serving = tokio::spawn(server.serve());
    let mut tcp = tokio::net::TcpStream::connect(addr.trim_start_matches("tcp://"))
        .await
        .expect("connect");
    let mut engine = Connection::new(Side::Client, Settings::default());
    while let Some(out) = engine.poll_transmit() {
        tcp.write_all(&out).await.expect("handshake");
    }
    read_until(&mut tcp, &mut engine, |e| e.is_established()).await;
    let stopping = tokio::spawn({
        let handle = handle.clone();
        async move { handle.shutdown(Duration::from_secs(5)).await }
    });
    let mut heard = false;
    read_until(&mut tcp, &mut engine, |e| {
        while let Some(ev) = e.poll_event() {
            heard |= matches!(ev, Event::GoAway { .. });
        }
        heard
    })
    .await;
    // Sent after the server's last frame: it reaches a server that is closing.
    engine.ping(*b"late one");
    while let Some(out) = engine.poll_transmit() {
        tcp.write_all(&out).await.expect("the late bytes");
    }
    tcp.shutdown().await.expect("close our side");
    tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .expect("the server stops once the client closed")
        .expect("shutdown task");
    let mut rest = Vec::new();
    let end = tcp.read_to_end(&mut rest).await;
    assert!(end.is_ok(), "the server reset the connection: {end:?}");
    let reset = tcp.take_error().expect("SO_ERROR");
    assert!(
        reset.is_none(),
        "the server reset the connection: {reset:?}"
    );
    serving.await.expect("serve task");
}
