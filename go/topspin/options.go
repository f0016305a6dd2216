package topspin

import (
	"crypto/tls"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
)

// Option configures a client or a server.
type Option func(*options)

type options struct {
	settings    wire.Settings
	limits      wire.Limits
	backoffBase time.Duration
	backoffMax  time.Duration
	handshake   time.Duration
	tls         *tls.Config
	compress    string
	kaInterval  time.Duration
	kaTimeout   time.Duration

	budget       *wire.MemoryBudget // nil: wire.ProcessMemoryBudget()
	maxSend      int
	frameTimeout time.Duration
	writeTimeout time.Duration
	idleTimeout  time.Duration
	maxConns     int
	unixMode     uint32
	grpcOff      bool // no gRPC face (grpcface.go)
	memLimitOff  bool // no Go memory limit tied to the budget (memlimit.go)

	icpt interceptorOptions // (interceptor.go)
}

// Defaults of the bounds (the Rust runtime's, topspin::Config; the idle timeout is on here).
const (
	DefaultMaxSendBuffer    = 4 << 20
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultFrameTimeout     = 30 * time.Second
	DefaultWriteTimeout     = 60 * time.Second
	DefaultIdleTimeout      = time.Hour
	DefaultKeepaliveTimeout = 20 * time.Second
	DefaultMaxConnections   = 10_000
	DefaultUnixSocketMode   = 0o660
)

func defaultOptions() options {
	return options{settings: wire.DefaultSettings(), limits: wire.DefaultLimits(),
		backoffBase: 100 * time.Millisecond, backoffMax: 5 * time.Second,
		handshake: DefaultHandshakeTimeout, kaTimeout: DefaultKeepaliveTimeout,
		maxSend: DefaultMaxSendBuffer, frameTimeout: DefaultFrameTimeout, writeTimeout: DefaultWriteTimeout,
		idleTimeout: DefaultIdleTimeout, maxConns: DefaultMaxConnections, unixMode: DefaultUnixSocketMode}
}

func (o *options) memoryBudget() *wire.MemoryBudget {
	if o.budget != nil {
		return o.budget
	}
	return wire.ProcessMemoryBudget()
}

// WithMemoryBudget sets the budget of bytes reserved for messages being received (frames
// larger than a read, split messages being reassembled), shared by every connection given
// it; by default wire.ProcessMemoryBudget() (1 GiB, the whole process). A connection never
// reserves what a peer merely announced beyond it: past it buffers grow only as bytes
// arrive, a server refuses new calls with RESOURCE_EXHAUSTED and chunk credit is withheld
// until there is room again (protocol.md §9).
func WithMemoryBudget(b *wire.MemoryBudget) Option { return func(o *options) { o.budget = b } }

// WithMaxSendBuffer bounds the bytes a connection has produced and not yet written
// (default 4 MiB; one larger message still goes, as a unit). Past it senders wait; a server
// also stops reading from that connection and starts none of its new calls' handlers until
// the peer reads. This bounds what a peer that never reads can make this side hold.
func WithMaxSendBuffer(n int) Option { return func(o *options) { o.maxSend = max(n, 1) } }

// WithFrameTimeout bounds how long a frame that started to arrive may take to complete
// (default 30 s; 0: no bound): a peer that sends half a frame and stalls is disconnected
// with ERROR TIMEOUT.
func WithFrameTimeout(d time.Duration) Option { return func(o *options) { o.frameTimeout = d } }

// WithWriteTimeout closes a connection whose peer takes none of the bytes waiting for it
// for d (default DefaultWriteTimeout, 60 s, as the Rust runtime's write_timeout; 0: never):
// a peer that stopped reading (a hung process, or one holding the send buffer and its
// calls), which keep-alive, off by default, would not be on to tell. The connection's calls
// end as on any connection loss (a server's handlers see their context done; a client's
// calls fail UNAVAILABLE naming the write timeout). Native connections, server and client.
func WithWriteTimeout(d time.Duration) Option { return func(o *options) { o.writeTimeout = max(d, 0) } }

// WithIdleTimeout makes a server send GOAWAY (NO_ERROR, "idle timeout") and close a
// connection that has had no open call for d (default 1 h; 0: never), counted from the end of
// its last call or its handshake: PINGs and other frames that are not calls do not count.
func WithIdleTimeout(d time.Duration) Option { return func(o *options) { o.idleTimeout = d } }

// WithMaxConnections bounds the connections a server has open at once (default 10,000).
// Past it a new connection is told why and closed: it gets the preface, SETTINGS and, once
// its first call arrives (or after a second), ERROR INTERNAL_ERROR naming
// "max_connections (N) reached", so that call fails UNAVAILABLE with that reason. Keep it
// below the process's file descriptor limit.
func WithMaxConnections(n int) Option { return func(o *options) { o.maxConns = max(n, 0) } }

// WithUnixSocketMode sets the permission bits Listen gives a Unix socket file (default
// 0o660: its owner and group may connect).
func WithUnixSocketMode(mode uint32) Option { return func(o *options) { o.unixMode = mode } }

// WithSettings sets the receive limits announced to the peer (protocol.md §4).
func WithSettings(s wire.Settings) Option { return func(o *options) { o.settings = s } }

// WithMaxMessageSize sets the largest message this side accepts.
func WithMaxMessageSize(n uint32) Option { return func(o *options) { o.settings.MaxMessageSize = n } }

// WithMaxConcurrentCalls sets how many calls a client may have open at once (server).
func WithMaxConcurrentCalls(n uint32) Option {
	return func(o *options) { o.settings.MaxConcurrentCalls = n }
}

// WithLimits sets the local flood budgets (protocol.md §9).
func WithLimits(l wire.Limits) Option { return func(o *options) { o.limits = l } }

// WithBackoff sets the reconnect backoff of a client: base doubles per failed attempt up to max.
func WithBackoff(base, max time.Duration) Option {
	return func(o *options) { o.backoffBase, o.backoffMax = base, max }
}

// WithHandshakeTimeout bounds how long a server waits for a client's preface and SETTINGS
// (default 10 s; 0: no bound); then it closes the connection with ERROR TIMEOUT.
func WithHandshakeTimeout(d time.Duration) Option { return func(o *options) { o.handshake = d } }

// WithTLS sets the TLS configuration (protocol.md §14.1). A client uses it for tls://
// targets (default: the system roots, the target's host as server name); Listen needs it
// (with a certificate) for a tls:// address. ALPN "topspin/1" is always set: a client offers
// it, a server selects it and refuses a client that offers ALPN without it.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithCompression sets the message compression ("zstd" or "gzip", protocol.md §15). On a
// client, every call compresses its messages with it (CallCompression overrides it per call)
// and accepts compressed responses. On a server, responses are compressed with it for the
// clients that accept it. Requests are decoded whatever it is.
func WithCompression(name string) Option { return func(o *options) { o.compress = name } }

// MinKeepaliveInterval is the shortest keep-alive interval: the default PING rate limit of
// a topspin server is one per 100 ms after a burst (protocol.md §9), so a client never
// pings more often than this.
const MinKeepaliveInterval = 100 * time.Millisecond

// WithKeepalive makes a side send a PING when it has received nothing for interval
// (raised to MinKeepaliveInterval), and close the connection when nothing (no answer, no
// other frame) arrives within timeout after it (timeout 0: 20 s). On a client, calls on it
// then fail with UNAVAILABLE and the next call reconnects; a server closes it with ERROR
// TIMEOUT (its handlers see UNAVAILABLE). Off by default.
func WithKeepalive(interval, timeout time.Duration) Option {
	return func(o *options) {
		if interval > 0 {
			interval = max(interval, MinKeepaliveInterval)
		}
		if timeout <= 0 {
			timeout = DefaultKeepaliveTimeout
		}
		o.kaInterval, o.kaTimeout = interval, timeout
	}
}

// WithGRPC turns a server's gRPC face on (the default) or off. With it on, the server
// answers gRPC clients (HTTP/2) on the same port as native ones, with the same handlers:
// a plain connection whose first byte is 'P' (the HTTP/2 preface, h2c with prior
// knowledge) and a TLS connection that selected ALPN "h2" are gRPC. Given to Listen,
// WithGRPC(false) keeps a tls:// listener from offering "h2".
func WithGRPC(on bool) Option { return func(o *options) { o.grpcOff = !on } }
