//! Every call kind over the stream transport (`tokio::io::duplex`), through the same connection
//! loop the socket transport uses; the socket transport is covered by `tests/` over real TCP
//! and Unix sockets.

use crate::codec::RawCodec;
use crate::transport::stream::StreamTransport;
use crate::transport::PeerAddr;
use crate::{Channel, Code, Endpoint, Request, Response, Server, Status, Streaming};
use bytes::Bytes;
use futures_util::StreamExt;
use std::time::Duration;

async fn pair(buffer: usize) -> (Channel, crate::ShutdownHandle) {
    let server = Server::builder()
        .unary("/t.S/Echo", RawCodec, |r: Request<Bytes>| async move {
            match r.get_ref().as_ref() {
                b"fail" => Err(Status::not_found("no such thing")),
                _ => Ok(Response::new(r.into_inner())),
            }
        })
        .unary("/t.S/Slow", RawCodec, |r: Request<Bytes>| async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(Response::new(r.into_inner()))
        })
        .server_streaming("/t.S/Count", RawCodec, |r: Request<Bytes>| async move {
            let n = r.get_ref()[0];
            let items = (0..n).map(|i| Ok(Bytes::from(vec![i; 3])));
            Ok(Response::new(futures_util::stream::iter(items)))
        })
        .client_streaming(
            "/t.S/Sum",
            RawCodec,
            |r: Request<Streaming<Bytes>>| async move {
                let mut s = r.into_inner();
                let mut total = 0u64;
                while let Some(m) = s.message().await? {
                    total += m.len() as u64;
                }
                Ok(Response::new(Bytes::from(total.to_string())))
            },
        )
        .streaming(
            "/t.S/Chat",
            RawCodec,
            |r: Request<Streaming<Bytes>>| async move {
                let s = r.into_inner();
                Ok(Response::new(
                    s.map(|m| m.map(|b| [&b[..], b"!"].concat().into())),
                ))
            },
        )
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind");
    let (a, b) = tokio::io::duplex(buffer);
    tokio::spawn(server.serve_transport(StreamTransport::new(a, PeerAddr::Stream)));
    let shutdown = server.shutdown_handle();
    tokio::spawn(server.serve());
    let endpoint = Endpoint::new("tcp://in-memory:1").expect("endpoint");
    let channel = Channel::over_transport(StreamTransport::new(b, PeerAddr::Stream), endpoint)
        .await
        .expect("handshake over the duplex pipe");
    (channel, shutdown)
}

#[tokio::test]
async fn every_call_kind_over_a_duplex_pipe() {
    // A small pipe: large messages must go through many partial reads and writes.
    let (ch, shutdown) = pair(1024).await;

    let r = ch
        .unary(RawCodec, "/t.S/Echo", Bytes::from_static(b"hi"))
        .await;
    assert_eq!(r.expect("unary").into_inner(), Bytes::from_static(b"hi"));

    let err = ch
        .unary(RawCodec, "/t.S/Echo", Bytes::from_static(b"fail"))
        .await
        .expect_err("status");
    assert_eq!(err.code(), Code::NotFound);

    let big = Bytes::from(vec![7u8; 3 * 1024 * 1024]);
    let r = ch.unary(RawCodec, "/t.S/Echo", big.clone()).await;
    assert_eq!(r.expect("3 MiB unary").into_inner(), big);

    let mut s = ch
        .server_streaming(RawCodec, "/t.S/Count", Bytes::from_static(&[5]))
        .await
        .expect("server streaming")
        .into_inner();
    let mut got = Vec::new();
    while let Some(m) = s.message().await.expect("item") {
        got.push(m[0]);
    }
    assert_eq!(got, vec![0, 1, 2, 3, 4]);

    let reqs = futures_util::stream::iter((0..10).map(|_| Bytes::from_static(b"abcd")));
    let r = ch
        .client_streaming(RawCodec, "/t.S/Sum", Request::new(reqs))
        .await
        .expect("client streaming");
    assert_eq!(r.into_inner(), Bytes::from_static(b"40"));

    let reqs = futures_util::stream::iter([&b"a"[..], b"b", b"c"].map(Bytes::from_static));
    let mut s = ch
        .streaming(RawCodec, "/t.S/Chat", Request::new(reqs))
        .await
        .expect("bidi")
        .into_inner();
    let mut got = Vec::new();
    while let Some(m) = s.message().await.expect("item") {
        got.push(m);
    }
    assert_eq!(got, [&b"a!"[..], b"b!", b"c!"].map(Bytes::from_static));

    let err = ch
        .unary(
            RawCodec,
            "/t.S/Slow",
            Request::new(Bytes::new()).with_timeout(Duration::from_millis(50)),
        )
        .await
        .expect_err("deadline");
    assert_eq!(err.code(), Code::DeadlineExceeded);

    // Many calls at once on one pipe.
    let calls = (0..200u32).map(|i| {
        let ch = ch.clone();
        async move {
            let m = Bytes::from(i.to_le_bytes().to_vec());
            let r = ch.unary(RawCodec, "/t.S/Echo", m.clone()).await;
            assert_eq!(r.expect("concurrent").into_inner(), m);
        }
    });
    futures_util::future::join_all(calls).await;

    shutdown.shutdown(Duration::from_secs(1)).await;
    let err = ch
        .unary(RawCodec, "/t.S/Echo", Bytes::from_static(b"late"))
        .await
        .expect_err("closed");
    assert_eq!(err.code(), Code::Unavailable);
}

#[tokio::test]
async fn an_expired_deadline_is_not_sent() {
    let (ch, _shutdown) = pair(64 * 1024).await;
    let err = ch
        .unary(
            RawCodec,
            "/t.S/Echo",
            Request::new(Bytes::from_static(b"x")).with_timeout(Duration::ZERO),
        )
        .await
        .expect_err("expired before it was sent");
    assert_eq!(err.code(), Code::DeadlineExceeded);
}

/// A server that answers call 1, says GOAWAY (last call id 1), and closes with the client's
/// later bytes unread: the kernel then resets the connection, and the client's next write
/// fails while the server's last frames still wait, unread, in its receive buffer. This pipe
/// plays that server with a real engine and delivers those frames at the moment the write
/// fails, then the reset (Linux: a read returns the data that arrived, then the error).
#[derive(Clone)]
struct ResettingServer(std::sync::Arc<std::sync::Mutex<Resetting>>);

struct Resetting {
    server: topspin_proto::Connection,
    inbox: bytes::BytesMut,
    /// What the client may read now.
    readable: bytes::BytesMut,
    /// The server's last frames, sent but not yet arrived.
    held: bytes::BytesMut,
    /// Call 1 was answered and GOAWAY sent: the next client write meets the reset.
    closing: bool,
    reset: bool,
    reader: Option<std::task::Waker>,
}

impl ResettingServer {
    fn new() -> ResettingServer {
        let server = topspin_proto::Connection::new(
            topspin_proto::Side::Server,
            topspin_proto::Settings::default(),
        );
        ResettingServer(std::sync::Arc::new(std::sync::Mutex::new(Resetting {
            server,
            inbox: bytes::BytesMut::new(),
            readable: bytes::BytesMut::new(),
            held: bytes::BytesMut::new(),
            closing: false,
            reset: false,
            reader: None,
        })))
    }

    fn closing(&self) -> bool {
        self.0.lock().unwrap().closing
    }
}

impl Resetting {
    fn take_input(&mut self, bytes: &[u8]) {
        use topspin_proto::{CallId, ErrorCode, Event, Metadata};
        self.inbox.extend_from_slice(bytes);
        let now = std::time::Instant::now();
        self.server
            .handle_input(&mut self.inbox, now)
            .expect("the client speaks the protocol");
        while let Some(ev) = self.server.poll_event() {
            if let Event::HalfClosed { id: CallId(1) } = ev {
                let one = topspin_proto::Payload::from(Bytes::from_static(b"one"));
                self.server.send_message(CallId(1), one, false).unwrap();
                let ok = topspin_proto::Status::new(Code::Ok, "");
                self.server
                    .end_call(CallId(1), &ok, &Metadata::new())
                    .unwrap();
                self.server.go_away(ErrorCode::NO_ERROR, "restarting");
                self.closing = true;
            }
        }
        let out = if self.closing {
            &mut self.held
        } else {
            &mut self.readable
        };
        while let Some(b) = self.server.poll_transmit() {
            out.extend_from_slice(&b);
        }
        if !self.readable.is_empty() {
            if let Some(w) = self.reader.take() {
                w.wake();
            }
        }
    }
}

impl tokio::io::AsyncRead for ResettingServer {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let mut s = self.0.lock().unwrap();
        if !s.readable.is_empty() {
            let n = s.readable.len().min(buf.remaining());
            buf.put_slice(&s.readable.split_to(n));
            return std::task::Poll::Ready(Ok(()));
        }
        if s.reset {
            return std::task::Poll::Ready(Err(std::io::ErrorKind::ConnectionReset.into()));
        }
        s.reader = Some(cx.waker().clone());
        std::task::Poll::Pending
    }
}

impl tokio::io::AsyncWrite for ResettingServer {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let mut s = self.0.lock().unwrap();
        if s.closing {
            // The reset arrived, right behind the server's last frames.
            if !s.reset {
                s.reset = true;
                let held = s.held.split();
                s.readable.unsplit(held);
                if let Some(w) = s.reader.take() {
                    w.wake();
                }
            }
            return std::task::Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
        }
        s.take_input(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn a_write_failing_on_a_reset_still_hears_the_goaway_and_answers_before_it() {
    // protocol.md §8.3: call 1 (at the GOAWAY's last call id) was answered, call 2 (above it)
    // was not processed. The write of call 2 fails (the server reset the connection); what
    // the server sent before the reset must still count.
    let peer = ResettingServer::new();
    let endpoint = Endpoint::new("tcp://in-memory:1").expect("endpoint");
    let transport = StreamTransport::new(peer.clone(), PeerAddr::Stream);
    let ch = Channel::over_transport(transport, endpoint)
        .await
        .expect("handshake");
    let first = {
        let ch = ch.clone();
        tokio::spawn(async move {
            ch.unary(RawCodec, "/t.S/Echo", Bytes::from_static(b"1"))
                .await
        })
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while !peer.closing() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("call 1 reached the server");
    let second = ch
        .unary(RawCodec, "/t.S/Echo", Bytes::from_static(b"2"))
        .await
        .expect_err("the connection was reset");
    assert_eq!(second.code(), Code::Unavailable, "{second:?}");
    assert!(
        second.is_unprocessed(),
        "call 2 is above the GOAWAY's last call id: {second:?}"
    );
    let first = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("call 1 ends")
        .expect("task");
    assert_eq!(
        first
            .expect("call 1 was answered before the reset")
            .into_inner(),
        Bytes::from_static(b"one")
    );
}

/// A large message lands in a buffer of its own, handed out by reference, and the next one
/// reuses that allocation once the first is dropped — however the reads split it. Regression:
/// when a read left less than `MIN_READ_ROOM` of the message to come, the read loop reserved a
/// usual read's room in the exact-size buffer, which reallocated it (copying the whole
/// message) and lost the allocation to reuse (3 runs in 100 of
/// `a_large_message_buffer_is_reused_once_the_application_dropped_it` failed so over TCP).
#[tokio::test]
async fn a_large_message_is_received_in_place_however_its_reads_split() {
    let (ch, _shutdown) = pair(64 * 1024).await;
    // Sizes whose tails after 64 KiB reads fall everywhere, below 4 KiB among them.
    for k in 0..40usize {
        let body = Bytes::from(vec![k as u8; (1 << 20) + 1637 * k]);
        let call = || ch.unary(RawCodec, "/t.S/Echo", Request::new(body.clone()));
        let first = call().await.unwrap().into_inner();
        assert!(first == body);
        let at = first.as_ptr();
        drop(first);
        let second = call().await.unwrap().into_inner();
        assert!(second == body);
        assert_eq!(
            second.as_ptr(),
            at,
            "size {}: not received in place",
            body.len()
        );
    }
    // Both ends run on this thread (a current-thread runtime).
    assert_eq!(super::io::LARGE_BUFFER_MOVED.with(|n| n.get()), 0);
}
