//! Dropping a call's future cancels it; the server's handler sees it promptly — over every
//! transport (the call whose deadline passed on arrival is written by hand, on TCP).

mod common;

use common::*;
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::Request;

#[tokio::test]
async fn dropping_a_unary_call_cancels_the_handler() {
    each_client(&[], |t| async move {
        let probe = Probe::default();
        let server = serve(standard(probe.clone()), t).await;
        let ch = server.client().await;
        let call = tokio::spawn({
            let ch = ch.clone();
            async move { ch.call(SLOW, "drop-me").await }
        });
        within(5, probe.started.notified()).await;
        call.abort(); // drops the call's future
        within(5, async {
            while !probe
                .cancelled
                .lock()
                .unwrap()
                .contains(&"drop-me".to_string())
            {
                probe.cancelled_notify.notified().await;
            }
        })
        .await;
        // The channel is unaffected.
        assert_eq!(ch.call(UNARY, "after").await.unwrap(), bytes("after"));
        server.stop().await;
    })
    .await;
}

/// On a connection already up and quiet, a unary call is written by its caller and its guard
/// cancels it by the call's id (no token look-up): dropping it still reaches the handler.
#[tokio::test]
async fn dropping_a_unary_call_started_directly_cancels_the_handler() {
    each_transport(&[], |t| async move {
        let probe = Probe::default();
        let server = serve(standard(probe.clone()), t).await;
        let ch = server.channel().await;
        assert_eq!(unary(&ch, UNARY, "warm").await.unwrap(), bytes("warm"));
        for round in 0..3 {
            let name = format!("direct-{round}");
            let call = tokio::spawn({
                let (ch, name) = (ch.clone(), name.clone());
                async move { unary(&ch, SLOW, &name).await }
            });
            within(5, probe.started.notified()).await;
            call.abort();
            within(5, async {
                while !probe.cancelled.lock().unwrap().contains(&name) {
                    probe.cancelled_notify.notified().await;
                }
            })
            .await;
            assert_eq!(unary(&ch, UNARY, "after").await.unwrap(), bytes("after"));
        }
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn dropping_a_response_stream_cancels_the_call() {
    each_transport(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.channel().await;
        let mut s = ch
            .server_streaming(RawCodec, SERVER_STREAM, Request::new(bytes("1000000:10")))
            .await
            .unwrap()
            .into_inner();
        for _ in 0..10 {
            s.message().await.unwrap().unwrap();
        }
        drop(s);
        // The server stops producing and the connection keeps working.
        within(5, async {
            assert_eq!(unary(&ch, UNARY, "next").await.unwrap(), bytes("next"));
        })
        .await;
        server.stop().await;
    })
    .await;
}

/// A caller that keeps its response stream can cancel through it and sees `CANCELLED`, as a
/// gRPC client sees a call it cancelled itself; the call ends on the server (the connection's
/// open calls drop to none) and the connection goes on.
#[tokio::test]
async fn a_caller_cancels_through_its_stream_and_sees_cancelled() {
    use topspin::Code;
    each_transport(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.channel().await;
        let mut s = ch
            .server_streaming(RawCodec, SERVER_STREAM, Request::new(bytes("1000000:10")))
            .await
            .unwrap()
            .into_inner();
        s.message().await.unwrap().unwrap();
        s.cancel();
        let e = s.message().await.unwrap_err();
        assert_eq!(e.code(), Code::Cancelled, "{e}");
        assert!(
            s.message().await.unwrap().is_none(),
            "then the stream is over"
        );
        s.cancel(); // again: nothing
        within(5, async {
            assert_eq!(unary(&ch, UNARY, "next").await.unwrap(), bytes("next"));
        })
        .await;
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_handler_can_watch_for_cancellation() {
    let skips = [not_standard(
        "its server has a method of its own, watching topspin's cancellation handle",
    )];
    each_transport(&skips, |t| async move {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let tx = std::sync::Mutex::new(Some(tx));
        let server = serve(
            topspin::Server::builder().unary(
                "/t.C/Watch",
                RawCodec,
                move |req: Request<bytes::Bytes>| {
                    let c = req.cancellation().unwrap();
                    let tx = tx.lock().unwrap().take();
                    async move {
                        // Work spawned elsewhere learns of the cancellation through the handle.
                        tokio::spawn(async move {
                            c.cancelled().await;
                            if let Some(tx) = tx {
                                let _ = tx.send(());
                            }
                        });
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        Ok(topspin::Response::new(req.into_inner()))
                    }
                },
            ),
            t,
        )
        .await;
        let ch = server.channel().await;
        let _ = ch
            .unary(
                RawCodec,
                "/t.C/Watch",
                Request::new(bytes("x")).with_timeout(Duration::from_millis(50)),
            )
            .await;
        within(5, rx).await.unwrap();
        server.stop().await;
    })
    .await;
}

/// The handles of the calls a test server saw, kept after the calls end.
type Kept = std::sync::Arc<std::sync::Mutex<Vec<(String, topspin::Cancellation)>>>;

fn keep(kept: &Kept, what: &str, req: &Request<impl Sized>) {
    let c = req
        .cancellation()
        .expect("a server request has a cancellation handle");
    kept.lock().unwrap().push((what.to_owned(), c));
}

/// A call that ends normally (an answer or an error status from its handler) is not
/// cancelled: a handle the application kept never fires, for every call kind, whether the
/// handler answered in its first poll or later.
#[tokio::test]
async fn a_call_that_ends_normally_is_not_cancelled() {
    let skips = [not_standard(
        "its server has methods of their own, keeping topspin's cancellation handles",
    )];
    each_transport(&skips, |t| async move {
        use futures_util::StreamExt;
        let kept = Kept::default();
        let (k1, k2, k3, k4) = (kept.clone(), kept.clone(), kept.clone(), kept.clone());
        let builder = topspin::Server::builder()
            .unary("/t.C/Unary", RawCodec, move |req: Request<bytes::Bytes>| {
                keep(&k1, "unary", &req);
                async move {
                    match req.get_ref().as_ref() {
                        b"later" => tokio::task::yield_now().await,
                        b"fail" => return Err(topspin::Status::not_found("no")),
                        _ => {}
                    }
                    Ok(topspin::Response::new(req.into_inner()))
                }
            })
            .server_streaming("/t.C/Out", RawCodec, move |req: Request<bytes::Bytes>| {
                keep(&k2, "server streaming", &req);
                async move {
                    let items = futures_util::stream::iter(0..3).map(|i| Ok(bytes(&i.to_string())));
                    Ok(topspin::Response::new(items))
                }
            })
            .client_streaming(
                "/t.C/In",
                RawCodec,
                move |req: Request<topspin::Streaming<bytes::Bytes>>| {
                    keep(&k3, "client streaming", &req);
                    async move {
                        let mut s = req.into_inner();
                        let mut n = 0;
                        while s.message().await?.is_some() {
                            n += 1;
                        }
                        Ok(topspin::Response::new(bytes(&n.to_string())))
                    }
                },
            )
            .streaming(
                "/t.C/Both",
                RawCodec,
                move |req: Request<topspin::Streaming<bytes::Bytes>>| {
                    keep(&k4, "bidirectional", &req);
                    async move { Ok(topspin::Response::new(req.into_inner())) }
                },
            );
        let server = serve(builder, t).await;
        let ch = server.channel().await;
        for body in ["now", "later"] {
            assert_eq!(unary(&ch, "/t.C/Unary", body).await.unwrap(), bytes(body));
        }
        let err = unary(&ch, "/t.C/Unary", "fail").await.unwrap_err();
        assert_eq!(err.code(), topspin::Code::NotFound);
        let mut s = ch
            .server_streaming(RawCodec, "/t.C/Out", bytes(""))
            .await
            .unwrap()
            .into_inner();
        while s.message().await.unwrap().is_some() {}
        let reqs = futures_util::stream::iter([bytes("a"), bytes("b")]);
        let r = ch
            .client_streaming(RawCodec, "/t.C/In", Request::new(reqs))
            .await
            .unwrap();
        assert_eq!(r.into_inner(), bytes("2"));
        let reqs = futures_util::stream::iter([bytes("a"), bytes("b")]);
        let mut s = ch
            .streaming(RawCodec, "/t.C/Both", Request::new(reqs))
            .await
            .unwrap()
            .into_inner();
        while s.message().await.unwrap().is_some() {}

        // Every call is over (its END reached the client); give a late signal time to show.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let kept: Vec<_> = std::mem::take(&mut *kept.lock().unwrap());
        assert_eq!(kept.len(), 6);
        for (what, c) in &kept {
            assert!(
                !c.is_cancelled(),
                "{what}: fired after the call ended normally"
            );
        }
        server.stop().await;
    })
    .await;
}

/// A call whose deadline has passed when it arrives is refused with DEADLINE_EXCEEDED and its
/// handler never runs. The client cannot send such a call, so this one is written by hand:
/// 100 ordinary calls, then a unary and a client-streaming call with a deadline of 1 µs, all
/// in one write (so the server reads them together and the deadline has passed by the time
/// it gets to the last two).
#[tokio::test]
async fn a_call_whose_deadline_passed_on_arrival_is_not_started() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use topspin_proto::frame::{CallFrame, Frame, FrameDecoder, MessageFrame};
    use topspin_proto::CallId;

    let ran = std::sync::Arc::new(AtomicUsize::new(0));
    let (r1, r2) = (ran.clone(), ran.clone());
    let builder = builder(Probe::default())
        .unary(
            "/t.C/Counted",
            RawCodec,
            move |req: Request<bytes::Bytes>| {
                r1.fetch_add(1, Ordering::SeqCst);
                async move { Ok(topspin::Response::new(req.into_inner())) }
            },
        )
        .client_streaming(
            "/t.C/CountedIn",
            RawCodec,
            move |_req: Request<topspin::Streaming<bytes::Bytes>>| {
                r2.fetch_add(1, Ordering::SeqCst);
                async move { Ok(topspin::Response::new(bytes::Bytes::new())) }
            },
        );
    let server = serve(builder, Transport::Tcp).await;
    let topspin::Address::Tcp(hp) = &server.addr else {
        panic!("not tcp")
    };
    let mut sock = tokio::net::TcpStream::connect(hp.as_str()).await.unwrap();

    let call = |id: u32, method: &'static str, timeout_us: u64| {
        Frame::Call(CallFrame {
            call_id: CallId(id),
            method_id: 0,
            method_name: Some(bytestring::ByteString::from_static(method)),
            codec: 1,
            timeout_us,
            metadata: topspin::Metadata::new(),
        })
        .to_bytes()
    };
    let last = |id: u32| {
        Frame::Message(MessageFrame {
            call_id: CallId(id),
            end_stream: true,
            total_len: None,
            chunk: bytes("x"),
        })
        .to_bytes()
    };
    let mut out = topspin_proto::preface::PREFACE.to_vec();
    out.extend_from_slice(&Frame::Settings(topspin_proto::Settings::default()).to_bytes());
    for id in 1..=100 {
        out.extend_from_slice(&call(id, UNARY, 0));
        out.extend_from_slice(&last(id));
    }
    out.extend_from_slice(&call(101, "/t.C/Counted", 1));
    out.extend_from_slice(&last(101));
    out.extend_from_slice(&call(102, "/t.C/CountedIn", 1));
    out.extend_from_slice(&last(102));
    sock.write_all(&out).await.unwrap();

    // Every call's END, by id.
    let mut ends = std::collections::HashMap::new();
    let mut buf = bytes::BytesMut::new();
    let mut dec = FrameDecoder::new(u32::MAX >> 1);
    let mut seen_preface = false;
    within(10, async {
        while ends.len() < 102 {
            let n = sock.read_buf(&mut buf).await.unwrap();
            assert!(n > 0, "server closed");
            if !seen_preface && buf.len() >= 8 {
                let _ = buf.split_to(8);
                seen_preface = true;
            }
            while let Ok(Some(f)) = dec.decode(&mut buf) {
                if let Frame::End(e) = f {
                    ends.insert(e.call_id.0, (e.code, e.message.to_string()));
                }
            }
        }
    })
    .await;
    for id in 1..=100 {
        assert_eq!(ends[&id].0, topspin::Code::Ok, "call {id}: {:?}", ends[&id]);
    }
    for id in [101, 102] {
        assert_eq!(
            ends[&id].0,
            topspin::Code::DeadlineExceeded,
            "call {id}: {:?}",
            ends[&id]
        );
    }
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "a handler ran past its deadline"
    );
    server.stop().await;
}
