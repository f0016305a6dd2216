//! The gRPC face of a server: the same registered methods answer gRPC clients (grpcurl, grpcio,
//! grpc-go, tonic, Envoy…) over HTTP/2 on the server's own port — h2c with prior knowledge on a
//! plain `tcp://` port (told apart from native topspin by its first byte, `P` of
//! `PRI * HTTP/2.0`) and ALPN `h2` on TLS. On by default; [`ServerBuilder::grpc`] turns it off.
//!
//! HTTP/2 is the `h2` crate's. A call is dispatched to the very handler a native call gets
//! (`server::handler`, behind the method's interceptors): the handler sees the same
//! `Request` — metadata (`-bin` values decoded from base64), deadline (`grpc-timeout`),
//! cancellation (the client's `RST_STREAM`), peer, TLS peer — and only
//! [`Request::protocol`](crate::Request::protocol) says [`Protocol::Grpc`](crate::Protocol).
//! Its `Status` becomes `grpc-status`, `grpc-message` (percent-encoded) and
//! `grpc-status-details-bin` trailers; an error before any response is a trailers-only
//! response. Messages are gRPC's length-prefixed frames, compressed per `grpc-encoding`
//! (`gzip`, `zstd`; `grpc-accept-encoding` lists them) with the server's
//! [`Config::compression`](crate::Config::compression).
//!
//! Bounds a peer cannot raise (`server.rs` sets them on the HTTP/2 connection):
//!
//! | bound | value |
//! |---|---|
//! | streams open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`) | `Config::max_concurrent_calls` (1024) |
//! | header list (`SETTINGS_MAX_HEADER_LIST_SIZE`, h2's accounting: name + value + 32 per field) | `Config::max_metadata_size` + 4 KiB (20 KiB) |
//! | stream window (`SETTINGS_INITIAL_WINDOW_SIZE`) | `Config::initial_call_window` (1 MiB); a request stream's data is given back as the handler consumes it, and withheld while a message being gathered finds no room in `Config::memory_budget` |
//! | connection window | 2 × the stream window (2 MiB) |
//! | frame size (`SETTINGS_MAX_FRAME_SIZE`) | 16 KiB (HTTP/2's default) |
//! | one request message | `Config::max_message_size` (64 MiB), compressed or not; more is `RESOURCE_EXHAUSTED`; its buffer grows only by what the memory budget grants, and decompressed bytes stay charged while the handler holds them; one such buffer per connection is kept for the next split message (`framing::Spare`), charged to the budget while kept |
//! | response bytes in h2 per stream | h2's send buffer (400 KiB): a message goes to h2 only within the stream's send capacity; the rest waits in the call (one message per call) |
//! | response bytes per connection | `Config::max_send_buffer` (4 MiB): past it new calls wait to start (shown as unsent bytes in the gauges) |
//! | streams reset by the client and not yet accepted / reset locally | h2's defaults (20 / 50, "Rapid Reset"), then GOAWAY |
//! | the HTTP/2 handshake, the client's SETTINGS included | `Config::handshake_timeout` (10 s) |
//! | an HTTP/2 frame that stops arriving | `Config::frame_timeout` (30 s), then the connection is closed |
//! | a connection without calls | `Config::idle_timeout` (1 h), then GOAWAY |
//!
//! A gRPC connection counts in [`Server::gauges`](crate::Server::gauges) (connections, open
//! calls) like a native one. At `Config::max_connection_age` (±10%) it is sent a graceful
//! GOAWAY and its calls get `max_connection_age_grace`; with `Config::keepalive_interval` the
//! server PINGs a client it has received nothing from for that long and closes the connection
//! at once when nothing (the PONG or anything else) comes within `keepalive_timeout` — the
//! native connection's rule, from the same policy (`connection::liveness`, through `live.rs`).

//!
//! `wire.rs` (headers, metadata, status, `grpc-timeout`) and `framing.rs` (the message codec:
//! one framer and one deframer), gRPC's wire details free of I/O, are built always: the client's gRPC
//! mode (`client/grpc.rs`) uses them too, and so are `watch.rs` (the frame boundaries the
//! timers read) and `live.rs` (the timers of an HTTP/2 loop, keep-alive PINGs included). Only
//! `server.rs` (a connection) and `call.rs` (a call) are behind the feature `grpc`.

#[cfg(feature = "grpc")]
mod call;
mod framing;
pub(crate) mod live;
#[cfg(feature = "grpc")]
mod request;
#[cfg(feature = "grpc")]
pub(crate) mod server;
pub(crate) mod watch;
pub(crate) mod wire;

#[cfg(feature = "grpc")]
pub(crate) use server::serve;

/// Room in an HTTP/2 stream window beyond `Config::initial_call_window`, for the 5-byte
/// prefixes HTTP/2 counts with the messages: one frame's worth.
const PREFIX_ROOM: u32 = 16 * 1024;

/// The HTTP/2 stream window of a gRPC call, on the face and in the client mode:
/// `Config::initial_call_window` — what a call may receive ahead of its consumer, counted in
/// message bytes as on the native protocol — plus [`PREFIX_ROOM`] for the messages' 5-byte
/// prefixes, so that a message as large as the call window (a 1 MiB message with the 1 MiB
/// default) arrives whole without waiting a round trip for a WINDOW_UPDATE for its last five
/// bytes. Within what HTTP/2 allows.
pub(crate) fn stream_window(config: &crate::Config) -> u32 {
    config
        .initial_call_window()
        .saturating_add(PREFIX_ROOM)
        .clamp(65_535, topspin_proto::MAX_WINDOW)
}

#[cfg(feature = "grpc")]
/// Who is on the other end of the connection.
#[derive(Clone, Debug)]
pub(crate) struct Peer {
    pub(crate) addr: crate::transport::PeerAddr,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<std::sync::Arc<crate::tls::TlsPeer>>,
}

#[cfg(test)]
mod tests {
    /// A message as large as the call window fits in the HTTP/2 window with its prefix; the
    /// window stays within HTTP/2's limits.
    #[test]
    fn the_stream_window_holds_a_call_window_sized_message_with_its_prefix() {
        let config = crate::Config::default();
        let call = config.initial_call_window();
        let w = super::stream_window(&config);
        assert!(w >= call + 5, "{w} < {call} + 5");
        assert!(
            w - call <= 64 * 1024,
            "only a little room beyond the call window"
        );
        let tiny = config.clone().with_initial_call_window(1);
        assert_eq!(
            super::stream_window(&tiny),
            65_535,
            "HTTP/2's initial window at least"
        );
        let huge = config.with_initial_call_window(topspin_proto::MAX_WINDOW);
        assert_eq!(super::stream_window(&huge), topspin_proto::MAX_WINDOW);
    }
}
