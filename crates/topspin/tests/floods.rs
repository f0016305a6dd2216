//! The engine's local flood limits through the runtime, over TCP (protocol.md §9, "Local
//! limits"): keep-alive stays within the default PING rate, floods are closed with
//! ENHANCE_YOUR_CALM, and the limits are set through `Config`.

mod common;

use common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use topspin::{Config, Endpoint};
use topspin_proto::frame::{Frame, FrameDecoder};
use topspin_proto::{ErrorCode, Rate, Settings};

/// A topspin client and server with keep-alive at 100 ms on both sides stay connected well past
/// the PING burst: the default rate does not break keep-alive.
#[tokio::test]
async fn keepalive_at_100_ms_stays_within_the_default_ping_rate() {
    let config = Config::default()
        .with_keepalive_interval(Some(Duration::from_millis(100)))
        .with_keepalive_timeout(Duration::from_secs(2));
    let server = serve(
        builder(Probe::default()).config(config.clone()),
        Transport::Tcp,
    )
    .await;
    let ch = Endpoint::new(server.addr.clone())
        .unwrap()
        .config(config)
        .connect()
        .await
        .unwrap();
    assert_eq!(unary(&ch, UNARY, "a").await.unwrap(), bytes("a"));
    // 30+ ping rounds, more than the burst of 20.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(within(5, unary(&ch, UNARY, "b")).await.unwrap(), bytes("b"));
    server.stop().await;
}

/// Frames a server sent until it closed the connection.
async fn frames_until_closed(mut sock: tokio::net::TcpStream) -> Vec<Frame> {
    let mut buf = Vec::new();
    within(10, sock.read_to_end(&mut buf)).await.unwrap();
    let mut b = bytes::BytesMut::from(&buf[8..]);
    let mut dec = FrameDecoder::new(1 << 24);
    let mut frames = Vec::new();
    while let Ok(Some(f)) = dec.decode(&mut b) {
        frames.push(f);
    }
    frames
}

/// A peer that floods PINGs past `Config::ping_rate` is closed with GOAWAY and ERROR
/// ENHANCE_YOUR_CALM "too_many_pings", and gets far fewer answers than it sent PINGs.
#[tokio::test]
async fn a_ping_flood_is_closed_with_enhance_your_calm() {
    let config = Config::default().with_ping_rate(Rate::new(5, Duration::from_secs(10)));
    let server = serve(builder(Probe::default()).config(config), Transport::Tcp).await;
    let topspin::Address::Tcp(hp) = &server.addr else {
        unreachable!()
    };
    let mut sock = tokio::net::TcpStream::connect(hp.as_str()).await.unwrap();
    let mut hello = topspin_proto::preface::PREFACE.to_vec();
    hello.extend_from_slice(&Frame::Settings(Settings::default()).to_bytes());
    for i in 0..50u64 {
        hello.extend_from_slice(
            &Frame::Ping {
                ack: false,
                data: i.to_le_bytes(),
            }
            .to_bytes(),
        );
    }
    sock.write_all(&hello).await.unwrap();
    let frames = frames_until_closed(sock).await;
    let acks = frames
        .iter()
        .filter(|f| matches!(f, Frame::Ping { ack: true, .. }))
        .count();
    assert!(acks <= 5, "{acks} PING answers");
    let goaway = frames.iter().find_map(|f| match f {
        Frame::GoAway { code, .. } => Some(*code),
        _ => None,
    });
    assert_eq!(goaway, Some(ErrorCode::ENHANCE_YOUR_CALM));
    let error = frames.iter().find_map(|f| match f {
        Frame::Error { code, reason } => Some((*code, reason.clone())),
        _ => None,
    });
    let (code, reason) = error.expect("ERROR frame");
    assert_eq!(code, ErrorCode::ENHANCE_YOUR_CALM);
    assert!(reason.contains("too_many_pings"), "{reason}");
    server.stop().await;
}
