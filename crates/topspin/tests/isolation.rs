//! One call fails alone: a handler that panics ends its own call with INTERNAL, and the
//! connection and its other calls go on.

mod common;

use bytes::Bytes;
use futures_util::StreamExt;
use std::time::{Duration, Instant};
use topspin::codec::RawCodec;
use topspin::{Channel, Code, Request, Response, Server, Status, Streaming};

fn boom(b: &[u8]) -> Result<Bytes, Status> {
    if b == b"boom" {
        panic!("the handler panics on purpose");
    }
    Ok(Bytes::copy_from_slice(b))
}

async fn server() -> Channel {
    let server = Server::builder()
        .unary("/t.S/Unary", RawCodec, |r: Request<Bytes>| async move {
            if r.get_ref().as_ref() == b"later" {
                tokio::time::sleep(Duration::from_millis(20)).await;
                boom(b"boom")?;
            }
            Ok(Response::new(boom(r.get_ref())?))
        })
        .server_streaming("/t.S/Out", RawCodec, |_r: Request<Bytes>| async move {
            let items = futures_util::stream::iter([&b"a"[..], b"boom"]).map(boom);
            Ok(Response::new(items))
        })
        .client_streaming(
            "/t.S/In",
            RawCodec,
            |r: Request<Streaming<Bytes>>| async move {
                let mut s = r.into_inner();
                let mut last = Bytes::new();
                while let Some(m) = s.message().await? {
                    last = boom(&m)?;
                }
                Ok(Response::new(last))
            },
        )
        .streaming(
            "/t.S/Both",
            RawCodec,
            |r: Request<Streaming<Bytes>>| async move {
                let s = r.into_inner();
                Ok(Response::new(s.map(|m| boom(&m?))))
            },
        )
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind");
    let addr = server.local_addr().clone();
    tokio::spawn(server.serve());
    Channel::connect(addr).await.expect("connect")
}

fn assert_panicked(r: Result<(), Status>, what: &str) {
    let err = r.expect_err(what);
    assert_eq!(err.code(), Code::Internal, "{what}: {err}");
    assert!(err.message().contains("panicked"), "{what}: {err}");
}

async fn drain(s: Result<Response<Streaming<Bytes>>, Status>) -> Result<(), Status> {
    let mut s = s?.into_inner();
    while s.message().await?.is_some() {}
    Ok(())
}

#[tokio::test]
async fn a_panicking_handler_ends_only_its_own_call() {
    let ch = server().await;
    // A call in flight on the same connection while the others panic.
    let slow = tokio::spawn({
        let ch = ch.clone();
        async move {
            let reqs =
                futures_util::stream::iter([Bytes::from_static(b"fine")]).then(|m| async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    m
                });
            ch.client_streaming(RawCodec, "/t.S/In", Request::new(Box::pin(reqs)))
                .await
        }
    });
    let unary = |m: &'static [u8]| {
        let ch = ch.clone();
        async move {
            ch.unary(RawCodec, "/t.S/Unary", Bytes::from_static(m))
                .await
                .map(|_| ())
        }
    };
    assert_panicked(unary(b"boom").await, "unary, first poll");
    assert_panicked(unary(b"later").await, "unary, a later poll");
    let out = ch
        .server_streaming(RawCodec, "/t.S/Out", Bytes::new())
        .await;
    assert_panicked(drain(out).await, "in a response stream");
    let reqs = futures_util::stream::iter([&b"x"[..], b"boom"].map(Bytes::from_static));
    let r = ch
        .client_streaming(RawCodec, "/t.S/In", Request::new(reqs))
        .await;
    assert_panicked(r.map(|_| ()), "client streaming");
    let reqs = futures_util::stream::iter([&b"x"[..], b"boom"].map(Bytes::from_static));
    let both = ch
        .streaming(RawCodec, "/t.S/Both", Request::new(reqs))
        .await;
    assert_panicked(drain(both).await, "bidirectional");

    let r = slow
        .await
        .expect("task")
        .expect("the other call is unaffected");
    assert_eq!(r.into_inner(), Bytes::from_static(b"fine"));
    let r = ch
        .unary(RawCodec, "/t.S/Unary", Bytes::from_static(b"ok"))
        .await
        .expect("the connection goes on");
    assert_eq!(r.into_inner(), Bytes::from_static(b"ok"));
}

/// A handler that awaits once and then blocks its thread (`std::thread::sleep`, the classic
/// mistake) holds up only its own call: after its first poll it runs on a task of its own, so
/// 1,000 quick calls on the same connection all finish while it sleeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_blocks_after_its_first_poll_holds_up_only_its_own_call() {
    let sleeping = std::sync::Arc::new(tokio::sync::Notify::new());
    let server = Server::builder()
        .unary("/t.S/Fast", RawCodec, |r: Request<Bytes>| async move {
            Ok(Response::new(r.into_inner()))
        })
        .unary("/t.S/Sleepy", RawCodec, {
            let sleeping = sleeping.clone();
            move |r: Request<Bytes>| {
                let sleeping = sleeping.clone();
                async move {
                    tokio::task::yield_now().await;
                    sleeping.notify_one();
                    std::thread::sleep(Duration::from_secs(1));
                    Ok(Response::new(r.into_inner()))
                }
            }
        })
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind");
    let addr = server.local_addr().clone();
    let handle = server.shutdown_handle();
    tokio::spawn(server.serve());
    let ch = Channel::connect(addr).await.expect("connect");

    let t0 = Instant::now();
    let slow = async {
        let r = ch
            .unary(RawCodec, "/t.S/Sleepy", Bytes::from_static(b"slow"))
            .await;
        (r.map(|r| r.into_inner()), t0.elapsed())
    };
    let fast = async {
        sleeping.notified().await;
        let start = Instant::now();
        let calls = (0..1000u32).map(|i| {
            let ch = &ch;
            async move {
                let body = Bytes::from(i.to_string());
                let r = ch.unary(RawCodec, "/t.S/Fast", body.clone()).await;
                assert_eq!(r.expect("fast call").into_inner(), body);
            }
        });
        futures_util::future::join_all(calls).await;
        (start.elapsed(), t0.elapsed())
    };
    let ((slow, slow_done), (fast_took, fast_done)) =
        tokio::time::timeout(Duration::from_secs(30), async { tokio::join!(slow, fast) })
            .await
            .expect("the calls finish");
    assert_eq!(slow.expect("slow call"), Bytes::from_static(b"slow"));
    println!(
        "1,000 fast calls beside a blocked handler: {fast_took:?} (done at {fast_done:?}; the \
         blocked call at {slow_done:?})"
    );
    assert!(
        fast_done < slow_done,
        "the fast calls (done at {fast_done:?}) waited for the blocked handler ({slow_done:?})"
    );
    handle.shutdown(Duration::from_secs(1)).await;
}

/// Handlers moved off the connection task leave no call behind however they end (answer,
/// error, panic, the client's cancel, the deadline): the server's table of open calls goes
/// back to empty, which `idle_timeout` shows by closing the connection (the next call then
/// comes from a new client port).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_handlers_leave_no_open_call_behind() {
    let config = topspin::Config::default().with_idle_timeout(Some(Duration::from_millis(300)));
    let server = Server::builder()
        .config(config)
        .unary("/t.S/Peer", RawCodec, |r: Request<Bytes>| async move {
            let peer = r.peer_addr().map(|p| p.to_string()).unwrap_or_default();
            Ok(Response::new(Bytes::from(peer)))
        })
        .unary("/t.S/Later", RawCodec, |r: Request<Bytes>| async move {
            tokio::task::yield_now().await;
            match r.get_ref().as_ref() {
                b"wait" => tokio::time::sleep(Duration::from_secs(30)).await,
                b"block" => std::thread::sleep(Duration::from_millis(50)),
                b"fail" => return Err(Status::not_found("no")),
                _ => {}
            }
            Ok(Response::new(boom(r.get_ref())?))
        })
        .server_streaming("/t.S/Out", RawCodec, |_r: Request<Bytes>| async move {
            tokio::task::yield_now().await;
            let items = futures_util::stream::iter(0..20).then(|i| async move {
                tokio::task::yield_now().await;
                Ok(Bytes::from(format!("{i}")))
            });
            Ok(Response::new(items))
        })
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind");
    let addr = server.local_addr().clone();
    let handle = server.shutdown_handle();
    tokio::spawn(server.serve());
    let ch = Channel::connect(addr).await.expect("connect");
    let peer = |ch: Channel| async move {
        ch.unary(RawCodec, "/t.S/Peer", Bytes::new())
            .await
            .expect("peer")
            .into_inner()
    };
    let first = peer(ch.clone()).await;

    let later = |body: &'static [u8], timeout: Option<Duration>| {
        let ch = ch.clone();
        async move {
            let mut req = Request::new(Bytes::from_static(body));
            if let Some(t) = timeout {
                req = req.with_timeout(t);
            }
            ch.unary(RawCodec, "/t.S/Later", req).await.map(|_| ())
        }
    };
    let mut calls = Vec::new();
    for _ in 0..20 {
        calls.push(tokio::spawn(later(b"ok", None)));
        calls.push(tokio::spawn(later(b"fail", None)));
        calls.push(tokio::spawn(later(b"boom", None)));
        calls.push(tokio::spawn(later(b"block", None)));
        calls.push(tokio::spawn(later(
            b"wait",
            Some(Duration::from_millis(50)),
        )));
        // The client gives up (drops the call): the server sees a cancel.
        let cancelled = later(b"wait", None);
        calls.push(tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_millis(50), cancelled).await;
            Ok(())
        }));
    }
    for c in calls {
        let _ = tokio::time::timeout(Duration::from_secs(10), c)
            .await
            .expect("each call ends");
    }
    let mut s = ch
        .server_streaming(RawCodec, "/t.S/Out", Bytes::new())
        .await
        .expect("stream")
        .into_inner();
    let mut n = 0;
    while s.message().await.expect("message").is_some() {
        n += 1;
    }
    assert_eq!(n, 20);

    // Idle for longer than `idle_timeout`: the server closes the connection only if no call is
    // left open on it.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let second = peer(ch.clone()).await;
    assert_ne!(
        first, second,
        "the server's connection never went idle: a call was left open"
    );
    handle.shutdown(Duration::from_secs(1)).await;
}

/// The server's shutdown reaches a handler running on its own task: when the grace period
/// ends, its call's cancellation fires and its future is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_reaches_a_spawned_handler() {
    let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<()>();
    let dropped_tx = std::sync::Mutex::new(Some(dropped_tx));
    let kept = std::sync::Arc::new(std::sync::Mutex::new(None));
    let k = kept.clone();
    let server = Server::builder()
        .unary("/t.S/Forever", RawCodec, move |r: Request<Bytes>| {
            *k.lock().unwrap() = r.cancellation();
            let tx = dropped_tx.lock().unwrap().take();
            async move {
                struct Dropped(Option<tokio::sync::oneshot::Sender<()>>);
                impl Drop for Dropped {
                    fn drop(&mut self) {
                        if let Some(tx) = self.0.take() {
                            let _ = tx.send(());
                        }
                    }
                }
                let _dropped = Dropped(tx);
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(Response::new(r.into_inner()))
            }
        })
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind");
    let addr = server.local_addr().clone();
    let handle = server.shutdown_handle();
    let serving = tokio::spawn(server.serve());
    let ch = Channel::connect(addr).await.expect("connect");
    let call = tokio::spawn(async move {
        ch.unary(RawCodec, "/t.S/Forever", Bytes::from_static(b"x"))
            .await
    });
    // The handler is running (on its own task) once its handle is kept.
    tokio::time::timeout(Duration::from_secs(5), async {
        while kept.lock().unwrap().is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the handler starts");
    tokio::time::timeout(
        Duration::from_secs(5),
        handle.shutdown(Duration::from_millis(100)),
    )
    .await
    .expect("shutdown ends");
    tokio::time::timeout(Duration::from_secs(5), dropped_rx)
        .await
        .expect("the handler's future is dropped")
        .expect("dropped once");
    let c = kept.lock().unwrap().take().expect("kept");
    assert!(c.is_cancelled());
    let err = call
        .await
        .expect("task")
        .expect_err("the call did not finish");
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    let _ = tokio::time::timeout(Duration::from_secs(5), serving).await;
}

/// A handler that blocks its thread before its first `.await` holds up its connection once:
/// the server learns it, and from then on that method's calls start on a task of their own,
/// so a quick call on the same connection no longer waits behind one (on tonic it never
/// would). Told by order, not by timing (`blocking::Handlers`): the second blocking handler
/// stays blocked until the quick one has run, or 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_blocks_holds_up_its_connection_once() {
    static H: common::blocking::Handlers = common::blocking::Handlers::new();
    let server = Server::builder()
        .unary("/t.S/Block", RawCodec, |_r: Request<Bytes>| async move {
            Ok(Response::new(Bytes::from_static(H.block().as_bytes())))
        })
        .unary("/t.S/Quick", RawCodec, |_r: Request<Bytes>| async move {
            Ok(Response::new(Bytes::from_static(H.quick().as_bytes())))
        })
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind");
    let addr = server.local_addr().clone();
    tokio::spawn(server.serve());
    let ch = Channel::connect(addr).await.expect("connect");
    // The first blocking call: learnt.
    let r = ch.unary(RawCodec, "/t.S/Block", Bytes::new()).await;
    assert_eq!(&r.expect("learnt").into_inner()[..], b"learnt");
    // The second runs on its own task: a quick call meanwhile is answered first.
    let blocking = {
        let ch = ch.clone();
        tokio::spawn(async move { ch.unary(RawCodec, "/t.S/Block", Bytes::new()).await })
    };
    H.wait_for_second();
    let quick = ch
        .unary(RawCodec, "/t.S/Quick", Bytes::new())
        .await
        .expect("quick");
    assert_eq!(
        &quick.into_inner()[..],
        b"during",
        "the quick call waited for the blocking one"
    );
    let blocked = blocking.await.unwrap().expect("blocking call");
    assert_eq!(&blocked.into_inner()[..], b"saw the quick call");
}
