package topspin

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
)

// ClientConn is a client of one server address. It multiplexes every call over one
// connection, reconnecting with backoff when it is lost. Safe for concurrent use.
type ClientConn struct {
	network, addr string
	opts          options

	mu       sync.Mutex
	cur      *conn
	dialing  chan struct{}
	failures int
	retryAt  time.Time
	lastErr  error
	closed   bool

	unaryChain  UnaryClientInterceptor  // the interceptors as one (nil: none)
	streamChain StreamClientInterceptor // (client_interceptor.go)
}

// Dial connects to target ("tcp://host:port", "unix:///path" or "host:port") and completes
// the handshake; ctx bounds the first connection. Later connections are made on demand.
func Dial(ctx context.Context, target string, opts ...Option) (*ClientConn, error) {
	network, addr, err := ParseTarget(target)
	if err != nil {
		return nil, err
	}
	cc := &ClientConn{network: network, addr: addr, opts: defaultOptions()}
	for _, o := range opts {
		o(&cc.opts)
	}
	cc.unaryChain, cc.streamChain = cc.opts.icpt.clientUnaryChain(), cc.opts.icpt.clientStreamChain()
	if e := cc.opts.compress; e != "" && !wire.SupportedEncoding(e) {
		return nil, fmt.Errorf("topspin: unknown compression %q (zstd, gzip)", e)
	}
	if _, err := cc.conn(ctx); err != nil {
		return nil, err
	}
	return cc, nil
}

// Close closes the connection; calls in progress fail with UNAVAILABLE.
func (cc *ClientConn) Close() error {
	cc.mu.Lock()
	cc.closed = true
	c := cc.cur
	cc.cur = nil
	cc.mu.Unlock()
	if c != nil {
		c.shutdown(errors.New("client closed"))
	}
	return nil
}

func (c *conn) usable() bool {
	select {
	case <-c.done:
		return false
	default:
	}
	c.mu.Lock()
	ok := !c.eng.Closed() && !c.eng.GoingAway()
	c.mu.Unlock()
	return ok
}

// conn returns a live connection, dialing (after the backoff) when there is none.
func (cc *ClientConn) conn(ctx context.Context) (*conn, error) {
	for {
		cc.mu.Lock()
		if cc.closed {
			cc.mu.Unlock()
			return nil, &Status{Code: Unavailable, Message: "client is closed"}
		}
		if cc.cur != nil && cc.cur.usable() {
			c := cc.cur
			cc.mu.Unlock()
			return c, nil
		}
		if ch := cc.dialing; ch != nil {
			cc.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, StatusOf(ctx.Err())
			}
		}
		ch := make(chan struct{}) // a signal: closed, never sent on, so it holds nothing
		cc.dialing = ch
		wait := time.Until(cc.retryAt)
		cc.mu.Unlock()
		c, err := cc.dialOnce(ctx, wait)
		cc.mu.Lock()
		cc.dialing = nil
		close(ch)
		if err != nil {
			if ctx.Err() == nil {
				cc.failures++
				d := min(cc.opts.backoffMax, cc.opts.backoffBase<<min(cc.failures-1, 20))
				d = d/2 + rand.N(d/2+1)
				cc.retryAt = time.Now().Add(d)
			}
			cc.lastErr = err
			cc.mu.Unlock()
			if ctx.Err() != nil {
				return nil, StatusOf(ctx.Err())
			}
			return nil, &Status{Code: Unavailable, Message: "connect to " + cc.addr + ": " + err.Error()}
		}
		cc.failures = 0
		cc.cur = c
		cc.mu.Unlock()
		return c, nil
	}
}

func (cc *ClientConn) dialOnce(ctx context.Context, wait time.Duration) (*conn, error) {
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	var d net.Dialer
	network := cc.network
	if network == "tls" {
		network = "tcp"
	}
	nc, err := d.DialContext(ctx, network, cc.addr)
	if err != nil {
		return nil, err
	}
	if cc.network == "tls" {
		if nc, err = cc.handshakeTLS(ctx, nc); err != nil {
			return nil, err
		}
	}
	c, err := newConn(nc, wire.Client, &cc.opts)
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	c.start()
	select {
	case <-c.established:
		if cc.opts.kaInterval > 0 {
			go c.keepalive(cc.opts.kaInterval, cc.opts.kaTimeout)
		}
		return c, nil
	case <-c.done:
		return nil, c.err
	case <-ctx.Done():
		c.shutdown(ctx.Err())
		return nil, ctx.Err()
	}
}

// handshakeTLS runs the client side of a TLS handshake on nc (protocol.md §14.1): the
// server's chain and name are verified, SNI is sent for a DNS name, ALPN offers topspin/1.
func (cc *ClientConn) handshakeTLS(ctx context.Context, nc net.Conn) (net.Conn, error) {
	cfg := withALPN(cc.opts.tls)
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(cc.addr)
		if err != nil {
			_ = nc.Close()
			return nil, err
		}
		cfg.ServerName = host
	}
	tc := tls.Client(nc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("TLS handshake with %s failed: %w", cc.addr, err)
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != "" && p != ALPN {
		_ = tc.Close()
		return nil, fmt.Errorf("TLS handshake with %s: server selected ALPN %q, not %q", cc.addr, p, ALPN)
	}
	return tc, nil
}

// keepalive sends a PING once nothing arrived for interval, and closes the connection when
// nothing arrives within timeout of it (protocol.md §5.9, §9). At most one PING per
// interval, and only after an interval of silence.
func (c *conn) keepalive(interval, timeout time.Duration) {
	t := time.NewTimer(interval)
	defer t.Stop()
	var pingAt time.Time // when the unanswered PING went (zero: none)
	for {
		select {
		case <-t.C:
		case <-c.done:
			return
		}
		now := time.Now()
		c.mu.Lock()
		last := c.lastRecv
		if !pingAt.IsZero() && last.After(pingAt) {
			pingAt = time.Time{} // something arrived: the peer is alive
		}
		var wait time.Duration
		switch {
		case !pingAt.IsZero():
			if now.Sub(pingAt) >= timeout {
				c.mu.Unlock()
				c.shutdown(fmt.Errorf("keepalive: nothing received within %v of a PING", timeout))
				return
			}
			wait = min(interval, timeout-now.Sub(pingAt)) // look again for an answer
		case now.Sub(last) < interval:
			wait = interval - now.Sub(last)
		default:
			var data [8]byte
			binary.BigEndian.PutUint64(data[:], uint64(now.UnixNano()))
			if err := c.eng.Ping(data); err != nil {
				c.mu.Unlock()
				return
			}
			pingAt = now
			wait = min(interval, timeout)
		}
		c.mu.Unlock()
		c.signal()
		t.Reset(wait)
	}
}

func (c *conn) clientEvent(ev *wire.Event) {
	s := c.streams[ev.CallID]
	switch ev.Type {
	case wire.EvHeaders:
		if s != nil {
			s.headers, s.gotHeaders = ev.Metadata, true
			if e, ok := ev.Metadata.Get(wire.KeyEncoding); ok && e != wire.EncodingIdentity {
				s.enc = e
			}
			s.notifyRead()
		}
	case wire.EvMessage:
		if s != nil {
			s.push(ev.Message, ev.Cost)
		}
	case wire.EvEnded:
		if s != nil {
			s.setEnd(ev.Code, ev.Text, ev.Metadata)
		}
		c.callEnded(ev.CallID)
	}
}
