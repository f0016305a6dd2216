//! Limits and timeouts shared by [`Channel`](crate::Channel) and [`Server`](crate::Server).

use std::time::Duration;
use topspin_proto::Settings;

/// Limits and timeouts of one side of a connection, with documented defaults.
///
/// ```
/// use topspin::Config;
/// let c = Config::default();
/// assert_eq!(c.max_message_size, 64 * 1024 * 1024);
/// ```
#[derive(Clone, Debug)]
pub struct Config {
    /// Largest message this side accepts (default 64 MiB). A larger one fails its call with
    /// `RESOURCE_EXHAUSTED`; the connection goes on.
    pub max_message_size: u32,
    /// Most calls the peer may have open at once on one connection (default 1024).
    pub max_concurrent_calls: u32,
    /// Largest frame this side accepts (default 16 MiB; at least 16 KiB).
    pub max_frame_size: u32,
    /// Largest metadata block this side accepts (default 16 KiB).
    pub max_metadata_size: u32,
    /// Flow-control window per call and direction, in bytes (default 1 MiB).
    pub initial_call_window: u32,
    /// Time allowed for the connection preface and settings exchange (default 10 s).
    pub handshake_timeout: Duration,
    /// A frame that has started to arrive must complete within this (default 30 s): a peer that
    /// sends half a frame and stalls is disconnected.
    pub frame_timeout: Duration,
    /// Close a connection that has had no open call for this long (default: never).
    pub idle_timeout: Option<Duration>,
    /// Send a PING after this long without receiving anything (default: never).
    pub keepalive_interval: Option<Duration>,
    /// Close the connection if a keep-alive PING is not answered within this (default 20 s).
    pub keepalive_timeout: Duration,
}

impl Default for Config {
    fn default() -> Config {
        let s = Settings::default();
        Config {
            max_message_size: s.max_message_size,
            max_concurrent_calls: s.max_concurrent_calls,
            max_frame_size: s.max_frame_size,
            max_metadata_size: s.max_metadata_size,
            initial_call_window: s.initial_call_window,
            handshake_timeout: Duration::from_secs(10),
            frame_timeout: Duration::from_secs(30),
            idle_timeout: None,
            keepalive_interval: None,
            keepalive_timeout: Duration::from_secs(20),
        }
    }
}

impl Config {
    pub(crate) fn settings(&self) -> Settings {
        Settings {
            max_frame_size: self.max_frame_size,
            max_concurrent_calls: self.max_concurrent_calls,
            initial_call_window: self.initial_call_window,
            max_message_size: self.max_message_size,
            max_metadata_size: self.max_metadata_size,
        }
    }
}
