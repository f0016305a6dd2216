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

/// A port with mutual TLS serves no plaintext face by default: a native, h2c or WebSocket
/// client without a certificate would otherwise reach the handlers. `plaintext_beside_mtls`
/// opts in.
#[tokio::test]
async fn a_mutual_tls_port_serves_no_plaintext_face_unless_told_to() {
    let ca = Ca::new("test CA");
    let pair = ca.issue("server", &["localhost"], false);
    let client = ca.issue("client", &["client.example"], false);
    for opt_in in [false, true] {
        let tls = ServerTls::from_pem_files(&pair.cert, &pair.key)
            .unwrap()
            .client_ca_pem_file(&ca.cert)
            .unwrap();
        let server = builder(Probe::default())
            .tls(tls)
            .plaintext_beside_mtls(opt_in)
            .websocket(WebSocketSettings::default().path("/rpc"))
            .sniff_transports(Duration::from_secs(2))
            .bind("tcp://127.0.0.1:0")
            .await
            .expect("bind");
        let hp = server.local_addr().host_port().unwrap().to_owned();
        let h = server.shutdown_handle();
        tokio::spawn(server.serve());

        // With a certificate over TLS: served either way.
        let ctls = ClientTls::ca_pem_file(&ca.cert)
            .unwrap()
            .identity_pem_files(&client.cert, &client.key)
            .unwrap()
            .server_name("localhost")
            .unwrap();
        let ch = within(
            10,
            Endpoint::new(format!("tls://{hp}").as_str())
                .unwrap()
                .tls(ctls)
                .connect(),
        )
        .await
        .expect("mutual TLS client");
        assert_eq!(unary(&ch, common::UNARY, "tls").await.unwrap(), "tls");

        // Native topspin in plaintext.
        let native = within(10, Channel::connect(format!("tcp://{hp}"))).await;
        assert_eq!(native.is_ok(), opt_in, "native plaintext, opt-in {opt_in}");
        // h2c and a WebSocket upgrade: the server answers (SETTINGS, 101) or closes silently.
        for (what, hello) in [
            (
                "h2c",
                &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"[..],
            ),
            (
                "ws",
                b"GET /rpc HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                  Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
                  Sec-WebSocket-Protocol: topspin.v1\r\n\r\n",
            ),
        ] {
            use tokio::io::AsyncWriteExt;
            let mut tcp = tokio::net::TcpStream::connect(&hp).await.unwrap();
            tcp.write_all(hello).await.unwrap();
            let mut buf = [0u8; 64];
            let n = within(10, tcp.read(&mut buf)).await.unwrap_or(0);
            assert_eq!(n > 0, opt_in, "{what} plaintext, opt-in {opt_in}");
        }
        h.shutdown(Duration::from_secs(1)).await;
    }
}

/// TLS settings on a plain `tcp://` address (no sniffing) are an error, not silently ignored.
#[tokio::test]
async fn tls_settings_on_a_plain_tcp_address_are_an_error() {
    let ca = Ca::new("test CA");
    let pair = ca.issue("server", &["localhost"], false);
    let tls = ServerTls::from_pem_files(&pair.cert, &pair.key).unwrap();
    let Err(err) = builder(Probe::default())
        .tls(tls)
        .bind("tcp://127.0.0.1:0")
        .await
    else {
        panic!("bound a plain tcp:// address with TLS settings");
    };
    assert!(err.to_string().contains("tls://"), "{err}");
}
