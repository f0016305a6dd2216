//! The connection timers of both HTTP/2 loops — the gRPC face's (`server.rs`) and the
//! `grpc://` client mode's (`client::grpc`): what the peer sent is read as it passes to h2
//! (`watch.rs`), the one liveness policy native connections keep (`connection::liveness`)
//! says what is due — handshake, frame, write, idle, keep-alive — and the keep-alive PINGs it
//! asks for are h2's user PINGs ([`Pings`]).

use super::watch::{self, Tracker};
use crate::connection::liveness::{self, Liveness};
use crate::Config;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

/// A PING sent with h2's `PingPong`, until its PONG (the `PingPong` comes back with it).
type InFlight = Pin<Box<dyn Future<Output = (h2::PingPong, Result<h2::Pong, h2::Error>)> + Send>>;

/// The keep-alive PINGs of an HTTP/2 connection: h2 lets one user PING be in flight, and its
/// PONG is awaited by polling [`Pings::poll_pong`] from the connection's loop.
#[derive(Default)]
pub(crate) enum Pings {
    /// No `PingPong` (h2 gave it away already): no PINGs.
    #[default]
    Off,
    Ready(h2::PingPong),
    Waiting(InFlight),
}

impl Pings {
    pub(crate) fn new(pings: Option<h2::PingPong>) -> Pings {
        pings.map_or(Pings::Off, Pings::Ready)
    }

    /// Sends a PING, unless one is still in flight (then its PONG answers for both).
    pub(crate) fn send(&mut self) {
        if let Pings::Ready(_) = self {
            let Pings::Ready(mut pings) = std::mem::take(self) else {
                unreachable!()
            };
            *self = Pings::Waiting(Box::pin(async move {
                let pong = pings.ping(h2::Ping::opaque()).await;
                (pings, pong)
            }));
        }
    }

    /// The PONG of the PING in flight (an error: the connection is gone, and so are PINGs).
    /// Pending while none is in flight.
    pub(crate) fn poll_pong(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), h2::Error>> {
        let Pings::Waiting(fut) = self else {
            return Poll::Pending;
        };
        let (pings, pong) = std::task::ready!(fut.as_mut().poll(cx));
        *self = match pong {
            Ok(_) => Pings::Ready(pings),
            Err(_) => Pings::Off,
        };
        Poll::Ready(pong.map(|_| ()))
    }
}

/// What a lapsed timer asks for.
pub(crate) enum Lapse {
    /// Close at once, for this reason.
    Close(String),
    /// Idle too long: go away.
    Idle,
}

/// The connection timers of an HTTP/2 loop, read from what the peer sent (`watch.rs`): the
/// handshake (the peer's SETTINGS), frame, write, idle and keep-alive timers of the one
/// liveness policy native connections keep.
pub(crate) struct Timers<'a> {
    pub(crate) tracker: Arc<Mutex<Tracker>>,
    pub(crate) started: Instant,
    pub(crate) config: &'a Config,
    pub(crate) liveness: Liveness,
    /// Since when no call has been open. Each turn of the loop notes it before it waits, and
    /// a call the loop takes on in a turn is open at the next look, so no call goes unseen.
    idle: liveness::IdleSince,
}

impl<'a> Timers<'a> {
    /// The timers of a connection made or accepted at `started`, whose peer's bytes `tracker`
    /// sees.
    pub(crate) fn new(tracker: Arc<Mutex<Tracker>>, started: Instant, config: &'a Config) -> Self {
        Timers {
            tracker,
            started,
            config,
            liveness: Liveness::default(),
            idle: liveness::IdleSince::default(),
        }
    }

    /// What the policy looks at, with `idle` telling whether no call is open (and the
    /// connection is not going away already).
    fn seen(&mut self, idle: bool) -> liveness::Seen {
        self.idle.note(idle, 0);
        let t = watch::read(&self.tracker);
        liveness::Seen {
            started: self.started,
            established: t.settings_received(),
            partial_since: t.partial_since,
            write_stalled_since: t.write_stalled_since,
            last_read: t.last_read,
            idle_since: self.idle.since(),
            pings: true,
        }
    }

    /// The earliest timer.
    pub(crate) fn next(&mut self, idle: bool) -> Option<Instant> {
        let seen = self.seen(idle);
        self.liveness.next(&seen, self.config)
    }

    /// What to do now that the earliest timer passed (`None`: nothing, or a keep-alive PING
    /// sent with `pings`).
    pub(crate) fn lapsed(&mut self, idle: bool, pings: &mut Pings) -> Option<Lapse> {
        let seen = self.seen(idle);
        match self.liveness.due(Instant::now(), &seen, self.config)? {
            liveness::Due::Close(why) => Some(Lapse::Close(why)),
            liveness::Due::Idle => Some(Lapse::Idle),
            liveness::Due::Ping => {
                pings.send();
                None
            }
        }
    }

    /// A PONG came: the peer is alive.
    pub(crate) fn alive(&mut self) {
        self.liveness.alive();
    }
}

/// The loop's timer for its connection timers.
#[derive(Default)]
pub(crate) struct LapseTimer {
    /// When the timer is due; moved only when the next deadline comes earlier (a deadline
    /// that moves later, as the keep-alive does with every read, leaves it: firing early
    /// only makes the loop look again), so most turns touch no timer — the native
    /// connection's rule (`connection::covers`).
    pub(crate) armed: Option<Instant>,
    /// The timer was polled since it was last set, so it holds this task's waker (the task's
    /// waker is the same every turn): until the timer wheel takes it out, polling it again
    /// would say nothing new, and most turns skip it.
    polled: bool,
}

impl LapseTimer {
    pub(crate) fn arm(&mut self, sleep: Pin<&mut tokio::time::Sleep>, next: Option<Instant>) {
        if let Some(t) = next.filter(|_| !crate::connection::covers(self.armed, next)) {
            sleep.reset(t.into());
            self.armed = Some(t);
            self.polled = false;
        }
    }

    pub(crate) fn poll(
        &mut self,
        sleep: Pin<&mut tokio::time::Sleep>,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        if self.polled && !sleep.is_elapsed() {
            return Poll::Pending;
        }
        // A poll refused for want of coop budget registers nothing: poll again then.
        self.polled = tokio::task::coop::has_budget_remaining();
        sleep.poll(cx)
    }
}

/// Runs an HTTP/2 connection's future — the face's or the client mode's, each with its calls
/// on the same task — so that the wake-ups it gives itself while it runs (h2 wakes the
/// connection whenever a call queues a frame or takes data, from inside that task)
/// become another turn of the same poll rather than a reschedule: tokio reschedules a task that
/// woke itself as a yield, which also wakes a parked worker thread to steal it — an extra
/// thread wake-up (and often a migration to another CPU) per call. Wake-ups from elsewhere
/// (the socket, spawned handlers) go to the task as usual. At most [`TURNS`] turns per poll.
pub(crate) struct Coalesced<F> {
    fut: Pin<Box<F>>,
    shared: Arc<WakeState>,
    waker: std::task::Waker,
}

/// Turns of one poll before the task yields to others anyway.
const TURNS: usize = 32;
const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const RUNNING_WOKEN: u8 = 2;

#[derive(Default)]
struct WakeState {
    state: std::sync::atomic::AtomicU8,
    task: futures_util::task::AtomicWaker,
}

impl std::task::Wake for WakeState {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        use std::sync::atomic::Ordering::AcqRel;
        match self.state.compare_exchange(
            RUNNING,
            RUNNING_WOKEN,
            AcqRel,
            std::sync::atomic::Ordering::Acquire,
        ) {
            Ok(_) | Err(RUNNING_WOKEN) => {}
            Err(_) => self.task.wake(),
        }
    }
}

impl<F: Future<Output = ()>> Coalesced<F> {
    pub(crate) fn new(fut: F) -> Coalesced<F> {
        let shared = Arc::new(WakeState::default());
        Coalesced {
            fut: Box::pin(fut),
            waker: std::task::Waker::from(shared.clone()),
            shared,
        }
    }
}

impl<F: Future<Output = ()>> Future for Coalesced<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire, Release};
        let this = &mut *self;
        this.shared.task.register(cx.waker());
        let mut inner = std::task::Context::from_waker(&this.waker);
        for _ in 0..TURNS {
            this.shared.state.store(RUNNING, Release);
            if this.fut.as_mut().poll(&mut inner).is_ready() {
                this.shared.state.store(IDLE, Release);
                return Poll::Ready(());
            }
            if this
                .shared
                .state
                .compare_exchange(RUNNING, IDLE, AcqRel, Acquire)
                .is_ok()
            {
                return Poll::Pending; // nothing woke it while it ran
            }
            // Woken while running: another turn.
        }
        this.shared.state.store(IDLE, Release);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
