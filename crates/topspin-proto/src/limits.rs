//! Engine-local limits on what a peer can make a connection do (protocol.md §9, "Local limits").
//!
//! Unlike [`Settings`](crate::Settings) these are not announced to the peer: they bound how much
//! work and memory a conforming but hostile peer can cost, and a well-behaved peer never meets
//! them.

use std::time::{Duration, Instant};

/// A rate: `burst` events at once, then one per `interval` on average (a token bucket, kept as
/// the GCRA "theoretical arrival time", so checking it costs a comparison and an addition).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    burst: u32,
    interval: Duration,
}

impl Rate {
    /// `burst` events at once, then one per `interval`.
    pub const fn new(burst: u32, interval: Duration) -> Rate {
        Rate { burst, interval }
    }

    /// Events allowed at once (after a quiet period).
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// The average interval allowed between events past the burst.
    pub fn interval(&self) -> Duration {
        self.interval
    }
}

/// The state of one [`Rate`] on one connection.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Bucket {
    /// When the bucket would be full again at the allowed rate.
    tat: Option<Instant>,
}

impl Bucket {
    /// Counts one event at `now`; `false` when it goes past the rate.
    #[inline]
    pub(crate) fn take(&mut self, rate: Rate, now: Instant) -> bool {
        let tat = self.tat.map_or(now, |t| t.max(now));
        let allowed = rate.interval.saturating_mul(rate.burst);
        if tat.saturating_duration_since(now) >= allowed {
            return false;
        }
        self.tat = Some(tat + rate.interval);
        true
    }
}

/// Engine-local limits of one connection side, with documented defaults. Read with the
/// getters, build with the `with_…` setters, give to
/// [`Connection::set_limits`](crate::Connection::set_limits).
///
/// Past a rate the engine closes the connection with GOAWAY and ERROR `ENHANCE_YOUR_CALM`
/// naming what was exceeded (protocol.md §9).
///
/// ```
/// use std::time::Duration;
/// use topspin_proto::{Limits, Rate};
/// let l = Limits::default().with_ping_rate(Rate::new(5, Duration::from_secs(1)));
/// assert_eq!(l.ping_rate().burst(), 5);
/// assert_eq!(Limits::default().rapid_reset_rate().burst(), 1000);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    ping_rate: Rate,
    rapid_reset_rate: Rate,
    refused_call_rate: Rate,
    credit_recheck: Duration,
    message_timeout: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            ping_rate: Rate::new(20, Duration::from_millis(100)),
            rapid_reset_rate: Rate::new(1000, Duration::from_millis(1)),
            refused_call_rate: Rate::new(100, Duration::from_millis(10)),
            credit_recheck: Duration::from_millis(10),
            message_timeout: None,
        }
    }
}

macro_rules! limit {
    ($(#[doc = $doc:literal])* $name:ident, $with:ident: $ty:ty) => {
        $(#[doc = $doc])*
        pub fn $name(&self) -> $ty {
            self.$name
        }

        #[doc = concat!("Sets [`Limits::", stringify!($name), "`].")]
        #[must_use]
        pub fn $with(mut self, value: $ty) -> Limits {
            self.$name = value;
            self
        }
    };
}

impl Limits {
    limit! {
        /// PINGs (without ACK) the peer may send (default: a burst of 20, then one per 100 ms).
        /// A topspin peer's keep-alive pings at most once per `keepalive_interval`, so any
        /// interval of 100 ms or more stays within it.
        ping_rate, with_ping_rate: Rate
    }
    limit! {
        /// Server: calls the client may cancel before this side answered them (no HEADERS,
        /// MESSAGE or END sent yet), the "Rapid Reset" pattern (default: a burst of 1000, then
        /// one per millisecond).
        rapid_reset_rate, with_rapid_reset_rate: Rate
    }
    limit! {
        /// Server: CALLs refused because `MAX_CONCURRENT_CALLS` was reached, which a conforming
        /// client avoids by queueing (default: a burst of 100, then one per 10 ms).
        refused_call_rate, with_refused_call_rate: Rate
    }
    limit! {
        /// While credit for split-message chunks is withheld because the
        /// [`MemoryBudget`](crate::MemoryBudget) is spent, how often the engine checks again
        /// (its [`Connection::poll_timeout`](crate::Connection::poll_timeout); default 10 ms).
        credit_recheck, with_credit_recheck: Duration
    }
    limit! {
        /// How long a split message may go without a chunk while its credit is open (the
        /// sender could send) before the connection is closed with `TIMEOUT`: a peer that
        /// starts messages and stops cannot hold their buffers for ever (default: none; the
        /// topspin runtime sets its `frame_timeout`, 30 s). Time while this side withholds the
        /// credit does not count.
        message_timeout, with_message_timeout: Option<Duration>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_the_burst_then_the_rate() {
        let rate = Rate::new(3, Duration::from_millis(10));
        let now = Instant::now();
        let mut b = Bucket::default();
        let allowed = (0..10).filter(|_| b.take(rate, now)).count();
        assert_eq!(allowed, 3);
        let t = now + Duration::from_millis(10);
        assert!(b.take(rate, t), "one more per interval");
        assert!(!b.take(rate, t));
        // A long quiet period refills it, never beyond the burst.
        let later = now + Duration::from_secs(10);
        assert_eq!((0..10).filter(|_| b.take(rate, later)).count(), 3);
    }
}
