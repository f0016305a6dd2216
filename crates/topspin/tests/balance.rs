//! Channels over several servers (real topspin servers on loopback): static lists, `dns:///`,
//! a resolver stream whose set changes under calls in flight, both policies, health checks,
//! passive ejection, subsetting, draining on GOAWAY and a rolling restart under load.

use bytes::Bytes;
use futures_util::{stream, StreamExt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch, Notify};
use topspin::codec::RawCodec;
use topspin::{
    resolve, Address, Balancing, Channel, Code, Endpoint, Request, Response, Server,
    ShutdownHandle, Status,
};

const WHO: &str = "/b.Replica/Who";
const HOLD: &str = "/b.Replica/Hold";
const HEALTH_WATCH: &str = "/grpc.health.v1.Health/Watch";

/// `grpc.health.v1` messages encoded by hand, under the protobuf codec id as a real health
/// server registers them (`topspin-health` depends on this crate, so its tests cannot be here;
/// the namespace fault test runs the real one).
#[derive(Clone, Copy)]
struct Protobuf;

impl topspin::codec::Codec for Protobuf {
    type Encode = Bytes;
    type Decode = Bytes;
    const ID: u8 = topspin::codec::CODEC_PROTOBUF;
    fn encode(&self, item: Bytes) -> Result<Bytes, Status> {
        Ok(item)
    }
    fn decode(&self, buf: Bytes) -> Result<Bytes, Status> {
        Ok(buf)
    }
}

/// What a replica's handlers share with the test.
#[derive(Default)]
struct State {
    /// `Who` calls served.
    who: AtomicUsize,
    /// Executions per request id (the request body), to find lost or doubled calls.
    ids: Mutex<HashMap<u64, u32>>,
    /// `Who` answers UNAVAILABLE.
    failing: AtomicBool,
    /// `Hold` calls started, and their release.
    held: AtomicUsize,
    held_notify: Notify,
    release: Notify,
    released: AtomicBool,
}

struct Replica {
    name: String,
    addr: Address,
    handle: ShutdownHandle,
    task: tokio::task::JoinHandle<()>,
    state: Arc<State>,
    /// The grpc.health.v1 status this replica's Watch stream reports (1 SERVING, 2 NOT_SERVING).
    health: watch::Sender<u8>,
}

impl Replica {
    async fn start(name: &str, addr: &str) -> Replica {
        Replica::start_with(name, addr, Arc::default()).await
    }

    async fn start_with(name: &str, addr: &str, state: Arc<State>) -> Replica {
        let (health, health_rx) = watch::channel(1u8);
        let (s1, s2) = (state.clone(), state.clone());
        let n1 = Bytes::from(name.to_owned());
        let n2 = n1.clone();
        let server = Server::builder()
            .unary(WHO, RawCodec, move |req: Request<Bytes>| {
                let (st, name) = (s1.clone(), n1.clone());
                async move {
                    if let Ok(id) = std::str::from_utf8(req.get_ref()).unwrap_or("").parse() {
                        *st.ids.lock().unwrap().entry(id).or_default() += 1;
                    }
                    st.who.fetch_add(1, Ordering::Relaxed);
                    if st.failing.load(Ordering::Relaxed) {
                        return Err(Status::unavailable("this replica is broken"));
                    }
                    // A little work, so that calls are in flight when a server drains.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    Ok(Response::new(name))
                }
            })
            .unary(HOLD, RawCodec, move |_req: Request<Bytes>| {
                let (st, name) = (s2.clone(), n2.clone());
                async move {
                    let released = st.release.notified();
                    tokio::pin!(released);
                    released.as_mut().enable();
                    st.held.fetch_add(1, Ordering::SeqCst);
                    st.held_notify.notify_waiters();
                    if !st.released.load(Ordering::SeqCst) {
                        released.await;
                    }
                    Ok(Response::new(name))
                }
            })
            .server_streaming(HEALTH_WATCH, Protobuf, move |_req: Request<Bytes>| {
                let rx = health_rx.clone();
                async move {
                    let answers = stream::unfold((rx, true), |(mut rx, first)| async move {
                        if !first && rx.changed().await.is_err() {
                            return None;
                        }
                        let v = *rx.borrow_and_update();
                        Some((Ok(Bytes::from(vec![0x08, v])), (rx, false)))
                    });
                    Ok(Response::new(answers.boxed()))
                }
            })
            .bind(addr)
            .await
            .expect("bind");
        let addr = server.local_addr().clone();
        let handle = server.shutdown_handle();
        let task = tokio::spawn(server.serve());
        Replica {
            name: name.to_owned(),
            addr,
            handle,
            task,
            state,
            health,
        }
    }

    fn who(&self) -> usize {
        self.state.who.load(Ordering::Relaxed)
    }

    fn release(&self) {
        self.state.released.store(true, Ordering::SeqCst);
        self.state.release.notify_waiters();
    }

    async fn stop(self, grace: Duration) -> Arc<State> {
        self.handle.shutdown(grace).await;
        let _ = self.task.await;
        self.state
    }
}

async fn replicas(n: usize) -> Vec<Replica> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(Replica::start(&format!("r{i}"), "tcp://127.0.0.1:0").await);
    }
    v
}

async fn within<F: std::future::Future>(secs: u64, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("timed out")
}

async fn who(ch: &Channel, id: u64) -> Result<String, Status> {
    ch.unary(
        RawCodec,
        WHO,
        Request::new(Bytes::from(id.to_string())).with_timeout(Duration::from_secs(5)),
    )
    .await
    .map(|r| String::from_utf8_lossy(r.get_ref()).into_owned())
}

/// `n` calls one after the other; how many each replica answered.
async fn spread(ch: &Channel, n: u64) -> HashMap<String, usize> {
    let mut hits = HashMap::new();
    for i in 0..n {
        let name = who(ch, i).await.expect("call");
        *hits.entry(name).or_default() += 1;
    }
    hits
}

fn endpoint(rs: &[Replica]) -> Endpoint {
    Endpoint::balanced(rs.iter().map(|r| r.addr.clone()))
        .unwrap()
        .backoff(Duration::from_millis(10), Duration::from_millis(200))
}

#[tokio::test]
async fn a_static_list_spreads_calls_over_every_server_with_both_policies() {
    let rs = replicas(3).await;
    for balancing in [Balancing::default(), Balancing::round_robin()] {
        let ch = endpoint(&rs).balancing(balancing).connect().await.unwrap();
        let hits = within(20, spread(&ch, 300)).await;
        assert_eq!(hits.len(), 3, "{hits:?}");
        for (name, n) in &hits {
            assert!(*n >= 30, "{name} got {n} of 300: {hits:?}");
        }
        let mut eps = ch.endpoints();
        eps.sort_by_key(|a| a.to_string());
        let mut want: Vec<_> = rs.iter().map(|r| r.addr.clone()).collect();
        want.sort_by_key(|a| a.to_string());
        assert_eq!(eps, want);
    }
    // Round robin is exact when every server is ready.
    let ch = endpoint(&rs)
        .balancing(Balancing::round_robin())
        .connect()
        .await
        .unwrap();
    let hits = within(20, spread(&ch, 99)).await;
    assert!(hits.values().all(|&n| n == 33), "{hits:?}");
    for r in rs {
        r.stop(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
async fn concurrent_calls_favour_the_less_loaded_server() {
    // r0 holds every call it gets; P2C sends new calls to the server with fewer open calls.
    let rs = replicas(2).await;
    let ch = endpoint(&rs).connect().await.unwrap();
    let mut held = Vec::new();
    for _ in 0..20 {
        let ch = ch.clone();
        held.push(tokio::spawn(async move {
            ch.unary(RawCodec, HOLD, Request::new(Bytes::new())).await
        }));
    }
    within(10, async {
        while rs[0].state.held.load(Ordering::SeqCst) + rs[1].state.held.load(Ordering::SeqCst) < 20
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let (a, b) = (
        rs[0].state.held.load(Ordering::SeqCst),
        rs[1].state.held.load(Ordering::SeqCst),
    );
    // With loads compared, 20 calls split evenly (by chance alone a 13/7 split or worse
    // would come one time in four).
    assert!(a.abs_diff(b) <= 2, "held calls split {a}/{b}");
    for r in &rs {
        r.release();
    }
    for h in held {
        within(10, h).await.unwrap().unwrap();
    }
    for r in rs {
        r.stop(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
async fn dns_names_resolve_to_their_servers() {
    let r = Replica::start("solo", "tcp://127.0.0.1:0").await;
    let port = r
        .addr
        .host_port()
        .unwrap()
        .rsplit_once(':')
        .unwrap()
        .1
        .to_owned();
    let ch = Endpoint::new(format!("dns:///localhost:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    assert_eq!(within(10, who(&ch, 1)).await.unwrap(), "solo");
    assert!(ch
        .endpoints()
        .contains(&Address::Tcp(format!("127.0.0.1:{port}"))));
    assert_eq!(
        ch.endpoint().address().to_string(),
        format!("dns:///localhost:{port}")
    );
    // A name that does not resolve fails the call at once, as UNAVAILABLE and unsent.
    let bad = Channel::lazy("dns:///no-such-host.invalid:50051").unwrap();
    let e = within(30, who(&bad, 1)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.is_unprocessed(), "{e:?}");
    assert!(e.message().contains("no-such-host.invalid"), "{e}");
    // A server cannot bind a DNS name.
    assert!(Server::builder().bind("dns:///localhost:1").await.is_err());
    r.stop(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_changing_endpoint_set_leaves_calls_in_flight_alone() {
    let rs = replicas(3).await;
    let (tx, rx) = mpsc::channel::<Vec<Address>>(4);
    let sets = stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|s| (Ok(s), rx)) },
    );
    let ch = Endpoint::with_resolver(resolve::from_stream(sets))
        .balancing(Balancing::round_robin())
        .connect_lazy();
    tx.send(vec![rs[0].addr.clone(), rs[1].addr.clone()])
        .await
        .unwrap();
    // One held call on each of r0 and r1 (round robin).
    let mut held = Vec::new();
    for _ in 0..2 {
        let ch = ch.clone();
        held.push(tokio::spawn(async move {
            ch.unary(RawCodec, HOLD, Request::new(Bytes::new())).await
        }));
        // Wait for it to arrive, so the two go to different servers.
        within(10, async {
            let n = held.len();
            while rs[0].state.held.load(Ordering::SeqCst) + rs[1].state.held.load(Ordering::SeqCst)
                < n
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }
    assert_eq!(rs[0].state.held.load(Ordering::SeqCst), 1);
    assert_eq!(rs[1].state.held.load(Ordering::SeqCst), 1);
    // r1 leaves, r2 comes: new calls go to r0 and r2 only.
    tx.send(vec![rs[0].addr.clone(), rs[2].addr.clone()])
        .await
        .unwrap();
    within(10, async {
        while !ch.endpoints().contains(&rs[2].addr) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let before = rs[1].who();
    let hits = within(20, spread(&ch, 40)).await;
    assert_eq!(rs[1].who(), before, "a removed server got calls: {hits:?}");
    assert!(
        hits.contains_key("r0") && hits.contains_key("r2"),
        "{hits:?}"
    );
    // Both held calls — on the kept r0 and on the removed r1 — finish normally.
    for r in &rs {
        r.release();
    }
    let mut answered: Vec<String> = Vec::new();
    for h in held {
        let reply = within(10, h).await.unwrap().expect("held call");
        answered.push(String::from_utf8_lossy(reply.get_ref()).into_owned());
    }
    answered.sort();
    assert_eq!(answered, ["r0", "r1"]);
    // An empty set fails calls at once, unsent.
    tx.send(Vec::new()).await.unwrap();
    within(10, async {
        while !ch.endpoints().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let e = within(10, who(&ch, 1)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert!(e.is_unprocessed());
    for r in rs {
        r.stop(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
async fn health_checks_keep_calls_off_servers_that_are_not_serving() {
    let rs = replicas(2).await;
    let ch = endpoint(&rs)
        .balancing(Balancing::default().health_check(""))
        .connect()
        .await
        .unwrap();
    let hits = within(20, spread(&ch, 60)).await;
    assert_eq!(hits.len(), 2, "{hits:?}");
    rs[0].health.send_replace(2); // NOT_SERVING
                                  // The watch reports it promptly; from then on r0 gets nothing.
    within(10, async {
        loop {
            let before = rs[0].who();
            spread(&ch, 20).await;
            if rs[0].who() == before {
                break;
            }
        }
    })
    .await;
    let before = rs[0].who();
    let hits = within(20, spread(&ch, 60)).await;
    assert_eq!(rs[0].who(), before, "{hits:?}");
    // Every server not serving: calls fail at once with UNAVAILABLE, unsent.
    rs[1].health.send_replace(2);
    let e = within(10, async {
        loop {
            if let Err(e) = who(&ch, 0).await {
                break e;
            }
        }
    })
    .await;
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(
        e.is_unprocessed() && e.message().contains("not serving"),
        "{e:?}"
    );
    // Serving again: calls come back.
    rs[0].health.send_replace(1);
    rs[1].health.send_replace(1);
    within(10, async {
        while who(&ch, 0).await.is_err() || rs[0].who() == before {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    for r in rs {
        r.stop(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
async fn a_server_whose_calls_fail_unavailable_is_ejected_then_readmitted() {
    let rs = replicas(3).await;
    rs[0].state.failing.store(true, Ordering::Relaxed);
    let ch = endpoint(&rs)
        .balancing(Balancing::round_robin().ejection(
            3,
            Duration::from_secs(2),
            Duration::from_secs(5),
        ))
        .connect()
        .await
        .unwrap();
    let mut failed = 0;
    for i in 0..150 {
        if let Err(e) = who(&ch, i).await {
            assert_eq!(e.code(), Code::Unavailable);
            failed += 1;
        }
    }
    // Three failures eject it; without ejection round robin would fail 50.
    assert!(failed <= 4, "{failed} calls failed");
    let during = rs[0].who();
    // Repaired, it gets calls again once its ejection ends.
    rs[0].state.failing.store(false, Ordering::Relaxed);
    within(10, async {
        while rs[0].who() == during {
            who(&ch, 0).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // At most half of the servers are ejected: with both of two failing, calls still go out.
    let two = replicas(2).await;
    for r in &two {
        r.state.failing.store(true, Ordering::Relaxed);
    }
    let ch = endpoint(&two)
        .balancing(Balancing::round_robin().ejection(
            1,
            Duration::from_secs(5),
            Duration::from_secs(5),
        ))
        .connect()
        .await
        .unwrap();
    for i in 0..10 {
        let e = who(&ch, i).await.unwrap_err();
        assert_eq!(e.message(), "this replica is broken", "{e}");
    }
    assert!(two.iter().all(|r| r.who() > 0));
    for r in rs.into_iter().chain(two) {
        r.stop(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
async fn subsetting_talks_to_a_stable_few_of_many_servers() {
    let rs = replicas(8).await;
    let subset =
        |seed| endpoint(&rs).balancing(Balancing::round_robin().subset(3).subset_seed(seed));
    let a = subset(7).connect().await.unwrap();
    let b = subset(7).connect().await.unwrap();
    let mut ea = a.endpoints();
    let mut eb = b.endpoints();
    ea.sort_by_key(|x| x.to_string());
    eb.sort_by_key(|x| x.to_string());
    assert_eq!(ea.len(), 3);
    assert_eq!(ea, eb, "the same seed picks the same subset");
    let hits = within(20, spread(&a, 60)).await;
    assert_eq!(hits.len(), 3, "{hits:?}");
    for r in rs {
        r.stop(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
async fn a_draining_server_gets_no_new_calls_and_finishes_its_own() {
    let rs = replicas(2).await;
    let ch = endpoint(&rs)
        .balancing(Balancing::round_robin())
        .connect()
        .await
        .unwrap();
    // Two held calls on each server.
    let mut held = Vec::new();
    for _ in 0..4 {
        let ch = ch.clone();
        held.push(tokio::spawn(async move {
            ch.unary(RawCodec, HOLD, Request::new(Bytes::new())).await
        }));
    }
    within(10, async {
        while rs[0].state.held.load(Ordering::SeqCst) + rs[1].state.held.load(Ordering::SeqCst) < 4
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(rs[0].state.held.load(Ordering::SeqCst), 2);
    // r0 drains: GOAWAY now, its calls in flight get 20 s.
    let mut rs = rs;
    let r0 = rs.remove(0);
    let r1 = rs.remove(0);
    let (r0_state, r0_release) = (r0.state.clone(), r0.handle.clone());
    let drain = tokio::spawn(r0.stop(Duration::from_secs(20)));
    // The channel hears the GOAWAY within a moment; every new call then goes to r1.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = r0_state.who.load(Ordering::Relaxed);
    let hits = within(20, spread(&ch, 50)).await;
    assert_eq!(hits.get("r1"), Some(&50), "{hits:?}");
    assert_eq!(r0_state.who.load(Ordering::Relaxed), before);
    // The held calls of the draining server finish normally.
    r0_state.released.store(true, Ordering::SeqCst);
    r0_state.release.notify_waiters();
    r1.release();
    for h in held {
        within(10, h)
            .await
            .unwrap()
            .expect("a call in flight on a draining server");
    }
    within(10, drain).await.unwrap();
    drop(r0_release);
    r1.stop(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_three_replicas_under_load_loses_no_call() {
    let mut rs = replicas(3).await;
    let ch = endpoint(&rs).connect().await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let next_id = Arc::new(AtomicU64::new(0));
    let retried = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..8 {
        let (ch, stop, next_id, retried) =
            (ch.clone(), stop.clone(), next_id.clone(), retried.clone());
        workers.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (Vec::new(), Vec::new());
            // Bounded: 8 workers, one call at a time each, until told to stop (or 20,000).
            for _ in 0..20_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let id = next_id.fetch_add(1, Ordering::Relaxed);
                let mut attempt = 0;
                loop {
                    match who(&ch, id).await {
                        Ok(_) => break ok.push(id),
                        // Never processed: safe to send again (what a retry policy does
                        // transparently).
                        Err(e) if e.is_unprocessed() && attempt < 5 => {
                            attempt += 1;
                            retried.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => break failed.push((id, e)),
                    }
                }
            }
            (ok, failed)
        }));
    }
    let mut states = Vec::new();
    for i in 0..3 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let old = rs.remove(0);
        let (name, addr) = (old.name.clone(), old.addr.to_string());
        // Graceful: GOAWAY, calls in flight finish, then the process would exit …
        states.push(within(20, old.stop(Duration::from_secs(5))).await);
        // … and the new version starts on the same address.
        rs.push(Replica::start(&format!("{name}'{i}"), &addr).await);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut ok, mut failed) = (Vec::new(), Vec::new());
    for w in workers {
        let (o, f) = within(30, w).await.unwrap();
        ok.extend(o);
        failed.extend(f);
    }
    assert!(failed.is_empty(), "calls lost: {failed:?}");
    let issued = next_id.load(Ordering::Relaxed);
    assert_eq!(ok.len() as u64, issued);
    assert!(issued > 100, "only {issued} calls under load");
    // Every call ran exactly once, somewhere.
    let mut runs: HashMap<u64, u32> = HashMap::new();
    for st in states.iter().chain(rs.iter().map(|r| &r.state)) {
        for (id, n) in st.ids.lock().unwrap().iter() {
            *runs.entry(*id).or_default() += n;
        }
    }
    for id in ok {
        assert_eq!(
            runs.get(&id),
            Some(&1),
            "call {id} ran {:?} times",
            runs.get(&id)
        );
    }
    eprintln!(
        "rolling restart: {issued} calls, none lost, {} sent again after an unprocessed failure",
        retried.load(Ordering::Relaxed)
    );
    for r in rs {
        r.stop(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
async fn only_calls_that_never_left_are_marked_unprocessed() {
    // A call in flight when its server dies may have run: not marked.
    let r = Replica::start("r", "tcp://127.0.0.1:0").await;
    let addr = r.addr.clone();
    let ch = Endpoint::new(addr.clone())
        .unwrap()
        .backoff(Duration::from_secs(5), Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let state = r.state.clone();
    let held = tokio::spawn({
        let ch = ch.clone();
        async move { ch.unary(RawCodec, HOLD, Request::new(Bytes::new())).await }
    });
    within(10, async {
        while state.held.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    r.stop(Duration::ZERO).await;
    let e = within(10, held).await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(!e.is_unprocessed(), "a call that reached the server: {e:?}");
    // Calls after that cannot connect (refused, then backing off): never sent, marked.
    for _ in 0..2 {
        let e = within(10, who(&ch, 1)).await.unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{e}");
        assert!(e.is_unprocessed(), "{e:?}");
    }
}
