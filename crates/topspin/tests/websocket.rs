//! topspin over WebSocket (RFC 6455) on real TCP sockets: the four call kinds over ws:// and
//! wss://, the upgrade's checks (path, subprotocol, origin), and bad input — a text message,
//! an unmasked client frame, an oversized message, a close — each ending that one connection
//! with the close code the RFC names while the server and its other connections go on — and
//! messages that never complete, charged to the memory budget and cut at the frame timeout.
#![cfg(all(feature = "tls", feature = "websocket"))]

mod common;
mod layered;

use common::{builder, unary, within, Probe};
use futures_util::{SinkExt, StreamExt};
use layered::{four_call_kinds, Ca};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use topspin::tls::{ClientTls, ServerTls};
use topspin::ws::WebSocketSettings;
use topspin::{Address, Channel, Endpoint, ServerBuilder, ShutdownHandle};

async fn start(b: ServerBuilder, addr: &str) -> (Address, ShutdownHandle) {
    let server = b.bind(addr).await.expect("bind");
    let addr = server.local_addr().clone();
    let handle = server.shutdown_handle();
    tokio::spawn(server.serve());
    (addr, handle)
}

type RawWs = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// A raw WebSocket client: `protocol` in Sec-WebSocket-Protocol, `origin` if given.
async fn raw(
    addr: &Address,
    path: &str,
    protocol: Option<&str>,
    origin: Option<&str>,
) -> Result<RawWs, WsError> {
    let hp = addr.host_port().expect("host:port");
    let mut req = format!("ws://{hp}{path}").into_client_request()?;
    if let Some(p) = protocol {
        req.headers_mut()
            .insert("sec-websocket-protocol", HeaderValue::from_str(p).unwrap());
    }
    if let Some(o) = origin {
        req.headers_mut()
            .insert("origin", HeaderValue::from_str(o).unwrap());
    }
    let tcp = tokio::net::TcpStream::connect(hp).await?;
    let (ws, _) = tokio_tungstenite::client_async(req, tcp).await?;
    Ok(ws)
}

fn status_of(r: Result<RawWs, WsError>) -> StatusCode {
    match r {
        Err(WsError::Http(resp)) => resp.status(),
        Err(e) => panic!("expected an HTTP refusal, got {e}"),
        Ok(_) => panic!("expected an HTTP refusal, got an upgrade"),
    }
}

/// Reads until the server's close frame; returns its code.
async fn close_code(ws: &mut RawWs) -> Option<CloseCode> {
    within(10, async {
        while let Some(m) = ws.next().await {
            match m {
                Ok(Message::Close(f)) => return f.map(|f| f.code),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
        None
    })
    .await
}

#[tokio::test]
async fn every_call_kind_over_ws() {
    let (addr, h) = start(builder(Probe::default()), "ws://127.0.0.1:0/rpc").await;
    assert!(addr.to_string().ends_with("/rpc"), "{addr}");
    let ch = within(10, Channel::connect(addr.clone()))
        .await
        .expect("ws connect");
    four_call_kinds(&ch).await;
    // The wrong path is refused.
    let wrong: Address = addr.to_string().replace("/rpc", "/other").parse().unwrap();
    let err = within(10, Channel::connect(wrong))
        .await
        .expect_err("wrong path");
    assert!(err.message().contains("404"), "{}", err.message());
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn every_call_kind_over_wss() {
    let ca = Ca::new("test CA");
    let pair = ca.issue("server", &["localhost"], false);
    let tls = ServerTls::from_pem_files(&pair.cert, &pair.key).unwrap();
    let (addr, h) = start(builder(Probe::default()).tls(tls), "wss://127.0.0.1:0/rpc").await;
    let ctls = ClientTls::ca_pem_file(&ca.cert)
        .unwrap()
        .server_name("localhost")
        .unwrap();
    let ch = within(10, Endpoint::new(addr.clone()).unwrap().tls(ctls).connect())
        .await
        .expect("wss connect");
    four_call_kinds(&ch).await;
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn the_upgrade_checks_path_subprotocol_and_origin() {
    let ws = WebSocketSettings::default().allow_origins(["https://app.example"]);
    let (addr, h) = start(
        builder(Probe::default()).websocket(ws),
        "ws://127.0.0.1:0/rpc",
    )
    .await;
    let sp = Some("topspin.v1");
    assert_eq!(
        status_of(raw(&addr, "/nope", sp, None).await),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        status_of(raw(&addr, "/rpc", None, None).await),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        status_of(raw(&addr, "/rpc", Some("chat"), None).await),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        status_of(raw(&addr, "/rpc", sp, Some("https://evil.example")).await),
        StatusCode::FORBIDDEN
    );
    raw(&addr, "/rpc", sp, Some("https://app.example"))
        .await
        .expect("allowed origin");
    raw(&addr, "/rpc", Some("x, topspin.v1"), None)
        .await
        .expect("no origin, offered among others");
    // Not an upgrade at all: a plain HTTP GET (a browser opening the URL) is told 426 and
    // what to use (protocol.md §14.2); garbage gets no answer. Either way the connection ends.
    for (junk, answer) in [
        (&b"GET /rpc HTTP/1.1\r\nHost: x\r\n\r\n"[..], true),
        (b"\x00\x01garbage\r\n\r\n", false),
    ] {
        let mut tcp = tokio::net::TcpStream::connect(addr.host_port().unwrap())
            .await
            .unwrap();
        tcp.write_all(junk).await.unwrap();
        let mut buf = Vec::new();
        within(10, tokio::io::AsyncReadExt::read_to_end(&mut tcp, &mut buf))
            .await
            .expect("the server closes the connection");
        let text = String::from_utf8_lossy(&buf).to_ascii_lowercase();
        assert_eq!(
            text.starts_with("http/1.1 426 upgrade required\r\n"),
            answer,
            "{text}"
        );
        if answer {
            assert!(text.contains("\r\nupgrade: websocket\r\n"), "{text}");
            assert!(text.contains("topspin.v1"), "{text}");
        }
    }
    // The server still serves.
    let ch = within(10, Channel::connect(addr.clone()))
        .await
        .expect("connect");
    assert_eq!(unary(&ch, common::UNARY, "ok").await.unwrap(), "ok");
    h.shutdown(Duration::from_secs(1)).await;
}

/// Cross-site WebSocket hijacking: by default a page of another origin cannot call the server
/// (any page a browser shows could otherwise reach a server on localhost or an intranet).
#[tokio::test]
async fn a_default_server_refuses_pages_of_other_origins() {
    let sp = Some("topspin.v1");
    let (addr, h) = start(builder(Probe::default()), "ws://127.0.0.1:0/rpc").await;
    assert_eq!(
        status_of(raw(&addr, "/rpc", sp, Some("https://evil.example")).await),
        StatusCode::FORBIDDEN
    );
    let own = format!("http://{}", addr.host_port().unwrap());
    raw(&addr, "/rpc", sp, Some(&own))
        .await
        .expect("a page of the server's own origin");
    raw(&addr, "/rpc", sp, None)
        .await
        .expect("no Origin: not a browser");
    h.shutdown(Duration::from_secs(1)).await;

    // Opted out: any origin.
    let ws = WebSocketSettings::default().allow_any_origin();
    let (addr, h) = start(
        builder(Probe::default()).websocket(ws),
        "ws://127.0.0.1:0/rpc",
    )
    .await;
    raw(&addr, "/rpc", sp, Some("https://evil.example"))
        .await
        .expect("allow_any_origin");
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn bad_frames_close_one_connection_with_the_rfc_code() {
    let ws = WebSocketSettings::default().max_message_size(256 * 1024);
    let (addr, h) = start(builder(Probe::default()).websocket(ws), "ws://127.0.0.1:0/").await;
    let good = within(10, Channel::connect(addr.clone()))
        .await
        .expect("connect");
    let sp = Some("topspin.v1");

    // A text message: 1003.
    let mut ws = raw(&addr, "/", sp, None).await.expect("upgrade");
    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(close_code(&mut ws).await, Some(CloseCode::Unsupported));

    // An unmasked client frame (written under tungstenite): 1002.
    let mut ws = raw(&addr, "/", sp, None).await.expect("upgrade");
    ws.get_mut()
        .write_all(&[0x82, 0x03, b'a', b'b', b'c'])
        .await
        .unwrap();
    assert_eq!(close_code(&mut ws).await, Some(CloseCode::Protocol));

    // A message over the bound: 1009.
    let mut ws = raw(&addr, "/", sp, None).await.expect("upgrade");
    let _ = ws.send(Message::binary(vec![0u8; 300 * 1024])).await;
    assert_eq!(close_code(&mut ws).await, Some(CloseCode::Size));

    // A reserved opcode: 1002.
    let mut ws = raw(&addr, "/", sp, None).await.expect("upgrade");
    ws.get_mut()
        .write_all(&[0x83, 0x80, 1, 2, 3, 4])
        .await
        .unwrap();
    assert_eq!(close_code(&mut ws).await, Some(CloseCode::Protocol));

    // A client's close is answered with a close, and the connection ends.
    let mut ws = raw(&addr, "/", sp, None).await.expect("upgrade");
    ws.send(Message::Close(None)).await.unwrap();
    let _ = close_code(&mut ws).await;

    // The other connection never noticed.
    assert_eq!(unary(&good, common::UNARY, "fine").await.unwrap(), "fine");
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_ws_address_is_refused_by_a_plain_server_with_a_clear_error() {
    let (addr, h) = start(builder(Probe::default()), "tcp://127.0.0.1:0").await;
    let ws: Address = format!("ws://{}/", addr.host_port().unwrap())
        .parse()
        .unwrap();
    let err = within(10, Channel::connect(ws))
        .await
        .expect_err("ws to plain");
    assert!(
        err.message().contains("WebSocket handshake failed"),
        "{}",
        err.message()
    );
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn pings_are_answered_and_invisible_to_topspin() {
    let (addr, h) = start(builder(Probe::default()), "ws://127.0.0.1:0/").await;
    let mut ws = raw(&addr, "/", Some("topspin.v1"), None)
        .await
        .expect("upgrade");
    ws.send(Message::Ping(bytes::Bytes::from_static(b"hi")))
        .await
        .unwrap();
    let pong = within(10, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Pong(p))) => return Some(p),
                Some(Ok(_)) => continue, // the server's preface and SETTINGS
                _ => return None,
            }
        }
    })
    .await;
    assert_eq!(pong.as_deref(), Some(&b"hi"[..]));
    h.shutdown(Duration::from_secs(1)).await;
}

/// The head of one masked (key 0: the payload goes as is) binary frame announcing `len` bytes.
fn frame_head(len: u64) -> Vec<u8> {
    let mut head = vec![0x82, 0x80 | 127];
    head.extend_from_slice(&len.to_be_bytes());
    head.extend_from_slice(&[0, 0, 0, 0]);
    head
}

#[tokio::test]
async fn messages_that_never_complete_are_charged_and_cut_at_the_frame_timeout() {
    use topspin::{Config, MemoryBudget};
    let budget = MemoryBudget::new(8 << 20);
    let config = Config::default()
        .with_memory_budget(budget.clone())
        .with_frame_timeout(Duration::from_secs(2));
    let server = builder(Probe::default())
        .config(config)
        .bind("ws://127.0.0.1:0/")
        .await
        .expect("bind");
    let addr = server.local_addr().clone();
    let h = server.shutdown_handle();
    tokio::spawn(server.serve());
    let good = within(10, Channel::connect(addr.clone()))
        .await
        .expect("connect");
    let before = budget.used();

    // Sixteen connections each announce a 1,000,000-byte message and send 900 KB of it: 14 MB
    // in all, past the 8 MiB budget.
    let mut attackers = Vec::new();
    for _ in 0..16 {
        let mut ws = raw(&addr, "/", Some("topspin.v1"), None)
            .await
            .expect("upgrade");
        let tcp = ws.get_mut();
        tcp.write_all(&frame_head(1_000_000)).await.unwrap();
        // The server stops reading once the budget is spent: write what it takes.
        let body = vec![7u8; 900_000];
        let _ = tokio::time::timeout(Duration::from_millis(300), tcp.write_all(&body)).await;
        attackers.push(ws);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = budget.used() - before;
    assert!(held > 4 << 20, "partial messages are charged: {held}");
    // Three quarters of the budget (the last quarter is kept for calls), plus at most one
    // read of 128 KiB per connection.
    assert!(held <= (6 << 20) + (2 << 20), "held to the budget: {held}");
    // A good client is still served meanwhile.
    assert_eq!(unary(&good, common::UNARY, "fine").await.unwrap(), "fine");

    // Each attacker is cut within the frame timeout plus a second, and the charge given back.
    within(4, async {
        for ws in &mut attackers {
            while let Some(Ok(_)) = ws.next().await {}
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        budget.used() <= before + (64 << 10),
        "charge returned: {} (before {before})",
        budget.used()
    );
    assert_eq!(unary(&good, common::UNARY, "fine").await.unwrap(), "fine");
    h.shutdown(Duration::from_secs(1)).await;
}
