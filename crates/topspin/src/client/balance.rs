//! A channel over many servers: the [`Balancer`] keeps one subchannel per resolved endpoint
//! (a [`Pool`] of its own connection slots), and picks one per call.
//!
//! - The resolver's stream runs on a task of its own; each set it yields replaces the channel's
//!   set: kept endpoints keep their subchannel (and calls in flight), new ones get one, removed
//!   ones are dropped (their connections end once their calls have).
//! - Each subchannel has a keeper task: it connects every slot eagerly, reconnects with the
//!   endpoint's backoff after a failure (and asks the resolver to look again), and wakes the
//!   moment a connection becomes unusable (GOAWAY, closed) to replace it. New calls never go
//!   to an unusable connection: a draining server gets none, its calls in flight finish.
//! - A pick reads the set under a read lock and, per policy, takes the less loaded of two
//!   random ready subchannels (load: the calls open on the connection, published by its task,
//!   plus those picked since the task last took its queue) or the next ready one round robin. Nothing ready: the call waits (within its deadline)
//!   while some endpoint is connecting, else fails `UNAVAILABLE` at once, marked
//!   [`unprocessed`](crate::Status::is_unprocessed).
//! - Passive ejection: a connection whose calls ended `UNAVAILABLE` `eject_after` times in a
//!   row takes its endpoint out of the picks for a time that doubles per repeated ejection;
//!   at most half of the endpoints are ejected at once.
//! - Health (optional): a `grpc.health.v1.Health/Watch` stream per endpoint; only `SERVING`
//!   endpoints get calls (one without the health service counts as serving).

use super::conn::ConnHandle;
use super::pool::{Pending, PickFuture, Picker, Pool};
use super::resolve::{DnsResolver, Resolver};
use super::Endpoint;
use crate::{Address, Status};
use futures_util::stream::{BoxStream, StreamExt};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// Which endpoint a call goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Policy {
    /// The one with fewer calls open of two chosen at random ("power of two choices"): load
    /// follows the servers' speed, with no shared counter (the default).
    LeastLoadedOfTwo,
    /// Each ready endpoint in turn.
    RoundRobin,
}

/// How a channel over several servers spreads its calls ([`Endpoint::balancing`]).
///
/// Defaults: [`Policy::LeastLoadedOfTwo`]; passive ejection after 5 calls in a row end
/// `UNAVAILABLE` on an endpoint's connection, for 1 s doubling per repeated ejection up to
/// 30 s, at most half of the endpoints at once; no active health checks; no subsetting.
///
/// ```
/// use std::time::Duration;
/// use topspin::{Balancing, Endpoint};
/// let endpoint = Endpoint::new("dns:///kv.default.svc.cluster.local:50051")?
///     .balancing(
///         Balancing::default()
///             .health_check("") // the whole server, as grpc.health.v1 names it
///             .subset(20) // of a thousand servers, talk to 20 (the same 20 for a seed)
///             .subset_seed(7)
///             .ejection(3, Duration::from_millis(500), Duration::from_secs(10)),
///     );
/// # Ok::<(), topspin::Status>(())
/// ```
#[derive(Clone, Debug)]
pub struct Balancing {
    policy: Policy,
    subset: Option<usize>,
    subset_seed: u64,
    health_service: Option<String>,
    eject_after: u32,
    eject_base: Duration,
    eject_max: Duration,
}

impl Default for Balancing {
    fn default() -> Balancing {
        Balancing {
            policy: Policy::LeastLoadedOfTwo,
            subset: None,
            subset_seed: fastrand::u64(..),
            health_service: None,
            eject_after: 5,
            eject_base: Duration::from_secs(1),
            eject_max: Duration::from_secs(30),
        }
    }
}

impl Balancing {
    /// The defaults, with the least loaded of two random choices.
    pub fn least_loaded_of_two() -> Balancing {
        Balancing::default()
    }

    /// The defaults, with round robin.
    pub fn round_robin() -> Balancing {
        Balancing::default().policy(Policy::RoundRobin)
    }

    /// The policy.
    pub fn policy(mut self, policy: Policy) -> Balancing {
        self.policy = policy;
        self
    }

    /// Talk to at most `n` of the endpoints: a deterministic subset (rendezvous hashing of
    /// each address with [`subset_seed`](Balancing::subset_seed)), so that many clients of a
    /// large service spread over it without each connecting to every server, and a change in
    /// the set moves only the clients of the endpoints that came or went.
    pub fn subset(mut self, n: usize) -> Balancing {
        self.subset = Some(n.max(1));
        self
    }

    /// The seed of the subset: clients with the same seed pick the same subset (default:
    /// random per process; a stable one is e.g. a hash of the pod's name).
    pub fn subset_seed(mut self, seed: u64) -> Balancing {
        self.subset_seed = seed;
        self
    }

    /// Watch each endpoint's health (`grpc.health.v1.Health/Watch` for `service`, `""` for the
    /// whole server, as `topspin-health` serves it): only `SERVING` endpoints get calls. An
    /// endpoint without the health service counts as serving.
    pub fn health_check(mut self, service: impl Into<String>) -> Balancing {
        self.health_service = Some(service.into());
        self
    }

    /// Passive ejection: an endpoint whose connection ended `after` calls in a row
    /// `UNAVAILABLE` gets no calls for `base`, doubling per repeated ejection up to `max`
    /// (`after` 0: never).
    pub fn ejection(mut self, after: u32, base: Duration, max: Duration) -> Balancing {
        self.eject_after = after;
        self.eject_base = base;
        self.eject_max = max.max(base);
        self
    }
}

/// A resolver an [`Endpoint`] holds.
#[derive(Clone)]
pub(crate) struct SharedResolver(Arc<dyn Resolver>);

impl SharedResolver {
    pub(crate) fn new(r: impl Resolver) -> SharedResolver {
        SharedResolver(Arc::new(r))
    }
}

impl std::fmt::Debug for SharedResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resolver")
    }
}

/// The resolver of a balanced endpoint; `None` for one address.
pub(crate) fn resolver_of(e: &Endpoint) -> Option<Arc<dyn Resolver>> {
    match (&e.resolver, &e.address) {
        (Some(r), _) => Some(r.0.clone()),
        (None, Address::Dns(hp)) => Some(Arc::new(DnsResolver::new(hp.clone()))),
        _ => None,
    }
}

/// `dns:///name:port` with TLS settings ([`Endpoint::tls`]): each resolved address is dialled
/// over TLS and its certificate checked against `name` (as gRPC does), unless the settings set
/// another server name. Without TLS settings the addresses stay plain TCP.
#[cfg(feature = "tls")]
fn over_tls(target: &Address, endpoint: &mut Endpoint) {
    let (Address::Dns(_), Address::Tcp(ip_port), Some(tls)) =
        (target, &endpoint.address, &endpoint.layers.tls)
    else {
        return;
    };
    let name = target.host().unwrap_or_default();
    match tls.clone().or_server_name(name) {
        Ok(tls) => {
            endpoint.address = Address::Tls(ip_port.clone());
            endpoint.layers.tls = Some(tls);
        }
        // Not a valid TLS name: dialling fails, naming the problem, rather than going plain.
        Err(e) => {
            tracing::warn!(%target, error = %e, "cannot check certificates against this name");
            endpoint.address = Address::Tls(ip_port.clone());
        }
    }
}

const IDLE: u8 = 0;
const CONNECTING: u8 = 1;
const READY: u8 = 2;
const FAILING: u8 = 3;

const UNKNOWN: u8 = 0;
const SERVING: u8 = 1;
const NOT_SERVING: u8 = 2;

/// What the picks read of a subchannel; written by its keeper and health tasks.
#[derive(Debug, Default)]
struct SubState {
    phase: AtomicU8,
    health: AtomicU8,
    ejected: AtomicBool,
    /// Wakes the keeper (an ejection to time).
    wake: Notify,
}

/// One endpoint of a balanced channel.
struct Sub {
    address: Address,
    pool: Arc<Pool>,
    st: Arc<SubState>,
    tasks: Vec<AbortHandle>,
}

impl Drop for Sub {
    fn drop(&mut self) {
        // Removed from the set (or the channel dropped): stop reconnecting and watching.
        // Connections carrying calls stay until those calls end.
        self.tasks.iter().for_each(AbortHandle::abort);
    }
}

impl Sub {
    /// A connection for a call, if this endpoint takes calls now.
    #[inline]
    fn ready(&self, health: bool, ignore_ejection: bool) -> Option<ConnHandle> {
        if !ignore_ejection && self.st.ejected.load(Ordering::Relaxed) {
            return None;
        }
        if health && self.st.health.load(Ordering::Relaxed) != SERVING {
            return None;
        }
        self.pool.ready()
    }
}

type Set = Arc<[Arc<Sub>]>;

/// A balanced channel's endpoints and how it picks among them.
pub(crate) struct Balancer {
    /// Names the service in errors.
    target: String,
    /// Settings every subchannel copies (its address replaced).
    template: Endpoint,
    resolver: Arc<dyn Resolver>,
    health: bool,
    /// The endpoints: as many as the resolver names (a subset bounds them); local
    /// configuration, not something a server can grow.
    set: RwLock<Set>,
    next: AtomicUsize,
    started: AtomicBool,
    /// The resolver has answered at least once (a set or an error).
    resolved: AtomicBool,
    resolve_error: Mutex<Option<Status>>,
    /// Notified when the set or a subchannel's readiness changes.
    changed: Arc<Notify>,
    task: Mutex<Option<AbortHandle>>,
}

impl std::fmt::Debug for Balancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.set.read().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Balancer")
            .field("target", &self.target)
            .field(
                "endpoints",
                &set.iter().map(|s| &s.address).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
    }
}

impl Picker for Balancer {
    fn addresses(&self) -> Vec<Address> {
        self.set().iter().map(|s| s.address.clone()).collect()
    }

    fn connect(self: Arc<Self>) -> PickFuture {
        Box::pin(async move { self.wait(None, false, false).await })
    }

    fn pick_now(&self) -> Result<ConnHandle, Pending> {
        self.choose(true)
    }

    fn pick_waiting(
        self: Arc<Self>,
        deadline: Option<Instant>,
        wait_for_ready: bool,
    ) -> PickFuture {
        Box::pin(async move { self.wait(deadline, wait_for_ready, true).await })
    }
}

/// The pool of an endpoint: balanced when its address is `dns:///` or it has a resolver.
pub(crate) fn pool_for(endpoint: Endpoint) -> Pool {
    match resolver_of(&endpoint) {
        Some(resolver) => {
            let balancer = Arc::new(Balancer::new(endpoint.clone(), resolver));
            Pool::balanced(endpoint, balancer)
        }
        None => Pool::single(endpoint),
    }
}

impl Balancer {
    pub(crate) fn new(template: Endpoint, resolver: Arc<dyn Resolver>) -> Balancer {
        let target = match &template.address {
            Address::Dns(_) => template.address.to_string(),
            _ if template.resolver.is_some() => "the resolver's endpoints".to_owned(),
            other => other.to_string(),
        };
        Balancer {
            target,
            health: template.balancing.health_service.is_some(),
            template,
            resolver,
            set: RwLock::new(Arc::new([])),
            next: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            resolved: AtomicBool::new(false),
            resolve_error: Mutex::new(None),
            changed: Arc::new(Notify::new()),
            task: Mutex::new(None),
        }
    }

    fn set(&self) -> Set {
        self.set.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A ready endpoint's connection; `count`: a call goes there now (a pick that sends
    /// nothing must not count, or the connection would look loaded until its next call).
    fn choose(&self, count: bool) -> Result<ConnHandle, Pending> {
        let set = self.set.read().unwrap_or_else(|e| e.into_inner());
        let picked = match set.len() {
            0 => None,
            1 => set[0].ready(self.health, false).map(|h| (0, h)),
            n => match self.template.balancing.policy {
                Policy::LeastLoadedOfTwo => self.two_choices(&set, n, count),
                Policy::RoundRobin => self.round_robin(&set, n),
            },
        };
        let Some((i, h)) = picked else {
            return Err(Pending::Balance);
        };
        let after = self.template.balancing.eject_after;
        if after > 0 && h.shared.failures.load(Ordering::Relaxed) >= after && self.eject(&set, i) {
            h.shared.failures.store(0, Ordering::Relaxed);
            return Err(Pending::Balance);
        }
        Ok(h)
    }

    fn two_choices(&self, set: &[Arc<Sub>], n: usize, count: bool) -> Option<(usize, ConnHandle)> {
        let a = fastrand::usize(..n);
        let mut b = fastrand::usize(..n - 1);
        if b >= a {
            b += 1;
        }
        match (
            set[a].ready(self.health, false),
            set[b].ready(self.health, false),
        ) {
            (Some(x), Some(y)) => {
                let load = |h: &ConnHandle| {
                    let s = &h.shared;
                    s.open.load(Ordering::Relaxed) + s.queued.load(Ordering::Relaxed)
                };
                let chosen = if load(&y) < load(&x) { (b, y) } else { (a, x) };
                // Counted until its connection task takes it, so that a burst of picks
                // before the task runs spreads too.
                if count {
                    chosen.1.shared.queued.fetch_add(1, Ordering::Relaxed);
                }
                Some(chosen)
            }
            (Some(x), None) => Some((a, x)),
            (None, Some(y)) => Some((b, y)),
            (None, None) => scan(set, a, |s| s.ready(self.health, false)),
        }
    }

    fn round_robin(&self, set: &[Arc<Sub>], n: usize) -> Option<(usize, ConnHandle)> {
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        scan(set, start, |s| s.ready(self.health, false))
    }

    /// Ejects endpoint `i` unless half of the set is ejected already.
    fn eject(&self, set: &[Arc<Sub>], i: usize) -> bool {
        let ejected = set
            .iter()
            .filter(|s| s.st.ejected.load(Ordering::Relaxed))
            .count();
        if ejected + 1 > set.len() / 2 || set[i].st.ejected.swap(true, Ordering::AcqRel) {
            return false;
        }
        tracing::info!(
            "ejecting {} from {}: its calls keep ending UNAVAILABLE",
            set[i].address,
            self.target
        );
        set[i].st.wake.notify_one();
        true
    }

    /// Starts the resolver's task (once, on first use: a lazy channel may be made outside a
    /// runtime).
    fn start(self: &Arc<Self>) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let sets = self.resolver.resolve();
        let task = tokio::spawn(run_resolver(Arc::downgrade(self), sets));
        *self.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
    }

    async fn wait(
        self: &Arc<Self>,
        deadline: Option<Instant>,
        wait_for_ready: bool,
        count: bool,
    ) -> Result<ConnHandle, Status> {
        self.start();
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Ok(h) = self.choose(count) {
                return Ok(h);
            }
            // Nothing else takes calls: an ejected endpoint does rather than none.
            let set = self.set();
            if let Some((_, h)) = scan(&set, 0, |s| s.ready(self.health, true)) {
                return Ok(h);
            }
            let hopeless = self.hopeless(&set);
            if let Some(status) = hopeless.clone().filter(|_| !wait_for_ready) {
                return Err(status.with_unprocessed());
            }
            // Wait for a change; look again now and then in case a notice was missed.
            let mut wake = Instant::now() + Duration::from_millis(250);
            if let Some(d) = deadline {
                if d <= Instant::now() {
                    let why = hopeless.map(|s| format!(": {}", s.message()));
                    return Err(Status::deadline_exceeded(format!(
                        "the call's deadline passed while waiting for a ready endpoint of {}{}",
                        self.target,
                        why.unwrap_or_default()
                    ))
                    .with_unprocessed());
                }
                wake = wake.min(d);
            }
            let _ = tokio::time::timeout_at(wake.into(), notified).await;
        }
    }

    /// Why a call cannot wait for an endpoint: `None` while one may become ready soon (the
    /// first resolution, a connection attempt, a first health answer).
    fn hopeless(&self, set: &[Arc<Sub>]) -> Option<Status> {
        if !self.resolved.load(Ordering::Acquire) {
            return None;
        }
        if set.is_empty() {
            self.resolver.resolve_now();
            let why = self
                .resolve_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(|e| format!(": {}", e.message()))
                .unwrap_or_default();
            return Some(Status::unavailable(format!(
                "no endpoint of {} is known{why}",
                self.target
            )));
        }
        let pending = set
            .iter()
            .any(|s| match s.st.phase.load(Ordering::Acquire) {
                IDLE | CONNECTING => true,
                READY => self.health && s.st.health.load(Ordering::Relaxed) == UNKNOWN,
                _ => false,
            });
        if pending {
            return None;
        }
        let last = set
            .iter()
            .find_map(|s| (0..s.pool.slot_count()).find_map(|i| s.pool.last_error(i)));
        let (serving, failing) = set.iter().fold((0, 0), |(sv, f), s| {
            let h = s.st.health.load(Ordering::Relaxed) != NOT_SERVING;
            let p = s.st.phase.load(Ordering::Relaxed) == FAILING;
            (sv + usize::from(h), f + usize::from(p))
        });
        Some(Status::unavailable(format!(
            "no endpoint of {} is available ({} endpoints, {failing} failing to connect, {} not serving){}",
            self.target,
            set.len(),
            set.len() - serving,
            last.map(|e| format!("; last error: {}", e.message()))
                .unwrap_or_default()
        )))
    }

    /// Replaces the set: kept addresses keep their subchannel.
    fn update(&self, addresses: Vec<Address>) {
        let b = &self.template.balancing;
        let addresses = subset(addresses, b.subset, b.subset_seed);
        let old = self.set();
        let mut kept: HashMap<&Address, &Arc<Sub>> = old.iter().map(|s| (&s.address, s)).collect();
        let next: Vec<Arc<Sub>> = addresses
            .into_iter()
            .map(|a| match kept.remove(&a) {
                Some(s) => s.clone(),
                None => self.subchannel(a),
            })
            .collect();
        tracing::debug!(
            "{}: {} endpoints ({} removed)",
            self.target,
            next.len(),
            kept.len()
        );
        drop(kept);
        *self.set.write().unwrap_or_else(|e| e.into_inner()) = next.into();
        // `old` drops here, outside the lock: removed subchannels stop their tasks.
    }

    fn subchannel(&self, address: Address) -> Arc<Sub> {
        let mut endpoint = self.template.clone();
        endpoint.address = address.clone();
        endpoint.resolver = None;
        #[cfg(feature = "tls")]
        over_tls(&self.template.address, &mut endpoint);
        let pool = Arc::new(Pool::single(endpoint));
        let st = Arc::new(SubState::default());
        let b = &self.template.balancing;
        let keeper = Keeper {
            pool: pool.clone(),
            st: st.clone(),
            changed: self.changed.clone(),
            resolver: self.resolver.clone(),
            eject_base: b.eject_base,
            eject_max: b.eject_max,
        };
        let mut tasks = vec![tokio::spawn(keeper.run()).abort_handle()];
        match &b.health_service {
            Some(service) => {
                let watch = watch_health(
                    pool.clone(),
                    st.clone(),
                    self.changed.clone(),
                    service.clone(),
                );
                tasks.push(tokio::spawn(watch).abort_handle());
            }
            None => st.health.store(SERVING, Ordering::Relaxed),
        }
        Arc::new(Sub {
            address,
            pool,
            st,
            tasks,
        })
    }
}

/// The first item from `start` on (wrapping) that `f` accepts.
#[inline]
fn scan(
    set: &[Arc<Sub>],
    start: usize,
    f: impl Fn(&Sub) -> Option<ConnHandle>,
) -> Option<(usize, ConnHandle)> {
    let n = set.len();
    (0..n).find_map(|i| {
        let k = (start + i) % n;
        f(&set[k]).map(|h| (k, h))
    })
}

async fn run_resolver(
    b: Weak<Balancer>,
    mut sets: BoxStream<'static, Result<Vec<Address>, Status>>,
) {
    while let Some(item) = sets.next().await {
        let Some(b) = b.upgrade() else { return };
        match item {
            Ok(set) => {
                b.update(set);
                *b.resolve_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
            }
            Err(e) => {
                tracing::warn!(
                    "resolving {}: {e} (keeping the previous endpoints)",
                    b.target
                );
                *b.resolve_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
            }
        }
        b.resolved.store(true, Ordering::Release);
        b.changed.notify_waiters();
    }
    // The stream ended: the last set stays; nobody waits for a first one any more.
    if let Some(b) = b.upgrade() {
        b.resolved.store(true, Ordering::Release);
        b.changed.notify_waiters();
    }
}

/// The subset of `n` addresses with the highest rendezvous weight for `seed` (all of them,
/// deduplicated, without a subset).
fn subset(mut addresses: Vec<Address>, n: Option<usize>, seed: u64) -> Vec<Address> {
    let mut seen = std::collections::HashSet::new();
    addresses.retain(|a| seen.insert(a.clone()));
    let Some(n) = n else { return addresses };
    if addresses.len() <= n {
        return addresses;
    }
    let weight = |a: &Address| {
        let mut h = rustc_hash::FxHasher::default();
        seed.hash(&mut h);
        a.hash(&mut h);
        splitmix(h.finish())
    };
    let mut ranked: Vec<(u64, Address)> = addresses.into_iter().map(|a| (weight(&a), a)).collect();
    ranked.sort_unstable_by_key(|x| std::cmp::Reverse(x.0));
    ranked.truncate(n);
    ranked.into_iter().map(|(_, a)| a).collect()
}

/// A 64-bit finaliser (SplitMix64's), so that every bit of the hash matters in the ranking.
fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Keeps a subchannel's slots connected.
struct Keeper {
    pool: Arc<Pool>,
    st: Arc<SubState>,
    changed: Arc<Notify>,
    resolver: Arc<dyn Resolver>,
    eject_base: Duration,
    eject_max: Duration,
}

impl Keeper {
    async fn run(self) {
        let mut ejections = 0u32;
        let mut last_ejection: Option<Instant> = None;
        loop {
            if self.st.ejected.load(Ordering::Acquire) {
                let now = Instant::now();
                if last_ejection.is_some_and(|t| now - t > self.eject_max * 2) {
                    ejections = 0;
                }
                ejections = ejections.saturating_add(1);
                last_ejection = Some(now);
                let factor = 2u32.saturating_pow(ejections - 1);
                let time = self.eject_base.saturating_mul(factor).min(self.eject_max);
                tokio::time::sleep(time).await;
                self.st.ejected.store(false, Ordering::Release);
                self.changed.notify_waiters();
                continue;
            }
            self.connect_slots().await;
            self.wait().await;
        }
    }

    /// Connects every slot without a usable connection that is not backing off.
    async fn connect_slots(&self) {
        let mut failed = false;
        for slot in 0..self.pool.slot_count() {
            if self.pool.cached(slot).is_some() {
                continue;
            }
            if self.pool.retry_at(slot).is_some_and(|t| t > Instant::now()) {
                failed = true;
                continue;
            }
            if self.pool.ready().is_none() {
                self.st.phase.store(CONNECTING, Ordering::Release);
            }
            match self.pool.conn(slot).await {
                Ok(_) => {
                    self.st.phase.store(READY, Ordering::Release);
                    self.changed.notify_waiters();
                }
                Err(e) => {
                    tracing::debug!("{e}");
                    failed = true;
                    self.resolver.resolve_now();
                }
            }
        }
        let phase = match (self.pool.ready().is_some(), failed) {
            (true, _) => READY,
            (false, true) => FAILING,
            (false, false) => CONNECTING,
        };
        self.st.phase.store(phase, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Waits for a connection to become unusable, a backoff to end or an ejection.
    async fn wait(&self) {
        let n = self.pool.slot_count();
        let retry = (0..n).filter_map(|s| self.pool.retry_at(s)).min();
        let handles: Vec<ConnHandle> = (0..n).filter_map(|s| self.pool.handle(s)).collect();
        let gone = async {
            if handles.is_empty() {
                return std::future::pending().await;
            }
            let waits = handles.iter().map(|h| Box::pin(h.shared.gone.notified()));
            futures_util::future::select_all(waits).await;
        };
        let backoff = async {
            match retry {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = gone => {}
            _ = backoff => {}
            _ = self.st.wake.notified() => {}
        }
    }
}

mod health;
use health::watch_health;

#[cfg(test)]
mod tests;
