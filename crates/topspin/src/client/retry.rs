//! Retries, hedging, transparent retry and wait-for-ready: a layer over the call path
//! (`call::begin` and the wait for the answer) that never looks at how a connection is picked,
//! so it works the same over one address, a pool or a balanced set of endpoints.
//!
//! - A **retry policy** ([`RetryPolicy`]) per method (or service, or all methods) on the
//!   [`Endpoint`](super::Endpoint): retryable codes, attempts, exponential backoff with full
//!   jitter. Only methods a policy covers are retried: configuring one is the application's
//!   statement that the method is safe to run more than once ([`Endpoint::no_retry`] takes a
//!   method back out).
//! - **Hedging** ([`HedgingPolicy`]) for idempotent unary methods: another attempt after a
//!   delay without an answer, the first success wins, the others are cancelled.
//! - A **retry budget** ([`RetryBudget`]) per channel bounds retries and hedges together to a
//!   ratio of the recent calls plus a small reserve, so a failing server never sees the load
//!   multiplied by the attempt count.
//! - **Transparent retry**: a call that never left the client (connecting failed, the
//!   connection closed before the call was written, or the server's GOAWAY says it did not
//!   process it) is sent again once, policy or not, without counting as an attempt.
//! - **wait_for_ready** ([`crate::Request::with_wait_for_ready`]): such a call keeps trying
//!   to start until its deadline instead of failing fast.
//!
//! Every attempt after the first carries [`PREVIOUS_ATTEMPTS`] (like gRPC's
//! `grpc-previous-rpc-attempts`). Attempts share the call's deadline; dropping the call's
//! future cancels whatever attempt is running (CANCEL on the wire).
//!
//! [`Endpoint::no_retry`]: super::Endpoint::no_retry

use super::call::{begin, CallGuard};
use super::conn::{CallStart, ConnHandle, Sink};
use super::pool::Pool;
use crate::{Code, Response, Status};
use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use topspin_proto::Metadata;

/// Request metadata on every attempt after the first: how many attempts of this call went
/// before it (`1`, `2` …), as gRPC's `grpc-previous-rpc-attempts`. A transparent retry (the
/// earlier attempt never reached a server) does not count.
pub const PREVIOUS_ATTEMPTS: &str = "topspin-previous-attempts";

/// Most attempts a policy may ask for (larger values are lowered to it), as gRPC caps at 5.
pub const MAX_ATTEMPTS: u32 = 10;

/// A set of status codes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Codes(u32);

impl Codes {
    fn of(codes: &[Code]) -> Codes {
        Codes(
            codes
                .iter()
                .filter(|c| c.as_u16() < 32)
                .fold(0, |m, c| m | 1 << c.as_u16()),
        )
    }
    fn contains(self, code: Code) -> bool {
        code.as_u16() < 32 && self.0 & (1 << code.as_u16()) != 0
    }
}

/// How a method's failed calls are retried (like gRPC service config's `retryPolicy`).
///
/// Defaults: 3 attempts in all, retry on `UNAVAILABLE` only, backoff 100 ms growing ×2 up to
/// 1 s. The pause before retry *n* is drawn uniformly from `0 ..= min(initial × multiplier^(n-1),
/// max)` (full jitter), and a retry whose pause would end past the call's deadline is not made.
///
/// ```
/// use std::time::Duration;
/// use topspin::{Code, Endpoint, RetryPolicy};
/// let endpoint = Endpoint::new("tcp://127.0.0.1:50051")?
///     .retry_policy("/kv.Store/Get", RetryPolicy::default()
///         .with_max_attempts(4)
///         .with_retryable_codes(&[Code::Unavailable, Code::ResourceExhausted])
///         .with_backoff(Duration::from_millis(50), Duration::from_secs(2), 2.0));
/// # Ok::<(), topspin::Status>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
    multiplier: f64,
    retryable: Codes,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            multiplier: 2.0,
            retryable: Codes::of(&[Code::Unavailable]),
        }
    }
}

impl RetryPolicy {
    /// Attempts in all, the first included (default 3; 1 means no retry; at most
    /// [`MAX_ATTEMPTS`]).
    pub fn with_max_attempts(mut self, attempts: u32) -> RetryPolicy {
        self.max_attempts = attempts.clamp(1, MAX_ATTEMPTS);
        self
    }

    /// Exponential backoff: the ceiling of the first pause, the most any pause may be, and the
    /// growth per retry (defaults 100 ms, 1 s, 2.0; a multiplier under 1 counts as 1).
    pub fn with_backoff(
        mut self,
        initial: Duration,
        max: Duration,
        multiplier: f64,
    ) -> RetryPolicy {
        self.initial_backoff = initial;
        self.max_backoff = max.max(initial);
        self.multiplier = if multiplier.is_finite() {
            multiplier.max(1.0)
        } else {
            1.0
        };
        self
    }

    /// The codes that are retried (default `UNAVAILABLE` only). A call ending with any other
    /// code, or `OK`, is final.
    pub fn with_retryable_codes(mut self, codes: &[Code]) -> RetryPolicy {
        self.retryable = Codes::of(codes);
        self
    }

    /// Attempts in all.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Whether a call ending with `code` is retried.
    pub fn is_retryable(&self, code: Code) -> bool {
        self.retryable.contains(code)
    }

    /// The pause before retry `n` (1 for the first): uniform in `0 ..= ceiling`.
    fn pause(&self, n: u32) -> Duration {
        let exp = self.multiplier.powi(n.saturating_sub(1).min(64) as i32);
        let ceiling =
            (self.initial_backoff.as_secs_f64() * exp).min(self.max_backoff.as_secs_f64());
        Duration::from_secs_f64(ceiling * fastrand::f64())
    }
}

/// Hedging for idempotent unary methods (like gRPC service config's `hedgingPolicy`): when no
/// answer came within `delay`, another attempt goes out (to whichever connection the channel
/// picks next), up to `max_attempts` in all. The first success wins and the other attempts are
/// cancelled (the servers see a CANCEL). An attempt failing with a *non-fatal* code starts the
/// next one at once; any other failure ends the call with it.
///
/// Defaults: 3 attempts, a 100 ms delay, `UNAVAILABLE` non-fatal. Only unary calls are
/// hedged; the other call kinds of a hedged method get transparent retry only. Hedges draw on
/// the channel's [`RetryBudget`] like retries.
#[derive(Clone, Debug, PartialEq)]
pub struct HedgingPolicy {
    max_attempts: u32,
    delay: Duration,
    non_fatal: Codes,
}

impl Default for HedgingPolicy {
    fn default() -> HedgingPolicy {
        HedgingPolicy {
            max_attempts: 3,
            delay: Duration::from_millis(100),
            non_fatal: Codes::of(&[Code::Unavailable]),
        }
    }
}

impl HedgingPolicy {
    /// Attempts in all, the first included (default 3; at most [`MAX_ATTEMPTS`]).
    pub fn with_max_attempts(mut self, attempts: u32) -> HedgingPolicy {
        self.max_attempts = attempts.clamp(1, MAX_ATTEMPTS);
        self
    }

    /// How long to wait for an answer before the next attempt (default 100 ms).
    pub fn with_delay(mut self, delay: Duration) -> HedgingPolicy {
        self.delay = delay;
        self
    }

    /// Codes after which hedging goes on at once (default `UNAVAILABLE`).
    pub fn with_non_fatal_codes(mut self, codes: &[Code]) -> HedgingPolicy {
        self.non_fatal = Codes::of(codes);
        self
    }

    /// Attempts in all.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The hedging delay.
    pub fn delay(&self) -> Duration {
        self.delay
    }
}

/// Bounds a channel's retries and hedges (like Finagle's and linkerd's retry budgets): within
/// any window of `ttl`, retries may be at most `ratio` × the calls started under a policy in
/// that window plus `min_per_second` × `ttl` (a reserve for channels with few calls). A retry
/// the budget refuses is not made: the call ends with the status of its last attempt.
///
/// Defaults: ratio 0.2, 10 per second, ttl 10 s — at most 20% more load on a failing service
/// once past the reserve, whatever the policies' attempt counts.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryBudget {
    ratio: f64,
    min_per_second: u32,
    ttl: Duration,
}

impl Default for RetryBudget {
    fn default() -> RetryBudget {
        RetryBudget {
            ratio: 0.2,
            min_per_second: 10,
            ttl: Duration::from_secs(10),
        }
    }
}

impl RetryBudget {
    /// A budget: `ratio` of the recent calls (0 to 1000), plus `min_per_second`, over a
    /// window of `ttl` (1 s to 60 s).
    pub fn new(ratio: f64, min_per_second: u32, ttl: Duration) -> RetryBudget {
        RetryBudget {
            ratio: if ratio.is_finite() {
                ratio.clamp(0.0, 1000.0)
            } else {
                0.0
            },
            min_per_second,
            ttl: ttl.clamp(Duration::from_secs(1), Duration::from_secs(60)),
        }
    }

    /// The ratio.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// The reserve per second.
    pub fn min_per_second(&self) -> u32 {
        self.min_per_second
    }

    /// The window.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

/// What a method gets.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Policy {
    Retry(RetryPolicy),
    Hedge(HedgingPolicy),
    Never,
}

/// Slots of the budget's sliding window.
const SLOTS: usize = 10;

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    epoch: u64,
    calls: u64,
    retries: u64,
}

/// The budget's accounting: `SLOTS` slots of `ttl / SLOTS` each (a fixed array: nothing grows).
#[derive(Debug)]
struct Ledger {
    born: Instant,
    slots: Mutex<[Slot; SLOTS]>,
}

impl Default for Ledger {
    fn default() -> Ledger {
        Ledger {
            born: Instant::now(),
            slots: Mutex::new([Slot::default(); SLOTS]),
        }
    }
}

/// A channel's policies and its budget.
#[derive(Debug, Default)]
pub(crate) struct Retries {
    /// (method selector, policy), in registration order: `/pkg.Svc/Method`, `/pkg.Svc/`, or
    /// `""` for every method.
    rules: Vec<(String, Policy)>,
    budget: RetryBudget,
    ledger: Ledger,
}

impl Clone for Retries {
    /// The same policies with a fresh budget (each channel has its own).
    fn clone(&self) -> Retries {
        Retries {
            rules: self.rules.clone(),
            budget: self.budget.clone(),
            ledger: Ledger::default(),
        }
    }
}

impl Retries {
    pub(crate) fn with_rule(this: Option<Arc<Retries>>, methods: &str, p: Policy) -> Arc<Retries> {
        let mut r = this.map(|r| (*r).clone()).unwrap_or_default();
        r.rules.push((methods.to_owned(), p));
        Arc::new(r)
    }

    pub(crate) fn with_budget(this: Option<Arc<Retries>>, budget: RetryBudget) -> Arc<Retries> {
        let mut r = this.map(|r| (*r).clone()).unwrap_or_default();
        r.budget = budget;
        Arc::new(r)
    }

    /// The policy of a method: the most specific rule (exact name, then service prefix, then
    /// all), the last registered among equals.
    pub(crate) fn policy(&self, method: &str) -> Option<&Policy> {
        let mut best: Option<(u8, &Policy)> = None;
        for (sel, p) in &self.rules {
            let rank = if sel.is_empty() || sel == "*" {
                1
            } else if sel == method {
                3
            } else if sel.ends_with('/') && method.starts_with(sel.as_str()) {
                2
            } else {
                continue;
            };
            if best.is_none_or(|(r, _)| rank >= r) {
                best = Some((rank, p));
            }
        }
        best.map(|(_, p)| p)
    }

    fn epoch(&self) -> u64 {
        let slot = (self.budget.ttl / SLOTS as u32).as_nanos().max(1);
        (self.ledger.born.elapsed().as_nanos() / slot) as u64
    }

    /// A call under a policy started.
    fn deposit(&self) {
        let e = self.epoch();
        let mut slots = self.ledger.slots.lock().unwrap_or_else(|p| p.into_inner());
        let s = &mut slots[(e % SLOTS as u64) as usize];
        if s.epoch != e {
            *s = Slot {
                epoch: e,
                ..Slot::default()
            };
        }
        s.calls += 1;
    }

    /// Takes one retry from the budget, if it has one.
    fn withdraw(&self) -> bool {
        let e = self.epoch();
        let mut slots = self.ledger.slots.lock().unwrap_or_else(|p| p.into_inner());
        let (calls, retries) = slots
            .iter()
            .filter(|s| s.epoch <= e && e - s.epoch < SLOTS as u64)
            .fold((0, 0), |(c, r), s| (c + s.calls, r + s.retries));
        let reserve = f64::from(self.budget.min_per_second) * self.budget.ttl.as_secs_f64();
        if retries as f64 + 1.0 > self.budget.ratio * calls as f64 + reserve {
            return false;
        }
        let s = &mut slots[(e % SLOTS as u64) as usize];
        if s.epoch != e {
            *s = Slot {
                epoch: e,
                ..Slot::default()
            };
        }
        s.retries += 1;
        true
    }
}

/// How one call is retried.
#[derive(Clone, Copy)]
pub(crate) struct Plan<'a> {
    retries: Option<&'a Retries>,
    policy: Option<&'a Policy>,
    wait_for_ready: bool,
}

impl<'a> Plan<'a> {
    /// The plan of a call to `method`; `None` when nothing but the one transparent retry
    /// applies (the fast path: no lookup, no allocation).
    pub(crate) fn of(
        retries: &'a Option<Arc<Retries>>,
        method: &str,
        wait_for_ready: bool,
    ) -> Option<Plan<'a>> {
        let retries = retries.as_deref();
        let policy = retries.and_then(|r| r.policy(method));
        let policy = policy.filter(|p| **p != Policy::Never);
        if policy.is_none() && !wait_for_ready {
            return None;
        }
        Some(Plan {
            retries,
            policy,
            wait_for_ready,
        })
    }

    /// Only transparent retry and waiting for a connection (calls whose requests cannot be
    /// replayed once sent).
    pub(crate) fn start_only(wait_for_ready: bool) -> Plan<'static> {
        Plan {
            retries: None,
            policy: None,
            wait_for_ready,
        }
    }

    /// The hedging policy, if the method has one.
    pub(crate) fn hedging(&self) -> Option<&'a HedgingPolicy> {
        match self.policy {
            Some(Policy::Hedge(h)) => Some(h),
            _ => None,
        }
    }

    /// The plan for a call kind that is not hedged: a hedging policy gives no retries.
    fn retry_policy(&self) -> Option<&'a RetryPolicy> {
        match self.policy {
            Some(Policy::Retry(p)) => Some(p),
            _ => None,
        }
    }
}

/// Marks a status as "the call never left the client" ([`Status::with_unprocessed`]: a local
/// flag, never sent on the wire, so a peer cannot set it).
pub(crate) fn unsent(status: Status) -> Status {
    status.with_unprocessed()
}

/// Whether the call that failed with `status` never left the client.
pub(crate) fn is_unsent(status: &Status) -> bool {
    status.is_unprocessed()
}

/// An error of `begin` (the call was not queued on any connection): `UNAVAILABLE` there means
/// connecting failed or the connection closed before the call was handed to it. (An
/// interceptor rejecting a call with `UNAVAILABLE` is taken the same way: its call is tried
/// once more, and waits under wait_for_ready.)
pub(crate) fn began(status: Status) -> Status {
    if status.code() == Code::Unavailable && !is_unsent(&status) {
        unsent(status)
    } else {
        status
    }
}

/// A copy of a call's start for another attempt: a fresh token and, after `previous`
/// attempts, the [`PREVIOUS_ATTEMPTS`] entry (the bytes are shared, not copied).
pub(crate) fn again(start: &CallStart, token: u64, previous: u32) -> CallStart {
    let mut metadata = start.metadata.clone();
    if previous > 0 {
        let mut b = Metadata::builder();
        for (k, v) in start.metadata.iter() {
            if k != PREVIOUS_ATTEMPTS {
                if let Ok(next) = b.entry(k, v) {
                    b = next;
                } else {
                    return again(start, token, 0);
                }
            }
        }
        if let Ok(b) = b.text(PREVIOUS_ATTEMPTS, &previous.to_string()) {
            metadata = b.build();
        }
    }
    CallStart {
        token,
        method: start.method.clone(),
        codec: start.codec,
        deadline: start.deadline,
        metadata,
        message: start.message.clone(),
    }
}

/// One attempt of a unary-response call with one request message: the response as bytes.
pub(crate) async fn unary_attempt(
    pool: &Pool,
    start: CallStart,
) -> Result<Response<Bytes>, Status> {
    let (tx, mut rx) = pool.replies.pair();
    let (h, mut guard) = begin(pool, start, Sink::Unary(tx)).await.map_err(began)?;
    let r = if guard.wrote_idle() {
        // Written on an idle connection: read the reply here too, while it stays quiet.
        let reading = ReadsOwnReply(&h);
        let mut first = true;
        std::future::poll_fn(|cx| {
            rx.poll_driving(cx, |cx, waiting| {
                reading
                    .0
                    .read_inline(cx, std::mem::take(&mut first), waiting);
            })
        })
        .await
    } else {
        rx.await
    };
    guard.disarm();
    if let Some(obs) = guard.obs.take() {
        super::call::observed_reply(obs, &r);
    }
    r.ok_or_else(|| Status::unavailable("the connection task ended"))?
}

/// A caller that may read its own reply; once it stops (its call is over, or its future is
/// dropped), what it was woken for and did not read goes to the connection's task.
struct ReadsOwnReply<'a>(&'a ConnHandle);

impl Drop for ReadsOwnReply<'_> {
    fn drop(&mut self) {
        self.0.read_done();
    }
}

/// Starts a call whose requests cannot be replayed once the call is under way (a request
/// stream): only a start that never left the client is tried again. `sink` makes each
/// attempt's result channels. Returns the connection, the guard, the receiving side and the
/// token of the attempt that started.
pub(crate) async fn start_call<R>(
    pool: &Pool,
    start: CallStart,
    wait_for_ready: bool,
    mut sink: impl FnMut() -> (Sink, R),
) -> Result<(ConnHandle, CallGuard, R, u64), Status> {
    let attempt = |s: CallStart| {
        let token = s.token;
        let (sink, r) = sink();
        async move {
            let (h, guard) = begin(pool, s, sink).await.map_err(began)?;
            Ok((h, guard, r, token))
        }
    };
    run(pool, Plan::start_only(wait_for_ready), start, attempt).await
}

/// The pause before wait-for-ready tries to start a call again (`n` earlier tries): 10 ms
/// growing ×1.6 up to 250 ms, jittered ±20%. Connecting itself follows the channel's backoff.
fn ready_pause(n: u32) -> Duration {
    let ms = (10.0 * 1.6f64.powi(n.min(20) as i32)).min(250.0);
    Duration::from_secs_f64(ms * (0.8 + 0.4 * fastrand::f64()) / 1000.0)
}

/// Sleeps `pause` unless that passes `deadline`; `false` if the deadline came first.
async fn sleep_within(pause: Duration, deadline: Option<Instant>) -> bool {
    let until = Instant::now() + pause;
    match deadline {
        Some(d) if d <= until => {
            tokio::time::sleep_until(d.into()).await;
            false
        }
        _ => {
            tokio::time::sleep_until(until.into()).await;
            true
        }
    }
}

/// How far a call's attempts have gone: carried from the attempts that start a response stream
/// to those its first item may still make (`Channel::server_streaming`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tries {
    /// Attempts that reached (or may have reached) a server.
    sent: u32,
    /// The one transparent retry was used.
    transparent_used: bool,
    /// Wait-for-ready pauses so far.
    waits: u32,
}

impl Plan<'_> {
    /// Counts a call under a retry policy in the budget (once per call, before its attempts).
    pub(crate) fn deposit(&self) {
        if let (Some(r), Some(_)) = (self.retries, self.retry_policy()) {
            r.deposit();
        }
    }

    /// After a failed attempt: `Ok` once another attempt may go (after its pause), or the
    /// status the call ends with — the one transparent retry, waiting for a connection
    /// (wait_for_ready) and the method's retry policy within the budget and the deadline.
    pub(crate) async fn after(
        &self,
        tries: &mut Tries,
        deadline: Option<Instant>,
        status: Status,
    ) -> Result<(), Status> {
        if is_unsent(&status) {
            if !tries.transparent_used {
                tries.transparent_used = true;
                return Ok(());
            }
            if self.wait_for_ready {
                if !sleep_within(ready_pause(tries.waits), deadline).await {
                    return Err(Status::deadline_exceeded(format!(
                        "the deadline passed while the call waited for a connection (wait_for_ready); last: {}",
                        status.message()
                    )));
                }
                tries.waits += 1;
                return Ok(());
            }
        }
        tries.sent += 1;
        let Some(p) = self.retry_policy() else {
            return Err(status);
        };
        if !p.is_retryable(status.code()) || tries.sent >= p.max_attempts {
            return Err(status);
        }
        let pause = p.pause(tries.sent);
        if deadline.is_some_and(|d| Instant::now() + pause >= d) {
            return Err(status);
        }
        if !self.retries.is_some_and(|r| r.withdraw()) {
            return Err(status);
        }
        tokio::time::sleep(pause).await;
        Ok(())
    }
}

/// Runs a call's attempts under a plan: the one transparent retry, waiting for a connection
/// (wait_for_ready) and the method's retry policy within the budget and the deadline.
pub(crate) async fn run<T, F, Fut>(
    pool: &Pool,
    plan: Plan<'_>,
    start: CallStart,
    attempt: F,
) -> Result<T, Status>
where
    F: FnMut(CallStart) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    plan.deposit();
    let first = Some(start.token);
    run_from(pool, plan, &start, &mut Tries::default(), first, attempt).await
}

/// Runs attempts of a call from where `tries` left off: the first with the token `first` (the
/// call's own), the others with fresh ones.
pub(crate) async fn run_from<T, F, Fut>(
    pool: &Pool,
    plan: Plan<'_>,
    start: &CallStart,
    tries: &mut Tries,
    mut first: Option<u64>,
    mut attempt: F,
) -> Result<T, Status>
where
    F: FnMut(CallStart) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    loop {
        let token = first.take().unwrap_or_else(|| pool.token());
        match attempt(again(start, token, tries.sent)).await {
            Ok(v) => return Ok(v),
            Err(status) => plan.after(tries, start.deadline, status).await?,
        }
    }
}

/// One hedged attempt, started after `pause`.
async fn hedged_attempt(
    pool: &Pool,
    start: CallStart,
    pause: Duration,
) -> Result<Response<Bytes>, Status> {
    if !pause.is_zero() {
        let deadline = start.deadline;
        if !sleep_within(pause, deadline).await {
            return Err(Status::deadline_exceeded(
                "the deadline passed while the call waited for a connection (wait_for_ready)",
            ));
        }
    }
    unary_attempt(pool, start).await
}

/// A hedged unary call: attempts `delay` apart (or at once after a non-fatal failure), the
/// first success wins; dropping the others cancels them.
pub(crate) async fn hedge(
    pool: &Pool,
    plan: Plan<'_>,
    p: &HedgingPolicy,
    start: CallStart,
) -> Result<Response<Bytes>, Status> {
    if let Some(r) = plan.retries {
        r.deposit();
    }
    // At most `max_attempts` (≤ MAX_ATTEMPTS) attempts, plus one transparent retry, are ever
    // in this set; wait-for-ready re-tries replace the attempt they follow.
    let mut running = FuturesUnordered::new();
    running.push(hedged_attempt(
        pool,
        again(&start, start.token, 0),
        Duration::ZERO,
    ));
    let mut sent = 1u32;
    let mut transparent = true;
    let mut waits = 0u32;
    let mut last: Option<Status> = None;
    let timer = tokio::time::sleep(p.delay);
    tokio::pin!(timer);
    loop {
        let more = sent < p.max_attempts;
        tokio::select! {
            r = running.next(), if !running.is_empty() => {
                let Some(r) = r else { continue };
                let status = match r {
                    Ok(resp) => return Ok(resp),
                    Err(s) => s,
                };
                if is_unsent(&status) && (transparent || plan.wait_for_ready) {
                    // That attempt never reached a server: it goes again, not counted.
                    let pause = if transparent { Duration::ZERO } else { ready_pause(waits) };
                    if transparent {
                        transparent = false;
                    } else {
                        waits += 1;
                    }
                    let again = again(&start, pool.token(), sent - 1);
                    running.push(hedged_attempt(pool, again, pause));
                    continue;
                }
                if !p.non_fatal.contains(status.code()) {
                    return Err(status);
                }
                if more && plan.retries.is_some_and(|r| r.withdraw()) {
                    running.push(hedged_attempt(pool, again(&start, pool.token(), sent), Duration::ZERO));
                    sent += 1;
                    timer.as_mut().reset((Instant::now() + p.delay).into());
                } else {
                    sent = p.max_attempts;
                }
                last = Some(status);
            }
            () = &mut timer, if more => {
                if plan.retries.is_some_and(|r| r.withdraw()) {
                    running.push(hedged_attempt(pool, again(&start, pool.token(), sent), Duration::ZERO));
                    sent += 1;
                } else {
                    sent = p.max_attempts; // the budget is spent: no more hedges for this call
                }
                timer.as_mut().reset((Instant::now() + p.delay).into());
            }
        }
        if running.is_empty() {
            return Err(last.unwrap_or_else(|| Status::unavailable("every hedged attempt failed")));
        }
    }
}

#[cfg(test)]
mod tests;
