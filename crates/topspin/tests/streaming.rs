//! Streaming calls in all three shapes, and flow control bounding a slow reader, over every
//! transport.

mod common;

use bytes::Bytes;
use common::*;
use futures_util::{stream, StreamExt};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::{Code, Config, Request, Response, Server};

#[tokio::test]
async fn server_streaming_over_every_transport() {
    each_client(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.client().await;
        let (messages, end) = ch
            .server_streaming(SERVER_STREAM, Request::new(bytes("100")))
            .await;
        let want: Vec<Bytes> = (0..100).map(|i| Bytes::from(i.to_string())).collect();
        assert_eq!(messages, want);
        end.expect("the stream ends OK, with trailers");
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn client_streaming() {
    each_transport(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.channel().await;
        let parts = stream::iter(["a", "bc", "", "def"].map(bytes));
        let r = ch
            .client_streaming(RawCodec, CLIENT_STREAM, Request::new(parts))
            .await
            .unwrap();
        assert_eq!(r.into_inner(), bytes("abcdef"));
        // An empty request stream.
        let r = ch
            .client_streaming(RawCodec, CLIENT_STREAM, Request::new(stream::empty()))
            .await
            .unwrap();
        assert_eq!(r.into_inner(), Bytes::new());
        server.stop().await;
    })
    .await;
}

/// A streaming call takes a bare stream as well as a `Request` around one (tonic's
/// `IntoStreamingRequest`), with metadata and a timeout in the second form.
#[tokio::test]
async fn streaming_calls_take_a_bare_stream_or_a_request() {
    each_transport(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.channel().await;
        let r = ch
            .client_streaming(RawCodec, CLIENT_STREAM, stream::iter(["a", "b"].map(bytes)))
            .await
            .unwrap();
        assert_eq!(r.into_inner(), bytes("ab"));
        let req = Request::new(stream::iter(["c", "d"].map(bytes)))
            .with_timeout(Duration::from_secs(5))
            .with_metadata(topspin::Metadata::builder().text("k", "v").unwrap().build());
        let r = ch
            .client_streaming(RawCodec, CLIENT_STREAM, req)
            .await
            .unwrap();
        assert_eq!(r.into_inner(), bytes("cd"));
        let replies = ch
            .streaming(RawCodec, BIDI, stream::iter(["x", "y"].map(bytes)))
            .await
            .unwrap()
            .into_inner();
        let got: Vec<Bytes> = replies.map(|m| m.unwrap()).collect().await;
        assert_eq!(got, vec![bytes("echo:x"), bytes("echo:y")]);
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn bidirectional_ping_pong() {
    each_transport(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.channel().await;
        let (tx, requests) = feed();
        let mut replies = ch
            .streaming(RawCodec, BIDI, Request::new(requests))
            .await
            .unwrap()
            .into_inner();
        for i in 0..50 {
            tx.send(Bytes::from(format!("m{i}"))).unwrap();
            let got = within(5, replies.message()).await.unwrap().unwrap();
            assert_eq!(got, Bytes::from(format!("echo:m{i}")));
        }
        drop(tx); // half-close
        assert_eq!(within(5, replies.message()).await.unwrap(), None);
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn stream_error_status_reaches_the_client() {
    each_client(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.client().await;
        let (messages, end) = ch
            .server_streaming(STREAM_FAIL, Request::new(bytes("1:DATA_LOSS:disk on fire")))
            .await;
        assert_eq!(messages, [bytes("0")]);
        let err = end.unwrap_err();
        assert_eq!(err.code(), Code::DataLoss);
        assert_eq!(err.message(), "disk on fire");
        server.stop().await;
    })
    .await;
}

/// A server streaming 1 GiB to a client that reads slowly keeps what it has produced but the
/// client has not consumed under the flow-control window (plus one message and what sits in
/// socket buffers, which the kernel bounds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reader_bounds_the_writer() {
    let skips = trim(
        &[not_standard(
            "its server has a method of its own, /t.S/Firehose, counting what it produced",
        )],
        &[Transport::Unix, Transport::UnixAbstract, Transport::Wss],
    );
    each_transport(&skips, slow_reader_bounds_the_writer_on).await;
}

async fn slow_reader_bounds_the_writer_on(t: Transport) {
    const MSG: usize = 64 * 1024;
    const COUNT: usize = 16 * 1024; // 1 GiB
    let window: u32 = 1024 * 1024;
    let produced = Arc::new(AtomicUsize::new(0));
    let p = produced.clone();
    let chunk = Bytes::from(vec![3u8; MSG]);
    let server = serve(
        Server::builder().server_streaming(
            "/t.S/Firehose",
            RawCodec,
            move |_req: Request<Bytes>| {
                let p = p.clone();
                let chunk = chunk.clone();
                async move {
                    let s = stream::iter(0..COUNT).map(move |_| {
                        p.fetch_add(1, Ordering::SeqCst);
                        Ok(chunk.clone())
                    });
                    Ok(Response::new(s))
                }
            },
        ),
        t,
    )
    .await;
    let config = Config::default().with_initial_call_window(window);
    let ch = server.connect_with(|e| e.config(config)).await.unwrap();
    let mut s = ch
        .server_streaming(RawCodec, "/t.S/Firehose", Request::new(Bytes::new()))
        .await
        .unwrap()
        .into_inner();
    // Credit bounds everything in flight — the engine's queue, kernel buffers, the client's
    // queue — to the window plus the one frame the overdraft rule allows (and one being read).
    // On the gRPC face h2 also buffers up to its per-stream send buffer (400 KiB, the face's
    // `SEND_BUFFER`) beyond what the client's window lets out, by design.
    let h2_send_buffer = if t == Transport::Grpc { 400 * 1024 } else { 0 };
    let bound = window as usize + 2 * MSG + h2_send_buffer;
    let mut consumed = 0usize;
    let mut max_outstanding = 0usize;
    while let Some(m) = within(120, s.message()).await.unwrap() {
        assert_eq!(m.len(), MSG);
        consumed += 1;
        let outstanding = (produced.load(Ordering::SeqCst) - consumed) * MSG;
        max_outstanding = max_outstanding.max(outstanding);
        assert!(
            outstanding <= bound,
            "{outstanding} bytes outstanding, bound {bound}"
        );
        if consumed % 1024 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await; // the slow part
        }
    }
    assert_eq!(consumed, COUNT);
    eprintln!("[{t}] max outstanding: {max_outstanding} bytes (window {window})");
    server.stop().await;
}

/// Response headers reach the client even when the response stream is empty (they go ahead of
/// the END that closes it), whether the handler answers in its first poll or later.
#[tokio::test]
async fn headers_of_an_empty_response_stream_arrive() {
    each_transport(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.channel().await;
        for body in ["now", "later"] {
            let mut s = ch
                .server_streaming(RawCodec, EMPTY, bytes(body))
                .await
                .unwrap()
                .into_inner();
            let h = within(5, s.headers()).await.unwrap();
            assert_eq!(h.get_str("h"), Some("v"), "{body}");
            assert_eq!(s.message().await.unwrap(), None);
            assert_eq!(s.received_headers().unwrap().get_str("h"), Some("v"));
        }
        server.stop().await;
    })
    .await;
}
