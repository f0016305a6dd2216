//! Hostile or broken peers: each gets the documented error or close, the server stays up,
//! memory stays bounded and other connections are unaffected — on every transport where a test
//! can write the protocol's bytes itself.

mod common;

use common::*;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use topspin::{Code, Config};
use topspin_proto::frame::{Frame, FrameDecoder};
use topspin_proto::preface::PREFACE;
use topspin_proto::{ErrorCode, Settings};

/// A raw byte stream to a server, below topspin's protocol.
trait Raw: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Raw for T {}

/// The transports where a test can write the protocol's bytes by hand, and why not elsewhere.
const SKIPS: &[Skip] = &[
    (Transport::UnixAbstract, TRIMMED),
    (
        Transport::Tls,
        "hand-written frames go under a byte stream; tls.rs covers TLS's own bad input",
    ),
    (
        Transport::Ws,
        "hand-written frames go under a byte stream; websocket.rs covers WebSocket's own bad input",
    ),
    (
        Transport::Wss,
        "hand-written frames go under a byte stream; websocket.rs covers WebSocket's own bad input",
    ),
    (
        Transport::Shm,
        "hand-written frames go under a byte stream; shm.rs plays hostile ring peers",
    ),
    (
        Transport::Grpc,
        "these are native frames; grpc_hostile.rs plays hostile gRPC peers",
    ),
    (
        Transport::GrpcTonic,
        "these are native frames written to a topspin server; the tonic server is not one",
    ),
];

/// A raw connection to `server` over its transport.
async fn raw(server: &TestServer) -> Box<dyn Raw> {
    use topspin::Address;
    match &server.addr {
        _ if server.transport == Transport::Stream => Box::new(server.pipe()),
        Address::Tcp(hp) => Box::new(tokio::net::TcpStream::connect(hp).await.unwrap()),
        Address::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await.unwrap()),
        #[cfg(target_os = "linux")]
        Address::UnixAbstract(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name).unwrap();
            let sock = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
            sock.set_nonblocking(true).unwrap();
            Box::new(tokio::net::UnixStream::from_std(sock).unwrap())
        }
        other => panic!("no raw connection to {other}"),
    }
}

fn hello() -> Vec<u8> {
    let mut v = PREFACE.to_vec();
    v.extend_from_slice(&Frame::Settings(Settings::default()).to_bytes());
    v
}

/// Reads everything the server sends until it closes; returns the protocol error it reported.
async fn server_error(sock: &mut (impl AsyncRead + Unpin)) -> Option<(ErrorCode, String)> {
    let mut buf = Vec::new();
    within(10, sock.read_to_end(&mut buf)).await.ok()?;
    let mut b = bytes::BytesMut::from(&buf[8.min(buf.len())..]);
    let mut dec = FrameDecoder::new(u32::MAX >> 1);
    while let Ok(Some(f)) = dec.decode(&mut b) {
        if let Frame::Error { code, reason } = f {
            return Some((code, reason.to_string()));
        }
    }
    None
}

async fn assert_still_serving(server: &TestServer) {
    let ch = server.channel().await;
    assert_eq!(unary(&ch, UNARY, "alive").await.unwrap(), bytes("alive"));
}

#[tokio::test]
async fn garbage_bytes_get_bad_preface() {
    each_transport(SKIPS, |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let mut sock = raw(&server).await;
        sock.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let (code, reason) = server_error(&mut sock).await.unwrap();
        assert_eq!(code, ErrorCode::BAD_PREFACE);
        assert!(reason.contains("preface"), "{reason}");
        assert_still_serving(&server).await;
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_four_gigabyte_length_prefix_is_refused_without_allocating() {
    each_transport(SKIPS, |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let mut sock = raw(&server).await;
        let mut bytes = hello();
        bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x03, 0, 0, 0, 1, 0, 0, 0]);
        sock.write_all(&bytes).await.unwrap();
        let (code, reason) = server_error(&mut sock).await.unwrap();
        assert_eq!(code, ErrorCode::FRAME_TOO_LARGE);
        assert!(reason.contains("MAX_FRAME_SIZE"), "{reason}");
        assert_still_serving(&server).await;
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn truncated_frame_then_close_is_handled() {
    each_transport(SKIPS, |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let mut sock = raw(&server).await;
        let mut bytes = hello();
        bytes.extend_from_slice(&[50, 0, 0, 0, 0x02, 1, 0, 0, 1, 0, 0, 0, 1, 2, 3]);
        sock.write_all(&bytes).await.unwrap();
        sock.shutdown().await.unwrap();
        let mut rest = Vec::new();
        within(10, sock.read_to_end(&mut rest)).await.unwrap();
        assert_still_serving(&server).await;
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn half_a_frame_and_a_stall_is_disconnected_after_frame_timeout() {
    each_transport(SKIPS, |t| async move {
        let config = Config::default().with_frame_timeout(Duration::from_millis(300));
        let server = serve(builder(Probe::default()).config(config), t).await;
        let mut sock = raw(&server).await;
        let mut bytes = hello();
        bytes.extend_from_slice(&[0, 0, 1, 0, 0x03, 0, 0, 0, 1, 0, 0, 0, 1, 2, 3]); // 64 KiB promised
        sock.write_all(&bytes).await.unwrap();
        let (code, reason) = server_error(&mut sock).await.unwrap();
        assert_eq!(code, ErrorCode::TIMEOUT);
        assert!(reason.contains("frame_timeout"), "{reason}");
        assert_still_serving(&server).await;
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_silent_peer_is_disconnected_after_handshake_timeout() {
    each_transport(SKIPS, |t| async move {
        let config = Config::default().with_handshake_timeout(Duration::from_millis(300));
        let server = serve(builder(Probe::default()).config(config), t).await;
        let mut sock = raw(&server).await;
        let (code, _) = server_error(&mut sock).await.unwrap();
        assert_eq!(code, ErrorCode::TIMEOUT);
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn opening_calls_without_end_hits_the_concurrency_limit() {
    each_transport(SKIPS, |t| async move {
        let server = serve(builder(Probe::default()).max_concurrent_calls(8), t).await;
        let mut sock = raw(&server).await;
        let mut bytes = hello();
        for id in 1..=100u32 {
            let call = Frame::Call(topspin_proto::frame::CallFrame {
                call_id: topspin_proto::CallId(id),
                method_id: 0,
                method_name: Some(bytestring::ByteString::from_static(SLOW)),
                codec: 1,
                timeout_us: 0,
                metadata: topspin::Metadata::new(),
            });
            bytes.extend_from_slice(&call.to_bytes());
        }
        sock.write_all(&bytes).await.unwrap();
        // The server refuses calls 9..=100 with RESOURCE_EXHAUSTED and stays up.
        let mut refused = 0;
        let mut buf = bytes::BytesMut::new();
        let mut dec = FrameDecoder::new(u32::MAX >> 1);
        let mut seen_preface = false;
        within(10, async {
            while refused < 92 {
                let n = sock.read_buf(&mut buf).await.unwrap();
                assert!(n > 0, "server closed");
                if !seen_preface && buf.len() >= 8 {
                    let _ = buf.split_to(8);
                    seen_preface = true;
                }
                while let Ok(Some(f)) = dec.decode(&mut buf) {
                    if let Frame::End(e) = f {
                        assert_eq!(e.code, Code::ResourceExhausted);
                        assert!(e.message.contains("max_concurrent_calls"));
                        refused += 1;
                    }
                }
            }
        })
        .await;
        assert_still_serving(&server).await;
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_peer_that_vanishes_mid_call_cancels_its_handler() {
    each_transport(SKIPS, |t| async move {
        let probe = Probe::default();
        let server = serve(standard(probe.clone()), t).await;
        let mut sock = raw(&server).await;
        let mut bytes = hello();
        bytes.extend_from_slice(
            &Frame::Call(topspin_proto::frame::CallFrame {
                call_id: topspin_proto::CallId(1),
                method_id: 0,
                method_name: Some(bytestring::ByteString::from_static(SLOW)),
                codec: 1,
                timeout_us: 0,
                metadata: topspin::Metadata::new(),
            })
            .to_bytes(),
        );
        bytes.extend_from_slice(
            &Frame::Message(topspin_proto::frame::MessageFrame {
                call_id: topspin_proto::CallId(1),
                end_stream: true,
                total_len: None,
                chunk: bytes::Bytes::from_static(b"vanish"),
            })
            .to_bytes(),
        );
        sock.write_all(&bytes).await.unwrap();
        within(5, probe.started.notified()).await;
        drop(sock);
        within(5, async {
            while !probe
                .cancelled
                .lock()
                .unwrap()
                .contains(&"vanish".to_string())
            {
                probe.cancelled_notify.notified().await;
            }
        })
        .await;
        assert_still_serving(&server).await;
        server.stop().await;
    })
    .await;
}
