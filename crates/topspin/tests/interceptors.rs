//! Interceptors over real TCP sockets: authentication, metadata added by the client seen by
//! the handler, ordering, the outcome callback, per-service registration, asynchronous
//! interceptors, and every call kind reporting its end.

use bytes::Bytes;
use futures_util::{stream, StreamExt};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::interceptor::{
    from_fn, AsyncInterceptor, BoxFuture, CallEnd, CallInfo, Interceptor, Side,
};
use topspin::{
    Channel, Code, Endpoint, Request, Response, Server, ServerBuilder, ShutdownHandle, Status,
    Streaming,
};

const ECHO: &str = "/a.A/Echo";
const FAIL: &str = "/a.A/Fail";
const OTHER: &str = "/b.B/Echo";
const SERVER_STREAM: &str = "/a.A/ServerStream";
const CLIENT_STREAM: &str = "/a.A/ClientStream";

/// A bearer-token check that rejects with UNAUTHENTICATED.
struct Auth;

impl Interceptor for Auth {
    fn on_call(&self, call: &mut CallInfo) -> Result<(), Status> {
        match call.metadata().get_str("authorization") {
            Some("Bearer s3cret") => Ok(()),
            _ => Err(Status::unauthenticated("a valid bearer token is required")),
        }
    }
}

fn add_token() -> impl Interceptor {
    from_fn(|call: &mut CallInfo| {
        call.append_metadata("authorization", b"Bearer s3cret")
            .map_err(|e| Status::internal(e.to_string()))
    })
}

/// Records `on_call` and `on_end` in a shared log.
#[derive(Clone)]
struct Log {
    name: &'static str,
    log: Arc<Mutex<Vec<String>>>,
}

impl Interceptor for Log {
    fn on_call(&self, call: &mut CallInfo) -> Result<(), Status> {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} call {}", self.name, call.method()));
        Ok(())
    }
    fn on_end(&self, call: &CallInfo, end: &CallEnd<'_>) {
        self.log.lock().unwrap().push(format!(
            "{} end {} {}",
            self.name,
            call.method(),
            end.code().name()
        ));
    }
}

/// What `on_end` saw.
#[derive(Clone, Debug)]
struct Ended {
    side: Side,
    method: String,
    code: Code,
    duration: Duration,
    request_bytes: u64,
    response_bytes: u64,
}

#[derive(Clone, Default)]
struct Outcomes(Arc<Mutex<Vec<Ended>>>);

impl Interceptor for Outcomes {
    fn on_end(&self, call: &CallInfo, end: &CallEnd<'_>) {
        self.0.lock().unwrap().push(Ended {
            side: call.side(),
            method: call.method().to_owned(),
            code: end.code(),
            duration: end.duration(),
            request_bytes: end.request_bytes(),
            response_bytes: end.response_bytes(),
        });
    }
}

impl Outcomes {
    /// Waits (bounded) for `n` recorded ends: a server's end is recorded as its answer
    /// leaves, a response stream's as its last item passes.
    async fn wait_for(&self, n: usize) -> Vec<Ended> {
        for _ in 0..500 {
            if self.0.lock().unwrap().len() >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.0.lock().unwrap().clone()
    }
}

struct Running {
    channel_address: topspin::Address,
    shutdown: ShutdownHandle,
    handled: Arc<AtomicUsize>,
}

impl Running {
    async fn channel(&self) -> Channel {
        Channel::connect(self.channel_address.clone())
            .await
            .unwrap()
    }
    async fn channel_with(&self, f: impl FnOnce(Endpoint) -> Endpoint) -> Channel {
        f(Endpoint::new(self.channel_address.clone()).unwrap())
            .connect()
            .await
            .unwrap()
    }
    async fn stop(self) {
        self.shutdown.shutdown(Duration::from_secs(1)).await;
    }
}

/// A server on loopback TCP with the test methods; `f` adds interceptors. Handlers count
/// their runs; `ECHO` answers the request's `authorization` and `x-client` values in the
/// response headers.
async fn serve(f: impl FnOnce(ServerBuilder) -> ServerBuilder) -> Running {
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let h2 = handled.clone();
    let h3 = handled.clone();
    let builder = Server::builder()
        .unary(ECHO, RawCodec, move |req: Request<Bytes>| {
            h.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut md = topspin::Metadata::builder();
                for key in ["authorization", "x-client", "x-order"] {
                    if let Some(v) = req.metadata().get_str(key) {
                        md = md.text(key, v).unwrap();
                    }
                }
                Ok(Response::new(req.into_inner()).with_metadata(md.build()))
            }
        })
        .unary(FAIL, RawCodec, move |_req: Request<Bytes>| {
            h2.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                Err::<Response<Bytes>, _>(Status::not_found("nothing here"))
            }
        })
        .unary(OTHER, RawCodec, move |req: Request<Bytes>| {
            h3.fetch_add(1, Ordering::SeqCst);
            async move { Ok(Response::new(req.into_inner())) }
        })
        .server_streaming(SERVER_STREAM, RawCodec, |req: Request<Bytes>| async move {
            let m = req.into_inner();
            Ok(Response::new(stream::iter(vec![
                Ok(m.clone()),
                Ok(m.clone()),
                Ok(m),
            ])))
        })
        .client_streaming(
            CLIENT_STREAM,
            RawCodec,
            |req: Request<Streaming<Bytes>>| async move {
                let mut s = req.into_inner();
                let mut n = 0usize;
                while let Some(m) = s.next().await {
                    n += m?.len();
                }
                Ok(Response::new(Bytes::from(n.to_string())))
            },
        );
    let server = f(builder).bind("tcp://127.0.0.1:0").await.unwrap();
    let running = Running {
        channel_address: server.local_addr().clone(),
        shutdown: server.shutdown_handle(),
        handled,
    };
    tokio::spawn(server.serve());
    running
}

fn hello() -> Request<Bytes> {
    Request::new(Bytes::from_static(b"hello"))
}

#[tokio::test]
async fn bearer_token_check_rejects_without_a_token_and_accepts_with_one() {
    let server = serve(|b| b.interceptor(Auth)).await;

    let anonymous = server.channel().await;
    let err = anonymous.unary(RawCodec, ECHO, hello()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    assert_eq!(
        server.handled.load(Ordering::SeqCst),
        0,
        "the handler of a rejected call never runs"
    );

    let wrong = server
        .channel_with(|e| {
            e.interceptor(from_fn(|c: &mut CallInfo| {
                c.append_metadata("authorization", b"Bearer guess")
                    .map_err(|e| Status::internal(e.to_string()))
            }))
        })
        .await;
    let err = wrong.unary(RawCodec, ECHO, hello()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    // Metadata added by a client interceptor is what the server's interceptor and handler see.
    let authorized = server.channel_with(|e| e.interceptor(add_token())).await;
    let reply = authorized.unary(RawCodec, ECHO, hello()).await.unwrap();
    assert_eq!(reply.get_ref(), &Bytes::from_static(b"hello"));
    assert_eq!(
        reply.metadata().get_str("authorization"),
        Some("Bearer s3cret")
    );
    assert_eq!(server.handled.load(Ordering::SeqCst), 1);

    // Batches go through the interceptors too.
    let batch = authorized
        .unary_batch(RawCodec, ECHO, vec![hello(), hello()])
        .await;
    assert!(batch.iter().all(|r| r.is_ok()), "{batch:?}");
    server.stop().await;
}

#[tokio::test]
async fn client_interceptor_metadata_is_seen_by_the_handler_alongside_the_callers() {
    let server = serve(|b| b).await;
    let ch = server
        .channel_with(|e| {
            e.interceptor(from_fn(|c: &mut CallInfo| {
                assert_eq!(c.side(), Side::Client);
                assert_eq!(c.method(), ECHO);
                c.append_metadata("x-client", b"interceptor")
                    .map_err(|e| Status::internal(e.to_string()))
            }))
        })
        .await;
    let md = topspin::Metadata::builder()
        .text("x-order", "caller")
        .unwrap()
        .build();
    let reply = ch
        .unary(RawCodec, ECHO, hello().with_metadata(md))
        .await
        .unwrap();
    assert_eq!(reply.metadata().get_str("x-client"), Some("interceptor"));
    assert_eq!(reply.metadata().get_str("x-order"), Some("caller"));
    server.stop().await;
}

#[tokio::test]
async fn interceptors_run_in_registration_order_outer_to_inner() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let a = Log {
        name: "server-a",
        log: log.clone(),
    };
    let b = Log {
        name: "server-b",
        log: log.clone(),
    };
    let server = serve(|s| s.interceptor(a).interceptor(b)).await;
    let ca = Log {
        name: "client-a",
        log: log.clone(),
    };
    let cb = Log {
        name: "client-b",
        log: log.clone(),
    };
    let ch = server
        .channel_with(|e| e.interceptor(ca).interceptor(cb))
        .await;
    ch.unary(RawCodec, ECHO, hello()).await.unwrap();
    // The server's ends are recorded as its answer leaves: wait for all eight entries.
    for _ in 0..500 {
        if log.lock().unwrap().len() >= 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let log = log.lock().unwrap().clone();
    let client: Vec<_> = log.iter().filter(|l| l.starts_with("client")).collect();
    let server_side: Vec<_> = log.iter().filter(|l| l.starts_with("server")).collect();
    assert_eq!(
        client,
        [
            "client-a call /a.A/Echo",
            "client-b call /a.A/Echo",
            "client-b end /a.A/Echo OK",
            "client-a end /a.A/Echo OK"
        ]
    );
    assert_eq!(
        server_side,
        [
            "server-a call /a.A/Echo",
            "server-b call /a.A/Echo",
            "server-b end /a.A/Echo OK",
            "server-a end /a.A/Echo OK"
        ]
    );
    // The client's interceptors ran before the server's.
    assert!(log[0].starts_with("client-a call") && log[1].starts_with("client-b call"));
    server.stop().await;
}

#[tokio::test]
async fn a_rejection_stops_the_inner_interceptors_and_the_outer_ones_see_it() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let outer = Log {
        name: "outer",
        log: log.clone(),
    };
    let inner = Log {
        name: "inner",
        log: log.clone(),
    };
    let server = serve(|s| s).await;
    let ch = server
        .channel_with(|e| {
            e.interceptor(outer)
                .interceptor(from_fn(|_: &mut CallInfo| {
                    Err(Status::permission_denied("not from here"))
                }))
                .interceptor(inner)
        })
        .await;
    let err = ch.unary(RawCodec, ECHO, hello()).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(
        *log.lock().unwrap(),
        [
            "outer call /a.A/Echo".to_string(),
            "outer end /a.A/Echo PERMISSION_DENIED".to_string()
        ]
    );
    assert_eq!(
        server.handled.load(Ordering::SeqCst),
        0,
        "a call a client interceptor rejects is never sent"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_outcome_callback_sees_the_status_and_a_duration_on_both_sides() {
    let outcomes = Outcomes::default();
    let o = outcomes.clone();
    let server = serve(move |s| s.interceptor(o)).await;
    let ch = server
        .channel_with(|e| e.interceptor(outcomes.clone()))
        .await;
    let err = ch.unary(RawCodec, FAIL, hello()).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    ch.unary(RawCodec, ECHO, hello()).await.unwrap();
    let ended = outcomes.wait_for(4).await;
    assert_eq!(ended.len(), 4, "{ended:?}");
    for side in [Side::Client, Side::Server] {
        let fail = ended
            .iter()
            .find(|e| e.side == side && e.method == FAIL)
            .unwrap_or_else(|| panic!("no end of {FAIL} on the {side:?} side: {ended:?}"));
        assert_eq!(fail.code, Code::NotFound);
        // The handler sleeps 30 ms before it answers (a lower bound only).
        assert!(fail.duration >= Duration::from_millis(30), "{fail:?}");
        assert!(fail.duration < Duration::from_secs(60), "{fail:?}");
        let ok = ended
            .iter()
            .find(|e| e.side == side && e.method == ECHO)
            .unwrap();
        assert_eq!(ok.code, Code::Ok);
        assert_eq!((ok.request_bytes, ok.response_bytes), (5, 5), "{ok:?}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_service_interceptor_applies_to_its_service_only() {
    let server = serve(|s| s.service_interceptor("/a.A/", Auth)).await;
    let ch = server.channel().await;
    let err = ch.unary(RawCodec, ECHO, hello()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let other = ch.unary(RawCodec, OTHER, hello()).await.unwrap();
    assert_eq!(other.get_ref(), &Bytes::from_static(b"hello"));

    // The same on the client: the token goes to /b.B/ only, so /a.A/ stays rejected.
    let ch = server
        .channel_with(|e| e.service_interceptor("/b.B/", add_token()))
        .await;
    let err = ch.unary(RawCodec, ECHO, hello()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let ch = server
        .channel_with(|e| e.service_interceptor("/a.A/", add_token()))
        .await;
    ch.unary(RawCodec, ECHO, hello()).await.unwrap();
    server.stop().await;
}

/// Looks the token up asynchronously.
struct AsyncAuth;

impl AsyncInterceptor for AsyncAuth {
    fn on_call<'a>(&'a self, call: &'a mut CallInfo) -> BoxFuture<'a, Result<(), Status>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Auth.on_call(call)
        })
    }
}

/// Adds the token after waiting.
struct AsyncToken;

impl AsyncInterceptor for AsyncToken {
    fn on_call<'a>(&'a self, call: &'a mut CallInfo) -> BoxFuture<'a, Result<(), Status>> {
        Box::pin(async move {
            tokio::task::yield_now().await;
            call.append_metadata("authorization", b"Bearer s3cret")
                .map_err(|e| Status::internal(e.to_string()))
        })
    }
}

#[tokio::test]
async fn async_interceptors_reject_or_pass_on_both_sides() {
    let outcomes = Outcomes::default();
    let o = outcomes.clone();
    let server = serve(move |s| s.interceptor(o).async_interceptor(AsyncAuth)).await;
    let anonymous = server.channel().await;
    let err = anonymous.unary(RawCodec, ECHO, hello()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert_eq!(server.handled.load(Ordering::SeqCst), 0);

    let ch = server
        .channel_with(|e| e.async_interceptor(AsyncToken))
        .await;
    ch.unary(RawCodec, ECHO, hello()).await.unwrap();
    assert_eq!(server.handled.load(Ordering::SeqCst), 1);
    let ended = outcomes.wait_for(2).await;
    let codes: Vec<Code> = ended.iter().map(|e| e.code).collect();
    assert_eq!(codes, [Code::Unauthenticated, Code::Ok]);
    server.stop().await;
}

#[tokio::test]
async fn streaming_calls_report_their_end_and_sizes() {
    let outcomes = Outcomes::default();
    let o = outcomes.clone();
    let server = serve(move |s| s.interceptor(o)).await;
    let ch = server
        .channel_with(|e| e.interceptor(outcomes.clone()))
        .await;
    let mut s = ch
        .server_streaming(RawCodec, SERVER_STREAM, hello())
        .await
        .unwrap()
        .into_inner();
    let mut n = 0;
    while let Some(m) = s.next().await {
        m.unwrap();
        n += 1;
    }
    assert_eq!(n, 3);
    let requests = stream::iter(vec![Bytes::from_static(b"ab"), Bytes::from_static(b"cde")]);
    let r = ch
        .client_streaming(RawCodec, CLIENT_STREAM, Request::new(requests))
        .await
        .unwrap();
    assert_eq!(r.get_ref(), &Bytes::from_static(b"5"));
    let ended = outcomes.wait_for(4).await;
    let find = |side, method| {
        ended
            .iter()
            .find(|e| e.side == side && e.method == method)
            .unwrap_or_else(|| panic!("no {side:?} end of {method}: {ended:?}"))
            .clone()
    };
    let client_ss = find(Side::Client, SERVER_STREAM);
    assert_eq!(client_ss.code, Code::Ok);
    assert_eq!(client_ss.response_bytes, 15);
    assert_eq!(find(Side::Server, SERVER_STREAM).code, Code::Ok);
    let server_cs = find(Side::Server, CLIENT_STREAM);
    assert_eq!(server_cs.code, Code::Ok);
    // Counted as flow control counts them: 5 bytes of messages plus their frame headers.
    assert!(
        (5..5 + 2 * 64).contains(&server_cs.request_bytes),
        "{server_cs:?}"
    );
    assert_eq!(find(Side::Client, CLIENT_STREAM).code, Code::Ok);
    server.stop().await;
}

#[tokio::test]
async fn a_call_dropped_by_its_caller_ends_cancelled_for_the_interceptors() {
    let outcomes = Outcomes::default();
    let server = serve(|s| s).await;
    let ch = server
        .channel_with(|e| e.interceptor(outcomes.clone()))
        .await;
    let call = ch.unary(RawCodec, FAIL, hello()); // answers after 30 ms
    let _ = tokio::time::timeout(Duration::from_millis(5), call).await;
    let ended = outcomes.wait_for(1).await;
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].code, Code::Cancelled);
    server.stop().await;
}

/// Counts the allocations of the current thread (a test's own client, server and runtime on
/// a current-thread runtime; the other tests run on other threads).
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    pub struct Counting;

    thread_local! {
        static ALLOCS: Cell<u64> = const { Cell::new(0) };
    }

    fn count() {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
    }

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count();
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count();
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    pub fn allocations() -> u64 {
        ALLOCS.with(|c| c.get())
    }
}

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

/// Reads the metadata, changes nothing.
struct Reads;

impl Interceptor for Reads {
    fn on_call(&self, call: &mut CallInfo) -> Result<(), Status> {
        let _ = call.metadata().get("authorization");
        Ok(())
    }
}

/// Allocations per warm unary call (client and server together) on a channel made by `f`.
async fn allocations_per_call(server: &Running, f: impl FnOnce(Endpoint) -> Endpoint) -> f64 {
    let ch = server.channel_with(f).await;
    for _ in 0..500 {
        ch.unary(RawCodec, OTHER, hello()).await.unwrap();
    }
    const N: u64 = 2_000;
    let a0 = counting::allocations();
    for _ in 0..N {
        ch.unary(RawCodec, OTHER, hello()).await.unwrap();
    }
    (counting::allocations() - a0) as f64 / N as f64
}

#[tokio::test(flavor = "current_thread")]
async fn interceptors_cost_nothing_where_they_do_not_apply_and_little_where_they_do() {
    // Interceptors for another service only: the calls of /b.B/ take the fast path.
    let server = serve(|s| s.service_interceptor("/a.A/", Reads)).await;
    let per_call = allocations_per_call(&server, |e| e.service_interceptor("/a.A/", Reads)).await;
    assert!(per_call < 0.01, "{per_call} allocations per call");
    server.stop().await;

    // A synchronous interceptor on the server: its boxes are reused, none per call.
    let server = serve(|s| s.interceptor(Reads)).await;
    let per_call = allocations_per_call(&server, |e| e).await;
    assert!(per_call < 0.01, "{per_call} allocations per call");

    // And one on the client too: the client's observed path boxes its call record and its
    // start (a few per call).
    let per_call = allocations_per_call(&server, |e| e.interceptor(Reads)).await;
    println!("{per_call} allocations per call with an interceptor on each side");
    assert!(per_call <= 4.0, "{per_call} allocations per call");
    server.stop().await;
}

/// Never decides.
struct Hangs;

impl AsyncInterceptor for Hangs {
    fn on_call<'a>(&'a self, _call: &'a mut CallInfo) -> BoxFuture<'a, Result<(), Status>> {
        Box::pin(std::future::pending())
    }
}

#[tokio::test]
async fn an_async_interceptor_that_never_decides_ends_its_call_at_the_deadline() {
    let server_outcomes = Outcomes::default();
    let server_log = Arc::new(Mutex::new(Vec::new()));
    let (o, l) = (server_outcomes.clone(), server_log.clone());
    let server = serve(move |s| {
        s.interceptor(o)
            .service_async_interceptor("/b.B/", Hangs)
            .interceptor(Log {
                name: "inner",
                log: l,
            })
    })
    .await;

    // Client side: the call never leaves, and ends at its deadline.
    let client_outcomes = Outcomes::default();
    let client_log = Arc::new(Mutex::new(Vec::new()));
    let l = client_log.clone();
    let ch = server
        .channel_with(|e| {
            e.interceptor(client_outcomes.clone())
                .service_async_interceptor("/a.A/", Hangs)
                .interceptor(Log {
                    name: "inner",
                    log: l,
                })
        })
        .await;
    let err = ch
        .unary(
            RawCodec,
            ECHO,
            hello().with_timeout(Duration::from_millis(50)),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    let ended = client_outcomes.wait_for(1).await;
    assert_eq!(ended[0].code, Code::DeadlineExceeded);
    assert!(
        client_log.lock().unwrap().is_empty(),
        "interceptors after the one that never decided neither start nor end"
    );
    assert_eq!(server.handled.load(Ordering::SeqCst), 0);

    // Server side: the connection drops the call at its deadline, the handler never runs.
    let err = ch
        .unary(
            RawCodec,
            OTHER,
            hello().with_timeout(Duration::from_millis(50)),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    let ended = server_outcomes.wait_for(1).await;
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0].code, Code::DeadlineExceeded);
    assert!(server_log.lock().unwrap().is_empty());
    assert_eq!(server.handled.load(Ordering::SeqCst), 0);
    server.stop().await;
}
