//! Limits and timeouts shared by [`Channel`](crate::Channel) and [`Server`](crate::Server).

use std::sync::Arc;
use std::time::Duration;
use topspin_proto::{Limits, MemoryBudget, Rate, Settings, DEFAULT_MEMORY_BUDGET};

/// Limits and timeouts of one side of a connection, with documented defaults. Every bound on
/// what a peer can make this side hold is here.
///
/// ```
/// use std::time::Duration;
/// use topspin::Config;
/// let c = Config::default()
///     .with_max_message_size(4 * 1024 * 1024)
///     .with_idle_timeout(Some(Duration::from_secs(300)));
/// assert_eq!(c.max_message_size(), 4 * 1024 * 1024);
/// assert_eq!(Config::default().max_send_buffer(), 4 * 1024 * 1024);
/// ```
#[derive(Clone, Debug)]
pub struct Config {
    max_message_size: u32,
    max_concurrent_calls: u32,
    max_frame_size: u32,
    max_metadata_size: u32,
    initial_call_window: u32,
    max_send_buffer: usize,
    max_pending_calls: usize,
    handshake_timeout: Duration,
    frame_timeout: Duration,
    idle_timeout: Option<Duration>,
    keepalive_interval: Option<Duration>,
    keepalive_timeout: Duration,
    // Engine-local limits (protocol.md §9, "Local limits"): never announced to the peer.
    ping_rate: Rate,
    rapid_reset_rate: Rate,
    refused_call_rate: Rate,
    memory_budget: Arc<MemoryBudget>,
}

impl Default for Config {
    fn default() -> Config {
        let s = Settings::default();
        Config {
            max_message_size: s.max_message_size(),
            max_concurrent_calls: s.max_concurrent_calls(),
            max_frame_size: s.max_frame_size(),
            max_metadata_size: s.max_metadata_size(),
            initial_call_window: s.initial_call_window(),
            max_send_buffer: 4 * 1024 * 1024,
            max_pending_calls: 4096,
            handshake_timeout: Duration::from_secs(10),
            frame_timeout: Duration::from_secs(30),
            idle_timeout: None,
            keepalive_interval: None,
            keepalive_timeout: Duration::from_secs(20),
            ping_rate: Limits::default().ping_rate(),
            rapid_reset_rate: Limits::default().rapid_reset_rate(),
            refused_call_rate: Limits::default().refused_call_rate(),
            memory_budget: MemoryBudget::new(DEFAULT_MEMORY_BUDGET),
        }
    }
}

macro_rules! field {
    ($(#[doc = $doc:literal])* $name:ident, $with:ident: $ty:ty) => {
        $(#[doc = $doc])*
        pub fn $name(&self) -> $ty {
            self.$name
        }

        #[doc = concat!("Sets [`Config::", stringify!($name), "`].")]
        #[must_use]
        pub fn $with(mut self, value: $ty) -> Config {
            self.$name = value;
            self
        }
    };
}

impl Config {
    field! {
        /// Largest message this side accepts (default 64 MiB). A larger one fails its call with
        /// `RESOURCE_EXHAUSTED`; the connection goes on.
        max_message_size, with_max_message_size: u32
    }
    field! {
        /// Most calls the peer may have open at once on one connection (default 1024).
        max_concurrent_calls, with_max_concurrent_calls: u32
    }
    field! {
        /// Largest frame this side accepts (default 16 MiB; at least 16 KiB).
        max_frame_size, with_max_frame_size: u32
    }
    field! {
        /// Largest metadata block this side accepts (default 16 KiB).
        max_metadata_size, with_max_metadata_size: u32
    }
    field! {
        /// Flow-control window per call and direction, in bytes (default 1 MiB).
        initial_call_window, with_initial_call_window: u32
    }
    field! {
        /// Bytes a connection may have produced and not yet handed to the transport (default
        /// 4 MiB; a single larger message still goes, as one unit). Past it a server stops
        /// reading from that connection and its handlers' sends wait; a client keeps new calls
        /// waiting (at most `max_pending_calls`, their deadlines running) and holds stream
        /// messages — until the peer reads. This bounds what a peer that never reads can make
        /// this side hold.
        max_send_buffer, with_max_send_buffer: usize
    }
    field! {
        /// Client: calls kept waiting on one connection because the server's
        /// `max_concurrent_calls` is reached or the send buffer is full (default 4096); more
        /// fail at once with `RESOURCE_EXHAUSTED`. A waiting call's deadline keeps running.
        max_pending_calls, with_max_pending_calls: usize
    }
    field! {
        /// Time allowed to connect and exchange the preface and settings (default 10 s).
        handshake_timeout, with_handshake_timeout: Duration
    }
    field! {
        /// A frame that has started to arrive must complete within this (default 30 s): a peer
        /// that sends half a frame and stalls is disconnected.
        frame_timeout, with_frame_timeout: Duration
    }
    field! {
        /// Close a connection that has had no open call for this long (default: never).
        idle_timeout, with_idle_timeout: Option<Duration>
    }
    field! {
        /// Send a PING after this long without receiving anything (default: never). A topspin
        /// peer accepts PINGs at its `ping_rate` (default: a burst of 20, then one per 100 ms)
        /// and closes the connection with `ENHANCE_YOUR_CALM` past it, so keep this at 100 ms
        /// or more (and at least the peer's interval, if it was changed).
        keepalive_interval, with_keepalive_interval: Option<Duration>
    }
    field! {
        /// Close the connection if a keep-alive PING is not answered within this (default 20 s).
        keepalive_timeout, with_keepalive_timeout: Duration
    }

    field! {
        /// PINGs the peer may send (default: a burst of 20, then one per 100 ms); past it the
        /// connection is closed with GOAWAY and ERROR `ENHANCE_YOUR_CALM` ("too_many_pings").
        /// PINGs that arrive while an answer is unsent share that answer.
        ping_rate, with_ping_rate: Rate
    }
    field! {
        /// Server: calls a client may cancel before they were answered ("Rapid Reset"; default:
        /// a burst of 1000, then one per millisecond); past it the connection is closed with
        /// `ENHANCE_YOUR_CALM`.
        rapid_reset_rate, with_rapid_reset_rate: Rate
    }
    field! {
        /// Server: CALLs refused for being over `max_concurrent_calls` (default: a burst of
        /// 100, then one per 10 ms; a topspin client queues instead); past it the connection is
        /// closed with `ENHANCE_YOUR_CALM`.
        refused_call_rate, with_refused_call_rate: Rate
    }

    /// Memory for incoming split messages still being received, shared by every connection
    /// made with this configuration (and its clones): default 1 GiB. While it is spent a server
    /// refuses new calls with `RESOURCE_EXHAUSTED` and both sides withhold credit for
    /// split-message chunks (one message per connection still goes on).
    pub fn memory_budget(&self) -> &Arc<MemoryBudget> {
        &self.memory_budget
    }

    /// Sets [`Config::memory_budget`] (share one budget between servers and channels with
    /// [`Arc::clone`]).
    #[must_use]
    pub fn with_memory_budget(mut self, budget: Arc<MemoryBudget>) -> Config {
        self.memory_budget = budget;
        self
    }

    /// The engine-local limits of a connection.
    pub(crate) fn limits(&self) -> Limits {
        Limits::default()
            .with_ping_rate(self.ping_rate)
            .with_rapid_reset_rate(self.rapid_reset_rate)
            .with_refused_call_rate(self.refused_call_rate)
    }

    pub(crate) fn settings(&self) -> Settings {
        Settings::default()
            .with_max_frame_size(self.max_frame_size)
            .with_max_concurrent_calls(self.max_concurrent_calls)
            .with_initial_call_window(self.initial_call_window)
            .with_max_message_size(self.max_message_size)
            .with_max_metadata_size(self.max_metadata_size)
    }
}
