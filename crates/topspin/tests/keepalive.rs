//! Keep-alive pings and idle timeouts.

mod common;

use common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use topspin::{Config, Endpoint};
use topspin_proto::frame::{Frame, FrameDecoder};
use topspin_proto::{ErrorCode, Settings};

#[tokio::test]
async fn a_peer_that_never_answers_pings_is_disconnected() {
    let config = Config::default()
        .with_keepalive_interval(Some(Duration::from_millis(100)))
        .with_keepalive_timeout(Duration::from_millis(200));
    let server = serve(builder(Probe::default()).config(config), Transport::Tcp).await;
    let topspin::Address::Tcp(hp) = &server.addr else {
        unreachable!()
    };
    let mut sock = tokio::net::TcpStream::connect(hp.as_str()).await.unwrap();
    let mut hello = topspin_proto::preface::PREFACE.to_vec();
    hello.extend_from_slice(&Frame::Settings(Settings::default()).to_bytes());
    sock.write_all(&hello).await.unwrap();
    // Read (and never answer) until the server gives up on us.
    let mut buf = Vec::new();
    within(10, sock.read_to_end(&mut buf)).await.unwrap();
    let mut b = bytes::BytesMut::from(&buf[8..]);
    let mut dec = FrameDecoder::new(1 << 24);
    let mut pings = 0;
    let mut error = None;
    while let Ok(Some(f)) = dec.decode(&mut b) {
        match f {
            Frame::Ping { ack: false, .. } => pings += 1,
            Frame::Error { code, reason } => error = Some((code, reason)),
            _ => {}
        }
    }
    assert!(pings >= 1);
    let (code, reason) = error.expect("ERROR frame");
    assert_eq!(code, ErrorCode::TIMEOUT);
    assert!(reason.contains("PING"), "{reason}");
    server.stop().await;
}

#[tokio::test]
async fn a_real_client_answers_pings_and_stays_connected() {
    let config = Config::default()
        .with_keepalive_interval(Some(Duration::from_millis(50)))
        .with_keepalive_timeout(Duration::from_millis(500));
    let server = serve(
        builder(Probe::default()).config(config.clone()),
        Transport::Unix,
    )
    .await;
    let ch = Endpoint::new(server.addr.clone())
        .unwrap()
        .config(config)
        .connect()
        .await
        .unwrap();
    assert_eq!(unary(&ch, UNARY, "a").await.unwrap(), bytes("a"));
    tokio::time::sleep(Duration::from_millis(400)).await; // several ping rounds while idle
    assert_eq!(unary(&ch, UNARY, "b").await.unwrap(), bytes("b"));
    server.stop().await;
}

#[tokio::test]
async fn an_idle_connection_goes_away_and_the_next_call_reconnects() {
    let config = Config::default().with_idle_timeout(Some(Duration::from_millis(100)));
    let server = serve(builder(Probe::default()).config(config), Transport::Tcp).await;
    let ch = server.channel().await;
    assert_eq!(unary(&ch, UNARY, "before").await.unwrap(), bytes("before"));
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The server closed the idle connection with a go-away; the channel opens a new one.
    assert_eq!(
        within(5, unary(&ch, UNARY, "after")).await.unwrap(),
        bytes("after")
    );
    server.stop().await;
}
