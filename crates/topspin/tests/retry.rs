//! Retries, hedging, the retry budget, transparent retry and wait_for_ready, over real loopback
//! sockets against real topspin servers (and, for the cases a real server cannot be made to
//! produce on demand, a small front of the test's own in front of one: a listener that closes a
//! connection during the handshake, or answers a call with a GOAWAY that excludes it).

use bytes::{Bytes, BytesMut};
use futures_util::{stream, StreamExt};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use topspin::codec::RawCodec;
use topspin::retry::PREVIOUS_ATTEMPTS;
use topspin::{
    Address, Channel, Code, Endpoint, HedgingPolicy, Request, Response, RetryBudget, RetryPolicy,
    Server, ServerBuilder, ShutdownHandle, Status,
};

const FLAKY: &str = "/t.S/Flaky";
const FAIL: &str = "/t.S/Fail";
const PUT: &str = "/t.S/Put";
const ECHO: &str = "/t.S/Echo";
const STREAM: &str = "/t.S/Stream";
const COLLECT: &str = "/t.S/Collect";
const HEDGED: &str = "/t.S/Hedged";
const SPOOF: &str = "/t.S/Spoof";

/// What the server saw.
#[derive(Default)]
struct Seen {
    /// Handler runs, every method.
    attempts: AtomicUsize,
    /// The PREVIOUS_ATTEMPTS entry of each run, in order.
    previous: Mutex<Vec<Option<String>>>,
    /// A hedged call's first attempt was cancelled.
    cancelled: AtomicBool,
    cancel: tokio::sync::Notify,
}

impl Seen {
    fn record<T>(&self, req: &Request<T>) -> usize {
        let prev = req.metadata().get_str(PREVIOUS_ATTEMPTS).map(str::to_owned);
        self.previous.lock().unwrap().push(prev);
        self.attempts.fetch_add(1, Ordering::SeqCst)
    }
    fn attempts(&self) -> usize {
        self.attempts.load(Ordering::SeqCst)
    }
}

/// A server: FLAKY fails its first `fail_first` runs with UNAVAILABLE; FAIL always fails with
/// the code in its request ("unavailable" or "precondition"); PUT always UNAVAILABLE; ECHO
/// echoes; STREAM fails its first run, then streams three messages; COLLECT (client stream)
/// fails UNAVAILABLE; HEDGED: its first attempt never answers (and notes its cancellation),
/// later ones answer "fast".
fn service(seen: Arc<Seen>, fail_first: usize) -> ServerBuilder {
    let s = seen.clone();
    let b = Server::builder().unary(FLAKY, RawCodec, move |req: Request<Bytes>| {
        let n = s.record(&req);
        async move {
            if n < fail_first {
                Err(Status::unavailable(format!("attempt {n} fails")))
            } else {
                Ok(Response::new(Bytes::from("ok")))
            }
        }
    });
    let s = seen.clone();
    let b = b.unary(FAIL, RawCodec, move |req: Request<Bytes>| {
        s.record(&req);
        let code = match req.get_ref().as_ref() {
            b"precondition" => Code::FailedPrecondition,
            _ => Code::Unavailable,
        };
        async move { Err::<Response<Bytes>, _>(Status::new(code, "failing on purpose")) }
    });
    let s = seen.clone();
    let b = b.unary(PUT, RawCodec, move |req: Request<Bytes>| {
        s.record(&req);
        async move { Err::<Response<Bytes>, _>(Status::unavailable("put fails")) }
    });
    let s = seen.clone();
    let b = b.unary(ECHO, RawCodec, move |req: Request<Bytes>| {
        s.record(&req);
        async move { Ok(Response::new(req.into_inner())) }
    });
    let s = seen.clone();
    let b = b.server_streaming(STREAM, RawCodec, move |req: Request<Bytes>| {
        let n = s.record(&req);
        async move {
            if n == 0 {
                return Err(Status::unavailable("first stream attempt fails"));
            }
            let items = ["a", "b", "c"].map(|m| Ok(Bytes::from(m)));
            Ok(Response::new(stream::iter(items)))
        }
    });
    let s = seen.clone();
    let b = b.client_streaming(
        COLLECT,
        RawCodec,
        move |req: Request<topspin::Streaming<Bytes>>| {
            s.record(&req);
            async move { Err::<Response<Bytes>, _>(Status::unavailable("collect fails")) }
        },
    );
    let s = seen.clone();
    let b = b.unary(SPOOF, RawCodec, move |req: Request<Bytes>| {
        s.record(&req);
        // A server claiming, in the client runtime's internal key, that the call was never sent.
        let md = topspin::Metadata::builder()
            .text("topspin-internal-unsent", "1")
            .and_then(|b| b.text("kept", "yes"))
            .map(|b| b.build())
            .unwrap_or_default();
        async move { Err::<Response<Bytes>, _>(Status::unavailable("spoofed").with_metadata(md)) }
    });
    let s = seen;
    b.unary(HEDGED, RawCodec, move |req: Request<Bytes>| {
        let first = req.metadata().get_str(PREVIOUS_ATTEMPTS).is_none();
        s.record(&req);
        let s = s.clone();
        async move {
            if first {
                if let Some(c) = req.cancellation() {
                    let s = s.clone();
                    tokio::spawn(async move {
                        c.cancelled().await;
                        s.cancelled.store(true, Ordering::SeqCst);
                        s.cancel.notify_one();
                    });
                }
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            Ok(Response::new(Bytes::from("fast")))
        }
    })
}

async fn start(b: ServerBuilder, addr: &str) -> (Address, ShutdownHandle) {
    let server = b.bind(addr).await.expect("bind");
    let a = server.local_addr().clone();
    let h = server.shutdown_handle();
    tokio::spawn(server.serve());
    (a, h)
}

async fn within<T>(secs: u64, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("timed out")
}

fn quick() -> RetryPolicy {
    RetryPolicy::default().with_backoff(Duration::from_millis(1), Duration::from_millis(5), 2.0)
}

fn socket_addr(a: &Address) -> std::net::SocketAddr {
    a.to_string()
        .trim_start_matches("tcp://")
        .parse()
        .expect("a tcp address")
}

async fn call(ch: &Channel, method: &'static str, body: &str) -> Result<Bytes, Status> {
    ch.unary(RawCodec, method, Request::new(Bytes::from(body.to_owned())))
        .await
        .map(Response::into_inner)
}

#[tokio::test]
async fn failed_attempts_are_retried_and_carry_the_attempt_count() {
    let seen = Arc::new(Seen::default());
    let (addr, h) = start(service(seen.clone(), 2), "tcp://127.0.0.1:0").await;
    let ch = Endpoint::new(addr)
        .unwrap()
        .retry_policy("/t.S/", quick())
        .connect()
        .await
        .unwrap();
    let reply = within(10, call(&ch, FLAKY, "x"))
        .await
        .expect("retried to success");
    assert_eq!(reply, Bytes::from("ok"));
    assert_eq!(seen.attempts(), 3, "two failures, then the success");
    let prev = seen.previous.lock().unwrap().clone();
    assert_eq!(prev, vec![None, Some("1".into()), Some("2".into())]);
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn attempts_stop_at_max_attempts_and_the_last_status_is_returned() {
    let seen = Arc::new(Seen::default());
    let (addr, h) = start(service(seen.clone(), 0), "tcp://127.0.0.1:0").await;
    let ch = Endpoint::new(addr)
        .unwrap()
        .retry_policy("", quick().with_max_attempts(4))
        .connect()
        .await
        .unwrap();
    let err = within(10, call(&ch, FAIL, "unavailable"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(err.message(), "failing on purpose");
    // The mark is a local flag (Status::is_unprocessed), never read from the wire: the key the
    // peer sent is ordinary metadata and changes nothing.
    assert!(!err.is_unprocessed());
    assert_eq!(seen.attempts(), 4);
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_code_the_policy_does_not_list_is_not_retried() {
    let seen = Arc::new(Seen::default());
    let (addr, h) = start(service(seen.clone(), 0), "tcp://127.0.0.1:0").await;
    let ch = Endpoint::new(addr)
        .unwrap()
        .retry_policy("", quick().with_max_attempts(5))
        .connect()
        .await
        .unwrap();
    let err = within(10, call(&ch, FAIL, "precondition"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(seen.attempts(), 1);
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn methods_no_policy_marks_safe_are_never_retried() {
    let seen = Arc::new(Seen::default());
    let (addr, h) = start(service(seen.clone(), 0), "tcp://127.0.0.1:0").await;
    // Every method retried, except PUT.
    let ch = Endpoint::new(addr.clone())
        .unwrap()
        .retry_policy("", quick().with_max_attempts(5))
        .no_retry(PUT)
        .connect()
        .await
        .unwrap();
    let err = within(10, call(&ch, PUT, "x")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(
        seen.attempts(),
        1,
        "a method taken out of the policy is sent once"
    );
    // A policy for one method does not cover another.
    let ch = Endpoint::new(addr)
        .unwrap()
        .retry_policy(FLAKY, quick().with_max_attempts(5))
        .connect()
        .await
        .unwrap();
    let err = within(10, call(&ch, FAIL, "unavailable"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(seen.attempts(), 2);
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn the_budget_caps_retries_under_a_failing_server() {
    let seen = Arc::new(Seen::default());
    let (addr, h) = start(service(seen.clone(), 0), "tcp://127.0.0.1:0").await;
    const CALLS: usize = 100;
    // 5 attempts per call would be 500 attempts; the budget allows 10% of the calls plus a
    // reserve of 1/s over 10 s: at most 100 + 10 + 10 attempts.
    let ch = Endpoint::new(addr)
        .unwrap()
        .retry_policy("", quick().with_max_attempts(5))
        .retry_budget(RetryBudget::new(0.1, 1, Duration::from_secs(10)))
        .connect()
        .await
        .unwrap();
    within(60, async {
        for _ in 0..CALLS {
            let err = call(&ch, FAIL, "unavailable").await.unwrap_err();
            assert_eq!(err.code(), Code::Unavailable);
        }
    })
    .await;
    let attempts = seen.attempts();
    println!(
        "calls {CALLS}, server attempts {attempts} (uncapped: {})",
        CALLS * 5
    );
    assert!(attempts <= CALLS + CALLS / 10 + 10, "{attempts} attempts");
    assert!(
        attempts > CALLS,
        "the budget allowed some retries: {attempts}"
    );
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn retries_stop_at_the_deadline_and_when_the_call_is_dropped() {
    let seen = Arc::new(Seen::default());
    let (addr, h) = start(service(seen.clone(), 0), "tcp://127.0.0.1:0").await;
    let slow = RetryPolicy::default().with_max_attempts(10).with_backoff(
        Duration::from_millis(300),
        Duration::from_millis(300),
        1.0,
    );
    let ch = Endpoint::new(addr)
        .unwrap()
        .retry_policy("", slow)
        .retry_budget(RetryBudget::new(1.0, 100, Duration::from_secs(10)))
        .connect()
        .await
        .unwrap();
    // Deadline: the call ends by it (no pause that would pass it is taken).
    let t = Instant::now();
    let req = Request::new(Bytes::from("unavailable")).with_timeout(Duration::from_millis(400));
    let err = within(10, ch.unary(RawCodec, FAIL, req)).await.unwrap_err();
    assert!(
        matches!(err.code(), Code::Unavailable | Code::DeadlineExceeded),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let by_deadline = seen.attempts();
    assert!(by_deadline < 10, "{by_deadline}");
    // Dropped: no attempt after the drop.
    let c = ch.clone();
    let task = tokio::spawn(async move { call(&c, FAIL, "unavailable").await });
    within(10, async {
        while seen.attempts() < by_deadline + 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    task.abort();
    let _ = task.await;
    let at_drop = seen.attempts();
    // Pauses are at most 300 ms: a call still retrying would make several attempts in 1.5 s.
    // One attempt may already have been on its way when the call was dropped.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        seen.attempts() <= at_drop + 1,
        "attempts went on after the call was dropped: {} then {}",
        at_drop,
        seen.attempts()
    );
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn server_streaming_calls_are_retried_before_the_first_response() {
    let seen = Arc::new(Seen::default());
    let (addr, h) = start(service(seen.clone(), 0), "tcp://127.0.0.1:0").await;
    let ch = Endpoint::new(addr)
        .unwrap()
        .retry_policy("", quick())
        .connect()
        .await
        .unwrap();
    let resp = within(10, ch.server_streaming(RawCodec, STREAM, Bytes::from("x")))
        .await
        .expect("second attempt streams");
    let items: Vec<_> = within(10, resp.into_inner().collect::<Vec<_>>()).await;
    let items: Vec<Bytes> = items.into_iter().map(|i| i.unwrap()).collect();
    assert_eq!(
        items,
        vec![Bytes::from("a"), Bytes::from("b"), Bytes::from("c")]
    );
    assert_eq!(seen.attempts(), 2);
    // A client stream cannot be replayed: not retried, whatever the policy.
    let err = within(
        10,
        ch.client_streaming(RawCodec, COLLECT, stream::iter([Bytes::from("a")])),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(seen.attempts(), 3);
    h.shutdown(Duration::from_secs(1)).await;
}

/// Forwards a connection to `target` (both ways) until either side closes.
async fn forward(mut c: TcpStream, target: std::net::SocketAddr) {
    if let Ok(mut t) = TcpStream::connect(target).await {
        let _ = tokio::io::copy_bidirectional(&mut c, &mut t).await;
    }
}

/// A front for `target` whose first connection is handled by `first`; later ones are
/// forwarded. Returns its address and the number of connections it accepted.
async fn front<F, Fut>(target: std::net::SocketAddr, first: F) -> (String, Arc<AtomicUsize>)
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("tcp://{}", l.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let n = accepted.clone();
    tokio::spawn(async move {
        let mut first = Some(first);
        while let Ok((c, _)) = l.accept().await {
            n.fetch_add(1, Ordering::SeqCst);
            match first.take() {
                Some(f) => {
                    tokio::spawn(f(c));
                }
                None => {
                    tokio::spawn(forward(c, target));
                }
            }
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn a_call_whose_connection_failed_before_the_write_is_sent_again_once() {
    let seen = Arc::new(Seen::default());
    let (addr, h) = start(service(seen.clone(), 0), "tcp://127.0.0.1:0").await;
    // The first connection is closed during the handshake: the call was never written.
    let (front, accepted) = front(socket_addr(&addr), |c| async move { drop(c) }).await;
    let ch = Endpoint::new(front.as_str())
        .unwrap()
        .backoff(Duration::ZERO, Duration::ZERO)
        .connect_lazy();
    // No policy at all: transparent retry needs none.
    let reply = within(10, call(&ch, ECHO, "once"))
        .await
        .expect("sent again");
    assert_eq!(reply, Bytes::from("once"));
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    assert_eq!(seen.attempts(), 1, "the server ran the call exactly once");
    assert_eq!(*seen.previous.lock().unwrap(), vec![None]);
    h.shutdown(Duration::from_secs(1)).await;
}

/// Plays a topspin server over `c` with the protocol engine until the first CALL arrives, then
/// answers it with GOAWAY(last_call_id 0): the server says it never processed the call.
async fn go_away_before_processing(mut c: TcpStream) {
    use topspin_proto::{frame, CallId, Connection, ErrorCode, Event, Settings, Side};
    let mut conn = Connection::new(Side::Server, Settings::default());
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        match c.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if conn.handle_input(&mut buf, Instant::now()).is_err() {
            return;
        }
        while let Some(b) = conn.poll_transmit() {
            if c.write_all(&b).await.is_err() {
                return;
            }
        }
        while let Some(ev) = conn.poll_event() {
            if let Event::CallStarted { .. } = ev {
                let mut out = BytesMut::new();
                frame::encode_go_away(&mut out, CallId(0), ErrorCode::NO_ERROR, "leaving", 1 << 14);
                let _ = c.write_all(&out).await;
                // Keep the connection open: the client must act on the GOAWAY, not an EOF.
                tokio::time::sleep(Duration::from_secs(10)).await;
                return;
            }
        }
    }
}

#[tokio::test]
async fn a_call_above_the_goaway_last_call_id_is_sent_again_once() {
    let seen = Arc::new(Seen::default());
    let (addr, h) = start(service(seen.clone(), 0), "tcp://127.0.0.1:0").await;
    let (front, accepted) = front(socket_addr(&addr), go_away_before_processing).await;
    let ch = Endpoint::new(front.as_str())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let reply = within(10, call(&ch, ECHO, "once"))
        .await
        .expect("sent again");
    assert_eq!(reply, Bytes::from("once"));
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    assert_eq!(seen.attempts(), 1, "the server ran the call exactly once");
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_call_in_flight_when_its_connection_dies_is_not_sent_again_without_a_policy() {
    let seen = Arc::new(Seen::default());
    let (addr, h) = start(service(seen.clone(), 0), "tcp://127.0.0.1:0").await;
    // The first connection reaches the server, then is cut once the handler runs.
    let target = socket_addr(&addr);
    let s = seen.clone();
    let (front, _) = front(target, move |mut c| async move {
        if let Ok(mut t) = TcpStream::connect(target).await {
            let handler_ran = async {
                while s.attempts() == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut c, &mut t) => {}
                () = handler_ran => {}
            }
        }
    })
    .await;
    let ch = Endpoint::new(front.as_str())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let err = within(10, call(&ch, HEDGED, "x")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert_eq!(seen.attempts(), 1, "the server saw it: not sent again");
    h.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn hedging_sends_a_second_attempt_and_cancels_the_slow_one() {
    let seen = Arc::new(Seen::default());
    let (addr, h) = start(service(seen.clone(), 0), "tcp://127.0.0.1:0").await;
    let ch = Endpoint::new(addr)
        .unwrap()
        .hedging_policy(
            HEDGED,
            HedgingPolicy::default()
                .with_delay(Duration::from_millis(100))
                .with_max_attempts(2),
        )
        .connect()
        .await
        .unwrap();
    let t = Instant::now();
    let reply = within(10, call(&ch, HEDGED, "x"))
        .await
        .expect("the hedge answers");
    assert_eq!(reply, Bytes::from("fast"));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // The first attempt is cancelled on the server (CANCEL on the wire).
    within(5, async {
        while !seen.cancelled.load(Ordering::SeqCst) {
            seen.cancel.notified().await;
        }
    })
    .await;
    assert_eq!(seen.attempts(), 2);
    let prev = seen.previous.lock().unwrap().clone();
    assert_eq!(prev, vec![None, Some("1".into())]);
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn hedges_stop_at_max_attempts_and_respect_the_budget() {
    let seen = Arc::new(Seen::default());
    let (addr, h) = start(service(seen.clone(), 0), "tcp://127.0.0.1:0").await;
    // Every attempt of PUT fails UNAVAILABLE (non-fatal): hedging goes on to max_attempts.
    let ch = Endpoint::new(addr.clone())
        .unwrap()
        .hedging_policy("", HedgingPolicy::default().with_max_attempts(4))
        .connect()
        .await
        .unwrap();
    let err = within(10, call(&ch, PUT, "x")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(seen.attempts(), 4);
    // A budget with no room: no hedge at all.
    let ch = Endpoint::new(addr)
        .unwrap()
        .hedging_policy("", HedgingPolicy::default().with_max_attempts(4))
        .retry_budget(RetryBudget::new(0.0, 0, Duration::from_secs(10)))
        .connect()
        .await
        .unwrap();
    let err = within(10, call(&ch, PUT, "x")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(seen.attempts(), 5);
    h.shutdown(Duration::from_secs(1)).await;
}

/// A loopback port nothing listens on (bound, then released).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test]
async fn wait_for_ready_waits_for_the_server_to_come_up() {
    let seen = Arc::new(Seen::default());
    let port = free_port();
    let addr = format!("tcp://127.0.0.1:{port}");
    let ch = Endpoint::new(addr.as_str())
        .unwrap()
        .backoff(Duration::from_millis(20), Duration::from_millis(100))
        .connect_lazy();
    let c = ch.clone();
    let call = tokio::spawn(async move {
        let req = Request::new(Bytes::from("late"))
            .with_wait_for_ready(true)
            .with_timeout(Duration::from_secs(20));
        c.unary(RawCodec, ECHO, req).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!call.is_finished(), "the call waits");
    let (_, h) = start(service(seen.clone(), 0), &addr).await;
    let reply = within(20, call).await.unwrap().expect("served once up");
    assert_eq!(reply.into_inner(), Bytes::from("late"));
    assert_eq!(seen.attempts(), 1);
    h.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn without_wait_for_ready_an_unreachable_server_fails_fast() {
    let addr = format!("tcp://127.0.0.1:{}", free_port());
    let ch = Channel::lazy(addr.as_str()).unwrap();
    let t = Instant::now();
    let req = Request::new(Bytes::from("x")).with_timeout(Duration::from_secs(30));
    let err = within(10, ch.unary(RawCodec, ECHO, req)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(err.metadata().is_empty(), "no internal mark leaks: {err:?}");
    // With wait_for_ready, the deadline ends the wait.
    let t = Instant::now();
    let req = Request::new(Bytes::from("x"))
        .with_wait_for_ready(true)
        .with_timeout(Duration::from_millis(500));
    let err = within(10, ch.unary(RawCodec, ECHO, req)).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(
        t.elapsed() >= Duration::from_millis(450),
        "{:?}",
        t.elapsed()
    );
    // Streaming calls wait too.
    let req = Request::new(stream::iter([Bytes::from("a")]))
        .with_wait_for_ready(true)
        .with_timeout(Duration::from_millis(300));
    let err = within(10, ch.client_streaming(RawCodec, COLLECT, req))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
}

#[tokio::test]
async fn a_peer_cannot_make_the_client_resend_a_call_it_ran() {
    let seen = Arc::new(Seen::default());
    let (addr, h) = start(service(seen.clone(), 0), "tcp://127.0.0.1:0").await;
    let ch = Endpoint::new(addr).unwrap().connect().await.unwrap();
    let err = within(10, call(&ch, SPOOF, "x")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(
        seen.attempts(),
        1,
        "the internal mark from the wire was ignored"
    );
    // The mark is a local flag (Status::is_unprocessed), never read from the wire: the key the
    // peer sent is ordinary metadata and changes nothing.
    assert!(!err.is_unprocessed());
    assert_eq!(err.metadata().get_str("kept"), Some("yes"));
    h.shutdown(Duration::from_secs(1)).await;
}
