//! Limits and timeouts shared by [`Channel`](crate::Channel) and [`Server`](crate::Server).

use std::sync::Arc;
use std::time::Duration;
use topspin_proto::{Limits, MemoryBudget, Rate, Settings};

/// The default [`Config::idle_timeout`]: one hour.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

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
    /// `None`: follows `max_message_size`.
    max_frame_size: Option<u32>,
    max_metadata_size: u32,
    initial_call_window: u32,
    max_send_buffer: usize,
    max_pending_calls: usize,
    handshake_timeout: Duration,
    frame_timeout: Duration,
    idle_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    keepalive_interval: Option<Duration>,
    keepalive_timeout: Duration,
    memory_budget: Option<Arc<MemoryBudget>>,
    compression: Option<crate::Compression>,
    /// Set by the server (or channel) that uses this config.
    pub(crate) gauges: Option<crate::Gauges>,
    // Server: connection lifecycle (count, age, Unix socket file mode).
    max_connections: usize,
    max_connection_age: Option<Duration>,
    max_connection_age_grace: Duration,
    unix_socket_mode: u32,
    local_users: crate::LocalUsers,
    // Engine-local limits (protocol.md §9, "Local limits"): never announced to the peer.
    ping_rate: Rate,
    rapid_reset_rate: Rate,
    refused_call_rate: Rate,
}

impl Default for Config {
    fn default() -> Config {
        let s = Settings::default();
        Config {
            max_message_size: s.max_message_size(),
            max_concurrent_calls: s.max_concurrent_calls(),
            max_frame_size: None,
            max_metadata_size: s.max_metadata_size(),
            initial_call_window: s.initial_call_window(),
            max_send_buffer: 4 * 1024 * 1024,
            max_pending_calls: 4096,
            handshake_timeout: Duration::from_secs(10),
            frame_timeout: Duration::from_secs(30),
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            write_timeout: Some(Duration::from_secs(60)),
            keepalive_interval: None,
            keepalive_timeout: Duration::from_secs(20),
            memory_budget: None,
            compression: None,
            gauges: None,
            // Server: connection lifecycle.
            max_connections: 10_000,
            max_connection_age: None,
            max_connection_age_grace: Duration::from_secs(30),
            unix_socket_mode: 0o660,
            local_users: crate::LocalUsers::Own,
            ping_rate: Limits::default().ping_rate(),
            rapid_reset_rate: Limits::default().rapid_reset_rate(),
            refused_call_rate: Limits::default().refused_call_rate(),
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
    /// Largest frame this side accepts: by default `max_message_size` (so 64 MiB), at least
    /// 16 KiB. A message that fits one frame is never split on its way here, so it lands in
    /// one buffer and is handed to the handler or caller by reference, without being copied
    /// together from chunks. The protocol's own default (what a peer that does not say
    /// assumes) stays 16 MiB. A header claiming a large frame reserves it only within the
    /// memory budget (see `memory_budget`); past it, the buffer grows as bytes arrive.
    ///
    /// ```
    /// use topspin::Config;
    /// assert_eq!(Config::default().max_frame_size(), 64 * 1024 * 1024);
    /// let c = Config::default().with_max_message_size(1 << 20);
    /// assert_eq!(c.max_frame_size(), 1 << 20);
    /// assert_eq!(c.with_max_frame_size(1 << 16).max_frame_size(), 1 << 16);
    /// ```
    pub fn max_frame_size(&self) -> u32 {
        self.max_frame_size.unwrap_or_else(|| {
            self.max_message_size
                .clamp(topspin_proto::MIN_MAX_FRAME_SIZE, topspin_proto::MAX_WINDOW)
        })
    }

    /// Sets [`Config::max_frame_size`] (it then no longer follows `max_message_size`).
    #[must_use]
    pub fn with_max_frame_size(mut self, value: u32) -> Config {
        self.max_frame_size = Some(value);
        self
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
        /// Close a connection that has had no open call for this long (default 1 hour;
        /// `None`: never). The default is Envoy's idle timeout for downstream connections: long
        /// enough that a connection is kept between a service's calls (a client reconnects on
        /// the next call anyway), short enough that sockets left idle cannot hold a server's
        /// `max_connections` for ever. Applies to every face (native, gRPC, WebSocket, shm).
        /// The time counts from the end of the last call (or the handshake): PINGs and other
        /// frames that are not calls do not keep a connection from going idle (protocol.md §9).
        idle_timeout, with_idle_timeout: Option<Duration>
    }
    field! {
        /// Close a connection whose peer takes none of the bytes waiting for it for this long
        /// (default 60 s; `None`: never). A topspin runtime reads its socket whatever its
        /// calls' flow control says, so a transport that stays full this long means a peer
        /// that stopped reading (a hung process, or an attacker holding our send buffer and
        /// its calls) — keep-alive, off by default, would not be on to tell. Applies to every
        /// face.
        write_timeout, with_write_timeout: Option<Duration>
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

    /// Which local users may be at the other end of an abstract socket: a server accepts
    /// `unix:@name` and `shm://name` connections from them only; a client connects to a
    /// `shm://` server run by them only (default: this process's own user; see
    /// [`LocalUsers`](crate::LocalUsers)).
    pub fn local_users(&self) -> &crate::LocalUsers {
        &self.local_users
    }

    /// Sets [`Config::local_users`].
    #[must_use]
    pub fn with_local_users(mut self, users: crate::LocalUsers) -> Config {
        self.local_users = users;
        self
    }

    /// The budget of bytes this side may reserve for messages it is receiving (frames larger
    /// than its read buffer, split messages), shared by every connection that charges it:
    /// by default the process-wide [`process_memory_budget`](crate::process_memory_budget)
    /// (1 GiB). A connection never reserves what a peer merely announced beyond this: past it,
    /// buffers grow only as bytes arrive, new calls are refused with `RESOURCE_EXHAUSTED` and
    /// credit is withheld until room is back.
    pub fn memory_budget(&self) -> Arc<MemoryBudget> {
        self.memory_budget
            .clone()
            .unwrap_or_else(crate::process_memory_budget)
    }

    /// Sets [`Config::memory_budget`] (for example `MemoryBudget::new(256 << 20)`, shared by
    /// several servers).
    #[must_use]
    pub fn with_memory_budget(mut self, budget: Arc<MemoryBudget>) -> Config {
        self.memory_budget = Some(budget);
        self
    }

    field! {
        /// How this side compresses the messages it sends (default: not at all; protocol.md
        /// §15). A client with it compresses its requests and accepts compressed responses
        /// (per call: `Request::with_compression`); a server with it compresses its responses
        /// to clients that accept its encoding. Either side always decodes zstd and gzip, and
        /// a compressed message never decompresses past `max_message_size`
        /// (`RESOURCE_EXHAUSTED`).
        compression, with_compression: Option<crate::Compression>
    }

    // Server: connection lifecycle (count, age, Unix socket file mode).
    field! {
        /// Server: most connections open at once (default 10,000). Past it a new connection
        /// is told why and closed: it gets the preface, SETTINGS and, once its first call
        /// arrives (or after a second), an ERROR frame naming `max_connections (N) reached`,
        /// so that call fails `UNAVAILABLE` with that reason. Connections already open are
        /// not affected. Keep it below the process's file descriptor limit (`ulimit -n`).
        max_connections, with_max_connections: usize
    }
    field! {
        /// Server: a connection older than this is asked to go away (default: never), like
        /// gRPC's `MaxConnectionAge`: it gets a GOAWAY, takes no new calls, and its calls in
        /// flight get [`Config::max_connection_age_grace`] to finish. Clients reconnect for
        /// later calls, which spreads them again after servers were added behind a load
        /// balancer. Each connection's age is jittered by ±10% so that connections made
        /// together do not all go away together.
        max_connection_age, with_max_connection_age: Option<Duration>
    }
    field! {
        /// Server: how long calls in flight on a connection past its
        /// [`Config::max_connection_age`] may still run (default 30 s); then they end
        /// `UNAVAILABLE` and the connection closes.
        max_connection_age_grace, with_max_connection_age_grace: Duration
    }
    field! {
        /// Server: permission bits of a Unix socket file (default `0o660`: the owner and its
        /// group may connect, nobody else), set right after it is bound. Not used for
        /// abstract sockets (`unix:@name`), which have no file.
        unix_socket_mode, with_unix_socket_mode: u32
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

    /// The engine-local limits of a connection.
    pub(crate) fn limits(&self) -> Limits {
        Limits::default()
            .with_ping_rate(self.ping_rate)
            .with_rapid_reset_rate(self.rapid_reset_rate)
            .with_refused_call_rate(self.refused_call_rate)
            .with_message_timeout(Some(self.frame_timeout))
    }

    pub(crate) fn settings(&self) -> Settings {
        Settings::default()
            .with_max_frame_size(self.max_frame_size())
            .with_max_concurrent_calls(self.max_concurrent_calls)
            .with_initial_call_window(self.initial_call_window)
            .with_max_message_size(self.max_message_size)
            .with_max_metadata_size(self.max_metadata_size)
    }
}
