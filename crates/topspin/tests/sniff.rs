//! One port, many faces: a sniffing server tells native topspin, TLS, WebSocket and WebSocket
//! over TLS apart by the client's first byte, on one real TCP listener.
#![cfg(all(feature = "tls", feature = "websocket"))]

mod common;
mod layered;

use common::{builder, unary, within, Probe};
use layered::{four_call_kinds, Ca};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use topspin::tls::{ClientTls, ServerTls};
use topspin::ws::WebSocketSettings;
use topspin::{Address, Channel, Endpoint, PeerAddr};

#[tokio::test]
async fn every_face_on_one_port() {
    let ca = Ca::new("test CA");
    let pair = ca.issue("server", &["localhost"], false);
    let tls = ServerTls::from_pem_files(&pair.cert, &pair.key).unwrap();
    let server = builder(Probe::default())
        .tls(tls)
        .websocket(WebSocketSettings::default().path("/rpc"))
        .sniff_transports(Duration::from_secs(2))
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind");
    let hp = server.local_addr().host_port().unwrap().to_owned();
    let h = server.shutdown_handle();
    tokio::spawn(server.serve());
    let ctls = || {
        ClientTls::ca_pem_file(&ca.cert)
            .unwrap()
            .server_name("localhost")
            .unwrap()
    };

    for scheme in ["tcp://", "tls://", "ws://", "wss://"] {
        let path = if scheme.starts_with("ws") { "/rpc" } else { "" };
        let addr: Address = format!("{scheme}{hp}{path}").parse().unwrap();
        let ch = within(
            10,
            Endpoint::new(addr.clone()).unwrap().tls(ctls()).connect(),
        )
        .await
        .unwrap_or_else(|e| panic!("{addr}: {e}"));
        four_call_kinds(&ch).await;
        // Each face sees the client's TCP address.
        let r = ch
            .unary(
                topspin::codec::RawCodec,
                common::HEADERS,
                topspin::Request::new(bytes::Bytes::new()),
            )
            .await
            .expect("headers");
        let peer =
            String::from_utf8_lossy(r.metadata().get("peer").unwrap_or_default()).into_owned();
        assert!(peer.starts_with("127.0.0.1:"), "{scheme}: {peer}");
    }
    let _ = PeerAddr::Stream;

    // A client that sends nothing is dropped after the sniff timeout; others go on.
    let mut idle = tokio::net::TcpStream::connect(&hp).await.unwrap();
    let ch = Channel::connect(format!("tcp://{hp}")).await.unwrap();
    let mut buf = [0u8; 16];
    let n = within(10, idle.read(&mut buf)).await.unwrap_or(0);
    assert_eq!(n, 0, "the idle client is closed without a byte");
    assert_eq!(unary(&ch, common::UNARY, "still").await.unwrap(), "still");
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_shutdown_does_not_wait_for_a_silent_client_in_its_handshake() {
    let ca = Ca::new("test CA");
    let pair = ca.issue("server", &["localhost"], false);
    let tls = ServerTls::from_pem_files(&pair.cert, &pair.key).unwrap();
    let server = builder(Probe::default())
        .tls(tls)
        .bind("tls://127.0.0.1:0")
        .await
        .expect("bind");
    let hp = server.local_addr().host_port().unwrap().to_owned();
    let h = server.shutdown_handle();
    let task = tokio::spawn(server.serve());
    // Connected, sends nothing: the TLS handshake waits (up to the 10 s handshake timeout).
    let _silent = tokio::net::TcpStream::connect(&hp).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = std::time::Instant::now();
    within(5, h.shutdown(Duration::from_millis(100))).await;
    within(5, task).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}
