//! The connection loop, one for both sides: a task owns the protocol engine and the transport;
//! the side's [`Role`] (client call bookkeeping, or server dispatch) plugs into it.
//!
//! Every turn: flush what the engine produced with one vectored write, check whether to stop,
//! move the one timer, then poll the transport for bytes, the role for work (commands,
//! handlers, shutdown) and the timer, and hand the engine's events to the role. Nothing else
//! polls a transport or reads the clock for a connection — with one exception: a client's
//! driver sits behind a mutex its handles share, and a caller that finds the connection quiet
//! starts its call and writes it itself ([`Driver::act_outside`]), saving the hop through the
//! command queue and the task's wake-up; if its call is the connection's only one it reads the
//! reply itself too ([`Driver::read_inline`], see `route.rs`). The task holds that lock only
//! while it polls; callers only `try_lock` it and queue the command (or wait to be woken) when
//! it is taken.

mod alarm;
mod io;
pub(crate) mod liveness;
mod route;
mod spin;
pub(crate) use route::ReadRoute;
pub(crate) use spin::several_cpus;
#[cfg(test)]
mod tests;

pub(crate) use liveness::Lapse;

use crate::transport::Transport;
use crate::{Config, Status};
use io::{Io, ReadError};
use liveness::Liveness;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use topspin_proto::{CallError, Connection, ErrorCode, Event, ProtocolError, Side};

/// Turns of the loop that made progress before the task yields to the scheduler.
const TURN_BUDGET: u32 = 64;
/// Events handled per turn when the process may run on several CPUs: what they produce
/// (replies; a client's next calls) is written before the rest is handled, so that the peer
/// works on it meanwhile rather than the two sides taking turns on whole batches (on this
/// machine: 64 calls in flight on one connection, 450 k → 700–800 k calls/s). On one CPU there is
/// nothing to overlap and the extra writes only cost: all of a read's events go in one turn.
fn events_per_turn() -> usize {
    if spin::several_cpus() {
        16
    } else {
        usize::MAX
    }
}

/// Reads a caller does for its own reply ([`Driver::read_inline`]) before it leaves the rest
/// to the task.
const INLINE_READS: u32 = 8;

/// Reads of what already arrived after a write failed ([`Driver::read_remains`]); each takes
/// at most a read buffer's worth, so this bounds the work whatever the peer sent.
const REMAINS_READS: u32 = 64;

/// What one side of a connection does with it: the call bookkeeping of a client, or the
/// dispatch of a server. The loop owns the engine and hands it to the role.
pub(crate) trait Role: Send + 'static {
    /// Client or server.
    const SIDE: Side;

    /// Polls the role's own sources (commands from callers or handlers, running handlers, a
    /// shutdown signal) and applies what arrives to the engine. `room` is how many more bytes
    /// the send buffer takes before `Config::max_send_buffer`: at 0 (full) the role takes no
    /// new work, and it stops taking more once what it queued this turn passes `room`.
    /// `Ready` if anything happened.
    fn poll_work(&mut self, cx: &mut Context<'_>, conn: &mut Connection, room: usize) -> Poll<()>;

    /// One event of the engine (`Pong` is the loop's own); `room` as for `poll_work`.
    fn on_event(&mut self, event: Event, conn: &mut Connection, room: usize);

    /// The role's next timer, if any.
    fn next_timer(&self) -> Option<Instant>;

    /// A timer passed (the role's, the engine's or the loop's: `lapse` says what liveness did).
    fn on_timer(&mut self, now: Instant, conn: &mut Connection, lapse: Lapse);

    /// Why the loop should end now, besides the engine closing or draining.
    fn stop(&self) -> Option<&'static str>;

    /// Whether no call is open (for the idle timeout).
    fn idle(&self) -> bool;

    /// Bytes of messages the role keeps back for the peer's credit (the engine takes a
    /// message only once a call has credit): they count against the send buffer like bytes
    /// the engine holds, so a peer that grants no credit cannot make the role answer more.
    fn held(&self) -> usize {
        0
    }

    /// The loop ended (`why`): fail whatever is still waiting.
    fn on_end(&mut self, conn: &mut Connection, why: &str);
}

/// One connection: engine, transport and role, driven by one task.
pub(crate) struct Driver<R, T> {
    conn: Connection,
    io: Io<T>,
    role: R,
    config: Config,
    liveness: Liveness,
    /// Since when no call has been open (the idle timeout), noted whenever the task is about
    /// to wait and when a timer fires.
    idle: liveness::IdleSince,
    started: Instant,
    /// The connection's near timer (call deadlines, the role's): tokio's. Replaced (in its
    /// box: no allocation) rather than reset when disarmed, so that a connection with no near
    /// deadline leaves nothing in the runtime's timer wheel (every park of the runtime looks
    /// at it).
    sleep: Pin<Box<tokio::time::Sleep>>,
    armed: Option<Instant>,
    /// The far deadlines (handshake, keep-alive, frame, write, idle), off the wheel.
    alarm: alarm::Alarm,
    alarm_at: Option<Instant>,
    /// `alarm_at` less the shortest liveness gap (`Liveness::shortest_gap`): the alarm covers
    /// every far deadline of a quiet, established connection read from at or after it.
    /// Worked out when the alarm is set, so the check that runs a few times per call is one
    /// comparison.
    alarm_floor: Option<Instant>,
    /// This connection's share of its server's (or channel's) gauges.
    share: crate::stats::Share,
    /// The short spin before the task sleeps (see `spin.rs`).
    spin: spin::Spin,
    /// The task's waker as of its last poll, for work done outside the task
    /// ([`Driver::act_outside`]) that needs the task to look again.
    waker: Option<std::task::Waker>,
    /// Work done outside the task woke it to write what that work queued; cleared when the
    /// task polls.
    woken_to_write: bool,
    /// Calls that ended in the task's last poll: more than one, and the callers it completed
    /// are likely to start calls together (see [`Driver::act_outside`]).
    ended_last_poll: u32,
    /// A client's route for callers that read their own reply ([`Driver::read_inline`]), and
    /// its waker.
    route: Option<(std::sync::Arc<ReadRoute>, std::task::Waker)>,
    /// The last [`Driver::act_outside`] found the connection idle and wrote at once.
    wrote_idle: bool,
}

/// A driver shared between its task and the connection's handles, which may act on it (start
/// a call and write it) while the task sleeps; `None` once the task ended.
pub(crate) type SharedDriver<R, T> = std::sync::Mutex<Option<Driver<R, T>>>;

fn to_tokio(t: Instant) -> tokio::time::Instant {
    tokio::time::Instant::from_std(t)
}

impl<R: Role, T: Transport> Driver<R, T> {
    /// A connection over `transport`; the preface and SETTINGS are queued at once.
    pub(crate) fn new(transport: T, role: R, config: Config) -> Driver<R, T> {
        let now = Instant::now();
        let share = crate::stats::Share::new(config.gauges.as_ref());
        let mut conn = Connection::new(R::SIDE, config.settings());
        conn.set_limits(config.limits());
        let budget = config.memory_budget();
        conn.set_memory_budget(budget.clone());
        Driver {
            conn,
            io: Io::new(transport, budget),
            role,
            config,
            liveness: Liveness::default(),
            idle: liveness::IdleSince::default(),
            started: now,
            sleep: Box::pin(tokio::time::sleep_until(to_tokio(now))),
            armed: None,
            alarm: alarm::Alarm::default(),
            alarm_at: None,
            alarm_floor: None,
            share,
            spin: spin::Spin::default(),
            waker: None,
            woken_to_write: false,
            ended_last_poll: 0,
            route: None,
            wrote_idle: false,
        }
    }

    /// Lets callers read their own replies through `route` ([`Driver::read_inline`]) — when
    /// the connection's task does not spin (one CPU, or `TOPSPIN_SPIN=0`). With the spin on,
    /// the task picks a reply up as soon; a caller spinning for its own reply instead was
    /// measured at the same latency for ~5 µs more CPU per call (echo 20 B, unpinned).
    pub(crate) fn with_route(mut self, route: std::sync::Arc<ReadRoute>) -> Self {
        if !spin::enabled() {
            let waker = std::task::Waker::from(route.clone());
            self.route = Some((route, waker));
        }
        self
    }

    /// Runs the connection until it ends, then closes the transport.
    pub(crate) async fn run(mut self) {
        let why = std::future::poll_fn(|cx| self.poll_turns(cx)).await;
        self.end(why).await;
    }

    /// [`Driver::run`] for a driver its handles may act on too: every poll takes the lock
    /// (uncontended but for a handle's brief [`Driver::act_outside`]); once the loop ends the
    /// driver leaves the mutex, so handles find `None` and the transport closes now, not when
    /// the last handle goes.
    pub(crate) async fn run_shared(shared: std::sync::Arc<SharedDriver<R, T>>) {
        let lock = || shared.lock().unwrap_or_else(|e| e.into_inner());
        let why = std::future::poll_fn(|cx| match lock().as_mut() {
            Some(d) => d.poll_turns(cx),
            None => Poll::Ready(String::from("connection gone")),
        })
        .await;
        let taken = lock().take();
        if let Some(d) = taken {
            d.end(why).await;
        }
    }

    /// Does `act` to the role and engine from outside the connection's task — which is not
    /// running: the caller holds the driver's lock — instead of queueing a command and waking
    /// the task to do it (a hop through the scheduler and the queue per call). Only while the
    /// task has polled (its waker is known and registered with every source), the engine is
    /// open, and nothing waits to be written but what such work queued. `act` gets the send
    /// buffer's room and returns `None` to decline (so does this).
    ///
    /// On an idle connection (no call open, and at most one ended in the task's last poll)
    /// what `act` queued is written at once, on the caller's thread: a lone call costs no
    /// task wake-up. Otherwise — calls open, or several callers just completed together and
    /// likely to call together — the first such act wakes the task and every one until it
    /// runs adds to what it then writes in one go (one write per burst, as through the
    /// queue).
    ///
    /// The task is also woken when what was done needs it: a write that could not finish
    /// (the transport holds the task's waker for room), a failed write or closed engine, or a
    /// timer that moved (the task re-arms it).
    pub(crate) fn act_outside<X>(
        &mut self,
        act: impl FnOnce(&mut R, &mut Connection, usize) -> Option<X>,
    ) -> Option<X> {
        let waker = self.waker.as_ref()?;
        let quiet = self.io.unsent(&self.conn) == 0;
        if (!quiet && !self.woken_to_write)
            || !self.conn.is_established()
            || self.conn.is_closed()
            || self.conn.is_going_away()
        {
            return None;
        }
        let idle = quiet && self.conn.open_calls() == 0 && self.ended_last_poll <= 1;
        let room = self.room();
        let done = act(&mut self.role, &mut self.conn, room)?;
        self.wrote_idle = idle;
        let wake = if !idle {
            // The task writes it, with whatever else comes before it runs.
            !std::mem::replace(&mut self.woken_to_write, true)
        } else {
            let mut cx = Context::from_waker(waker);
            match self.io.poll_flush(&mut cx, &mut self.conn) {
                Poll::Ready(Ok(())) => self.conn.is_closed() || !self.timer_covers(),
                // Pending: the transport took the task's waker and wakes it once it has room;
                // the task arms the write timeout if the stall is new.
                Poll::Pending => !self.timer_covers(),
                Poll::Ready(Err(_)) => true,
            }
        };
        if wake {
            waker.wake_by_ref();
        }
        self.report();
        Some(done)
    }

    /// A caller whose call is the connection's only one reads the reply itself, from outside
    /// the task (which is not running: the caller holds the driver's lock), instead of the
    /// task reading it and waking the caller: no task wake-up, no scheduler turn. The
    /// transport is polled with the [`ReadRoute`]'s waker, so that what arrives next wakes
    /// this caller (and the task once the caller stops reading for itself).
    ///
    /// Only while the connection is quiet otherwise: the task has polled, the engine is open,
    /// no event waits, nothing waits to be written and the task was not woken to write.
    /// Anything the reading leaves for the loop (something to write, an event, a closed or
    /// draining engine, a timer that moved, more to read than a bounded number of reads) wakes
    /// the task. `waiting` says whether the caller's call is still unanswered (the spin before
    /// it sleeps is for a call that waits). `false` (nothing done) when it may not: the caller
    /// then stops reading for itself ([`ReadRoute::clear`], `ConnParts::read_inline`).
    pub(crate) fn read_inline(
        &mut self,
        cx: &mut Context<'_>,
        first: bool,
        waiting: &dyn Fn() -> bool,
    ) -> bool {
        let Some((route, route_waker)) = self.route.take() else {
            return false;
        };
        let done = self.read_inline_with(&route, &route_waker, cx, first, waiting);
        self.route = Some((route, route_waker));
        done
    }

    fn read_inline_with(
        &mut self,
        route: &ReadRoute,
        route_waker: &std::task::Waker,
        cx: &mut Context<'_>,
        first: bool,
        waiting: &dyn Fn() -> bool,
    ) -> bool {
        let Some(task) = self.waker.as_ref() else {
            return false;
        };
        if self.woken_to_write
            || !self.io.transport.reads_alone()
            || self.conn.open_calls() != 1
            || self.conn.has_events()
            || !self.conn.is_established()
            || self.conn.is_closed()
            || self.conn.is_going_away()
            || self.io.unsent(&self.conn) != 0
        {
            return false;
        }
        route.set(cx.waker(), task);
        // A poll of its own: the calls it ends are counted afresh (see act_outside).
        self.ended_last_poll = 0;
        let mut rcx = Context::from_waker(route_waker);
        let mut progressed = false;
        let mut more = true;
        for _ in 0..INLINE_READS {
            match self.io.poll_read(&mut rcx, &mut self.conn) {
                Poll::Ready(r) => {
                    let open = matches!(r, Ok(true));
                    self.on_read(r);
                    self.process_events(usize::MAX);
                    progressed = true;
                    if !open || self.conn.is_closed() {
                        break;
                    }
                }
                Poll::Pending => {
                    more = false;
                    break;
                }
            }
        }
        // Nothing read (`more` implies something was): the engine is as it was when this
        // began, quiet by the checks above, and its deadlines did not move — the task armed
        // for them when it last polled (or `act_outside` woke it to).
        let task_needed = progressed
            && (more
                || self.io.unsent(&self.conn) != 0
                || self.conn.has_events()
                || self.conn.is_closed()
                || self.conn.is_going_away()
                || self.role.stop().is_some()
                || !self.timer_covers());
        if task_needed {
            if let Some(t) = self.waker.as_ref() {
                t.wake_by_ref();
            }
        }
        self.report();
        // (Whether the call still waits takes its completion's lock: asked only when the spin
        // is on at all.)
        if !task_needed && spin::enabled() && waiting() {
            // As the task would: stay on the CPU a moment rather than sleep.
            self.spin.before_wait(progressed || first, cx);
        }
        true
    }

    /// Whether the last [`Driver::act_outside`] found the connection idle (and wrote what it
    /// did at once, on the caller's thread) and its caller may read the reply itself.
    pub(crate) fn wrote_last_act(&self) -> bool {
        self.wrote_idle && self.route.is_some()
    }

    /// Tells the connection's gauges its open calls and unsent bytes.
    fn report(&mut self) {
        self.share.report(
            self.conn.open_calls(),
            self.io.held(&self.conn) + self.role.held(),
        );
    }

    /// The loop ended (`why`): fail what is left, then close the transport.
    async fn end(mut self, why: String) {
        tracing::debug!(side = ?R::SIDE, "connection ends: {why}");
        if !self.conn.is_closed() {
            self.conn.handle_eof();
        }
        self.process_events(usize::MAX);
        self.role.on_end(&mut self.conn, &why);
        self.io.close(&mut self.conn, Duration::from_secs(1)).await;
    }

    /// The loop: turns until nothing is ready (`Pending`, every source's waker registered) or
    /// the connection ends (`Ready(why)`).
    fn poll_turns(&mut self, cx: &mut Context<'_>) -> Poll<String> {
        // The transport said "nothing to read" in this poll (and registered `cx`'s waker):
        // nothing this task does makes it readable, so later turns of the same poll do not
        // ask again (a turn that only wrote would otherwise re-register the same waker). This
        // relies on a transport keeping that waker when a write changes its registration
        // (`SocketTransport::reregister` registers it anew).
        let mut read_waits = false;
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.waker = Some(cx.waker().clone());
        }
        self.woken_to_write = false;
        self.ended_last_poll = 0;
        for turn in 0..TURN_BUDGET {
            let all_written = match self.io.poll_flush(cx, &mut self.conn) {
                Poll::Ready(Ok(())) => true,
                Poll::Ready(Err(e)) => {
                    self.read_remains(cx);
                    return Poll::Ready(format!("write failed: {e}"));
                }
                Poll::Pending => false,
            };
            if self.conn.is_closed() {
                return Poll::Ready("connection closed".into());
            }
            if let Some(why) = self.role.stop() {
                return Poll::Ready(why.into());
            }
            if self.conn.is_drained() && all_written {
                return Poll::Ready("drained after go-away".into());
            }
            // Events left from the last turn come first (what they led to is written by now).
            if !self.conn.has_events()
                && !self.poll_sources(cx, &mut read_waits)
                && !self.arm_timer(cx)
            {
                self.report();
                // All written (or the write waits for room): spin briefly rather than sleep.
                self.spin.before_wait(turn > 0, cx);
                return Poll::Pending;
            }
            if self.process_events(events_per_turn()) && R::SIDE == Side::Client {
                // More replies wait. Let the callers just completed run (on this thread, with
                // a current-thread runtime) and start their next calls, so those go out before
                // the rest is handled: the server works on them meanwhile.
                self.report();
                // Woken already: their calls join what the task writes when it runs.
                self.woken_to_write = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
        // Busy: let other tasks run, then go on.
        self.report();
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// A write failed: takes in what the transport already received before the loop ends, so
    /// that what the peer said last is heard. A server that closes its socket with input it
    /// did not read makes the kernel reset the connection, and a write then fails while its
    /// GOAWAY and the ENDs of the calls it answered still wait in our receive buffer; without
    /// them every open call would end as "closed by the peer", even those the peer answered
    /// or never processed (protocol.md §8.3: the client fails those as unprocessed, safe to
    /// retry). Never waits: reads stop at the first `Pending`, the end of the stream, an
    /// error, or after [`REMAINS_READS`] reads (each bounded by the read buffer).
    fn read_remains(&mut self, cx: &mut Context<'_>) {
        for _ in 0..REMAINS_READS {
            if self.conn.is_closed() {
                return;
            }
            match self.io.poll_read(cx, &mut self.conn) {
                Poll::Ready(r) => {
                    let more = matches!(r, Ok(true));
                    self.on_read(r);
                    self.process_events(usize::MAX);
                    if !more {
                        return;
                    }
                }
                Poll::Pending => return,
            }
        }
    }

    /// The connection's timers — tokio's for the near deadlines, the alarm for the far ones —
    /// each moved only when its next deadline comes earlier, and only when the task is about
    /// to wait (busy turns need no timer): no timer registration on wake-ups that need none.
    /// Whether a timer was already due (the loop then goes on).
    fn arm_timer(&mut self, cx: &mut Context<'_>) -> bool {
        self.note_idle();
        // Most waits: the alarm already covers the far deadlines, told by one comparison.
        let far = if self.alarm_surely_covers() {
            self.alarm_at
        } else {
            self.next_far()
        };
        if !covers(self.alarm_at, far) {
            self.set_alarm_at(far);
            if let Some(t) = far {
                if t <= Instant::now() {
                    self.set_alarm_at(None);
                    self.on_timer();
                    return true;
                }
                self.alarm.set(t, cx.waker());
            }
        }
        let timer = self.next_near();
        if timer == self.armed || covers(self.armed, timer) {
            return false; // already polled (and registered), or due no later than needed
        }
        self.armed = timer;
        let Some(t) = timer else {
            // A fresh, never polled sleep is in no timer wheel.
            self.sleep
                .as_mut()
                .set(tokio::time::sleep_until(to_tokio(self.started)));
            return false;
        };
        self.sleep
            .as_mut()
            .set(tokio::time::sleep_until(to_tokio(t)));
        if std::future::Future::poll(self.sleep.as_mut(), cx).is_ready() {
            self.armed = None;
            self.on_timer();
            return true;
        }
        false
    }

    /// Polls the transport, then the role, then the timer, up to the first that makes
    /// progress (the loop comes back for the others); `false` when none is ready and every
    /// one has registered the task's waker. `read_waits`: the transport already returned
    /// `Pending` in this poll (its waker is registered), so it is not polled again.
    fn poll_sources(&mut self, cx: &mut Context<'_>, read_waits: &mut bool) -> bool {
        let room = self.room();
        // A server stops reading while the peer does not take what it is sent: a client that
        // never reads cannot make it queue more. A client keeps reading (its server drains it).
        // Answers kept back for the peer's credit fill the buffer too (no new call starts), but
        // reading goes on: the peer's CREDIT (or its going away) must still be seen.
        let server_held =
            R::SIDE == Side::Server && self.io.unsent(&self.conn) >= self.config.max_send_buffer();
        if !server_held && !*read_waits {
            match self.io.poll_read(cx, &mut self.conn) {
                Poll::Ready(r) => {
                    self.on_read(r);
                    return true;
                }
                Poll::Pending => *read_waits = true,
            }
        }
        if self.role.poll_work(cx, &mut self.conn, room).is_ready() {
            return true;
        }
        // Each timer was polled (or set) once, from this task, when it was armed: it wakes
        // the task when due. Asking whether it fired costs a load; polling a tokio sleep again
        // would cost a trip through its timer entry (and the coop budget) on every turn.
        if self.armed.is_some() && self.sleep.is_elapsed() {
            self.armed = None;
            self.on_timer();
            return true;
        }
        if self.alarm_at.is_some() && self.alarm.rang() {
            self.set_alarm_at(None);
            self.on_timer();
            return true;
        }
        false
    }

    /// Bytes the send buffer takes before it is full (`Config::max_send_buffer`).
    #[inline]
    fn room(&self) -> usize {
        let held = self.io.held(&self.conn) + self.role.held();
        self.config.max_send_buffer().saturating_sub(held)
    }

    fn on_read(&mut self, r: Result<bool, ReadError>) {
        match r {
            Ok(true) => {}
            Ok(false) => self.conn.handle_eof(),
            Err(ReadError::Io(e)) => self.conn.close(ProtocolError::new(
                ErrorCode::INTERNAL_ERROR,
                format!("read failed: {e}"),
            )),
            // The engine queued ERROR and ended the calls.
            Err(ReadError::Protocol(e)) => tracing::debug!(side = ?R::SIDE, "protocol error: {e}"),
        }
        self.liveness.alive();
    }

    /// Whether the armed timer is due no later than the next deadline (or there is none): a
    /// timer that fires early only makes the loop look again (`on_timer` acts on what is due),
    /// so a deadline that moves later — the idle timeout after every call — re-arms nothing.
    fn timer_covers(&self) -> bool {
        covers(self.armed, self.next_near()) && self.alarm_covers()
    }

    /// Whether the alarm is due no later than the next far deadline. While no frame is half
    /// received, no write stalls, no PING waits and the handshake is done, every far deadline
    /// is the last read plus a timeout, so an alarm due no later than the last read plus the
    /// shortest of them covers them all — a comparison instead of working each one out (this
    /// runs a few times per call).
    #[inline]
    fn alarm_covers(&self) -> bool {
        self.alarm_surely_covers() || covers(self.alarm_at, self.next_far())
    }

    /// The comparison of [`Driver::alarm_covers`]: `true` when the alarm surely covers every
    /// far deadline (`false`: they must be worked out).
    #[inline]
    fn alarm_surely_covers(&self) -> bool {
        self.alarm_floor.is_some_and(|floor| {
            self.io.partial_since.is_none()
                && self.io.write_stalled_since.is_none()
                && !self.liveness.waiting_for_pong()
                && self.conn.is_established()
                && floor <= self.io.last_read
        })
    }

    /// Arms (in this struct; the caller sets the alarm itself) or disarms the far timer.
    fn set_alarm_at(&mut self, at: Option<Instant>) {
        self.alarm_at = at;
        self.alarm_floor = at.and_then(|t| t.checked_sub(self.liveness.shortest_gap(&self.config)));
    }

    /// The next near deadline: a call's (the engine's) or the role's.
    fn next_near(&self) -> Option<Instant> {
        earliest(self.conn.poll_timeout(), self.role.next_timer())
    }

    /// What the liveness policy looks at.
    fn seen(&self) -> liveness::Seen {
        liveness::Seen {
            started: self.started,
            established: self.conn.is_established(),
            partial_since: self.io.partial_since,
            write_stalled_since: self.io.write_stalled_since,
            last_read: self.io.last_read,
            // Between notes (a call ended outside the task), the last read stands in for when
            // idleness began: the timer looks again then and notes the time.
            idle_since: self
                .idle
                .guess(self.is_idle(), self.conn.calls_begun(), self.io.last_read),
            pings: true,
        }
    }

    /// No call is open and the connection is not going away (the idle timeout applies).
    #[inline]
    fn is_idle(&self) -> bool {
        self.role.idle() && !self.conn.is_going_away()
    }

    /// Notes whether the connection is idle now, and since when.
    #[inline]
    fn note_idle(&mut self) {
        let idle = self.is_idle();
        self.idle.note(idle, self.conn.calls_begun());
    }

    /// The next far deadline: the handshake's and the liveness timers'.
    fn next_far(&self) -> Option<Instant> {
        self.liveness.next(&self.seen(), &self.config)
    }

    fn on_timer(&mut self) {
        self.note_idle();
        let now = Instant::now();
        self.conn.handle_timeout(now);
        let lapse = if self.conn.is_closed() {
            Lapse::Closed
        } else {
            let seen = self.seen();
            match self.liveness.due(now, &seen, &self.config) {
                Some(liveness::Due::Close(why)) => {
                    self.conn.close(ProtocolError::new(ErrorCode::TIMEOUT, why));
                    Lapse::Closed
                }
                Some(liveness::Due::Ping) => {
                    self.conn.ping(*b"keepaliv");
                    Lapse::None
                }
                Some(liveness::Due::Idle) => {
                    self.conn.go_away(ErrorCode::NO_ERROR, "idle timeout");
                    Lapse::Idle
                }
                None => Lapse::None,
            }
        };
        self.role.on_timer(now, &mut self.conn, lapse);
    }

    /// Hands at most `max` of the engine's events to the role; whether more are left.
    fn process_events(&mut self, max: usize) -> bool {
        let mut n = 0;
        while let Some(ev) = self.conn.poll_event() {
            n += 1;
            if let Event::Pong { .. } = ev {
                self.liveness.alive();
                continue;
            }
            if let Event::Ended { .. } = ev {
                self.ended_last_poll = self.ended_last_poll.saturating_add(1);
            }
            let room = self.room();
            self.role.on_event(ev, &mut self.conn, room);
            if n >= max && self.conn.has_events() {
                return true;
            }
        }
        false
    }
}

/// How far off a timer for "no deadline" is set: a year (a timer that never fires, for a
/// `select!` branch that must exist).
pub(crate) const FAR: Duration = Duration::from_secs(86_400 * 365);

/// An instant [`FAR`] from now.
pub(crate) fn far_future() -> Instant {
    Instant::now() + FAR
}

/// The earlier of two deadlines.
#[inline]
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Whether a timer armed for `armed` is due no later than `next` needs.
#[inline]
pub(crate) fn covers(armed: Option<Instant>, next: Option<Instant>) -> bool {
    match (armed, next) {
        (_, None) => true,
        (Some(a), Some(n)) => a <= n,
        (None, Some(_)) => false,
    }
}

/// Told when a stream message has been handed to the engine (or why not).
pub(crate) type Ack = tokio::sync::oneshot::Sender<Result<(), Status>>;
/// A stream message waiting for flow-control credit, and whom to tell when it is sent.
pub(crate) type Blocked = (crate::codec::Payload, Ack);

/// What became of a stream message given to the engine.
pub(crate) enum Sent {
    /// Sent, and its sender told.
    Done,
    /// No credit (or a split message still going): keep it until `Event::Writable`.
    Blocked(Box<Blocked>),
    /// Refused; its sender is not told yet.
    Refused(CallError, Ack),
}

/// Sends one message of a stream (either side), telling its sender once it is sent.
pub(crate) fn send_message(
    conn: &mut Connection,
    id: topspin_proto::CallId,
    message: crate::codec::Payload,
    ack: Ack,
) -> Sent {
    match conn.send_message(id, message.clone(), false) {
        Ok(()) => {
            let _ = ack.send(Ok(()));
            Sent::Done
        }
        Err(CallError::WouldBlock) => Sent::Blocked(Box::new((message, ack))),
        Err(e) => Sent::Refused(e, ack),
    }
}

/// The status for a call the engine refused locally (`what`: the method, or which part of a
/// response). One wording for both sides.
pub(crate) fn call_error_status(e: CallError, what: &str) -> Status {
    match e {
        CallError::MessageTooLarge { size, limit } => Status::resource_exhausted(format!(
            "{what}: message of {size} bytes exceeds the peer's max_message_size of {limit} bytes (raise Config::max_message_size on the receiving side)"
        )),
        CallError::MetadataTooLarge { size, limit } => Status::resource_exhausted(format!(
            "{what}: metadata of {size} bytes exceeds the peer's max_metadata_size of {limit} bytes"
        )),
        CallError::DeadlineExceeded => {
            Status::deadline_exceeded(format!("{what}: the deadline passed before it was sent"))
        }
        CallError::InvalidMethod(m) => Status::invalid_argument(format!(
            "invalid method name {m:?}: must be 1..=1024 bytes, like /package.Service/Method"
        )),
        CallError::GoingAway | CallError::Closed | CallError::NotReady | CallError::IdsExhausted => {
            Status::unavailable(format!("{what}: {e}; the call was not sent and is safe to retry"))
        }
        other => Status::internal(format!("{what}: {other}")),
    }
}

/// Queues a command from code that cannot wait (a `Drop`, a stream handing out a message): if
/// the bounded queue is full, a small task waits for room instead, so the command is never lost
/// and the queue never grows past its bound.
pub(crate) fn send_now<C: Send + 'static>(tx: &tokio::sync::mpsc::Sender<C>, cmd: C) {
    if let Err(tokio::sync::mpsc::error::TrySendError::Full(cmd)) = tx.try_send(cmd) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let tx = tx.clone();
            rt.spawn(async move {
                let _ = tx.send(cmd).await;
            });
        }
    }
}
