package topspin

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/protobuf/proto"
)

// Codec ids of CALL (§5.2).
const (
	CodecProto uint8 = 0
	CodecRaw   uint8 = 1
	CodecJSON  uint8 = 2
)

// ALPN is the TLS application protocol name of topspin v1 (protocol.md §14.1).
const ALPN = "topspin/1"

// ALPNGRPC is the TLS application protocol of the gRPC face (HTTP/2), which a tls:// listener
// offers after ALPN unless given WithGRPC(false).
const ALPNGRPC = "h2"

// withALPN returns a copy of cfg (or of an empty config) offering only topspin/1.
func withALPN(cfg *tls.Config) *tls.Config {
	if cfg == nil {
		cfg = &tls.Config{}
	}
	cfg = cfg.Clone()
	cfg.NextProtos = []string{ALPN}
	if cfg.MinVersion < tls.VersionTLS12 {
		cfg.MinVersion = tls.VersionTLS12
	}
	return cfg
}

// ParseTarget splits "tcp://host:port", "tls://host:port", "unix:///path" or "host:port" into
// network and address (the network of tls:// is "tls": TCP with TLS on it).
func ParseTarget(target string) (network, addr string, err error) {
	switch {
	case strings.HasPrefix(target, "tls://"):
		return "tls", strings.TrimPrefix(target, "tls://"), nil
	case strings.HasPrefix(target, "tcp://"):
		return "tcp", strings.TrimPrefix(target, "tcp://"), nil
	case strings.HasPrefix(target, "unix://"):
		return "unix", strings.TrimPrefix(target, "unix://"), nil
	case strings.HasPrefix(target, "unix:@"):
		// A Linux abstract socket, as the other implementations write it (Go's net
		// package names it with a leading '@').
		return "unix", strings.TrimPrefix(target, "unix:"), nil
	case strings.Contains(target, "://"):
		return "", "", fmt.Errorf("topspin: unsupported scheme in %q (tcp://, tls:// or unix://)", target)
	}
	return "tcp", target, nil
}

// Listen opens a listener for "tcp://host:port", "unix:///path" or "tls://host:port"; the
// last needs WithTLS with a server certificate. Its connections select ALPN topspin/1, or
// "h2" (the gRPC face) for a client that offers only that, and refuse a client that offers
// ALPN without either (TLS alert no_application_protocol; without "h2" under WithGRPC(false)).
//
// A Unix socket file is bound as the Rust server binds it: under a lock on "<path>.lock"
// (so that servers starting together cannot race), a stale socket file (nothing answers on
// it) is replaced, a live server's never (an *AddrInUseError); the file gets
// WithUnixSocketMode's bits (default 0o660) and is removed when the listener closes, if it
// is still this listener's. "unix:@name" is a Linux abstract socket: no file.
func Listen(target string, opts ...Option) (net.Listener, error) {
	network, addr, err := ParseTarget(target)
	if err != nil {
		return nil, err
	}
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	switch network {
	case "unix":
		return listenUnix(addr, o.unixMode)
	case "tcp":
		return net.Listen(network, addr)
	}
	if o.tls == nil || (len(o.tls.Certificates) == 0 && o.tls.GetCertificate == nil && o.tls.GetConfigForClient == nil) {
		return nil, fmt.Errorf("topspin: %s needs WithTLS with a server certificate", target)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	cfg := withALPN(o.tls)
	if !o.grpcOff {
		cfg.NextProtos = append(cfg.NextProtos, ALPNGRPC) // topspin/1 first: it wins when offered
	}
	return tls.NewListener(l, cfg), nil
}

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

// CallOption configures one call.
type CallOption func(*callOptions)

type callOptions struct {
	codec    uint8
	header   *Metadata
	trailer  *Metadata
	compress string
}

// CallCompression sets the message compression of one call ("zstd", "gzip", or "identity"
// for none), overriding the connection's WithCompression (protocol.md §15).
func CallCompression(name string) CallOption { return func(o *callOptions) { o.compress = name } }

// WithCodec sets the codec byte of the call (CodecProto by default).
func WithCodec(id uint8) CallOption { return func(o *callOptions) { o.codec = id } }

// Header stores the response headers of the call in md.
func Header(md *Metadata) CallOption { return func(o *callOptions) { o.header = md } }

// Trailer stores the trailers of the call in md.
func Trailer(md *Metadata) CallOption { return func(o *callOptions) { o.trailer = md } }

// ClientStream is one call seen from the client: Send, CloseSend, Recv.
type ClientStream struct {
	w       ClientStreamer // a stream interceptor's wrapper: every method goes to it
	s       stream
	ctx     context.Context
	stop    func() bool
	opts    callOptions
	pending []byte // a first message that waits for send credit
	pendEnd bool
	enc     string // the encoding of the request messages ("" for none)
	limit   uint32 // MAX_MESSAGE_SIZE of decompressed responses
}

// startCall starts a call, waiting for a connection and for room under the server's
// MAX_CONCURRENT_CALLS, within ctx's deadline. With first != nil it sends that message
// in the same write (last: it is the only one).
func (cc *ClientConn) startCall(ctx context.Context, cs *ClientStream, method string, first []byte, last bool) error {
	md := OutgoingMetadata(ctx)
	enc := cs.opts.compress
	if enc == "" {
		enc = cc.opts.compress
	}
	if enc == wire.EncodingIdentity {
		enc = ""
	}
	if enc != "" {
		if !wire.SupportedEncoding(enc) {
			return &Status{Code: InvalidArgument, Message: fmt.Sprintf("unknown compression %q (zstd, gzip)", enc)}
		}
		md = append(md[:len(md):len(md)], wire.MetadataEntry{Key: wire.KeyEncoding, Value: enc},
			wire.MetadataEntry{Key: wire.KeyAcceptEncoding, Value: wire.AcceptedEncodings})
		if first != nil {
			var err error
			if first, err = wire.Compress(enc, first); err != nil {
				return &Status{Code: Internal, Message: "compress: " + err.Error()}
			}
		}
	}
	cs.enc, cs.limit = enc, cc.opts.settings.MaxMessageSize
	lost := 0 // connections that closed under this call before it could start
	for {
		var timeoutUs uint64
		if dl, ok := ctx.Deadline(); ok {
			left := time.Until(dl)
			if left <= 0 {
				return &Status{Code: DeadlineExceeded, Message: "deadline passed before the call was sent"}
			}
			timeoutUs = uint64((left + time.Microsecond - 1) / time.Microsecond)
		}
		c, err := cc.conn(ctx)
		if err != nil {
			return err
		}
		c.mu.Lock()
		if c.fullLocked() && !c.waitRoom(ctx.Done()) { // the server does not read fast enough
			c.mu.Unlock()
			if ctx.Err() != nil {
				return StatusOf(ctx.Err())
			}
			continue
		}
		id, err := c.eng.StartCall(method, cs.opts.codec, timeoutUs, md)
		switch {
		case err == nil:
			cs.s.c, cs.s.id = c, id
			c.streams[id] = &cs.s
			if first != nil {
				err := c.eng.SendMessage(id, first, last)
				switch {
				case errors.Is(err, wire.ErrBlocked):
					cs.pending, cs.pendEnd = first, last
				case err != nil:
					_ = c.eng.Cancel(id, Canceled)
					c.callEnded(id)
					c.flushLocked()
					return StatusOf(err)
				}
			}
			c.sendLocked()
			return nil
		case errors.Is(err, wire.ErrTooManyCalls):
			slot := c.slot
			c.slotWaiters++
			c.mu.Unlock()
			select {
			case <-slot:
			case <-c.done:
			case <-ctx.Done():
			}
			c.mu.Lock()
			c.slotWaiters--
			c.mu.Unlock()
			if ctx.Err() != nil {
				return StatusOf(ctx.Err())
			}
		case errors.Is(err, wire.ErrConnClosed):
			c.mu.Unlock()
			if lost++; lost >= 3 {
				return &Status{Code: Unavailable, Message: "connection to " + cc.addr + " closed before the call could start"}
			}
		default:
			var ce *wire.CallError
			if errors.As(err, &ce) && ce.Code == Unavailable && c.eng.GoingAway() && !c.eng.Closed() {
				c.mu.Unlock()
				continue // a new connection is made
			}
			c.mu.Unlock()
			return StatusOf(err)
		}
	}
}

// NewStream starts a call of any kind; the caller sends with Send / SendMsg, ends its side
// with CloseSend and reads with Recv / RecvMsg until io.EOF (OK) or a *Status error. The
// client's stream interceptors open it (and may wrap it).
func (cc *ClientConn) NewStream(ctx context.Context, method string, opts ...CallOption) (*ClientStream, error) {
	return cc.openStream(ctx, &StreamDesc{ClientStreams: true, ServerStreams: true}, method, opts...)
}

// newStream is NewStream without the interceptors.
func (cc *ClientConn) newStream(ctx context.Context, method string, opts ...CallOption) (*ClientStream, error) {
	cs := &ClientStream{ctx: ctx}
	cs.s.init(make(chan struct{}, 1))
	for _, o := range opts {
		o(&cs.opts)
	}
	if err := cc.startCall(ctx, cs, method, nil, false); err != nil {
		return nil, err
	}
	cs.stop = context.AfterFunc(ctx, func() { cs.cancel(ctx.Err()) })
	return cs, nil
}

// cancel sends CANCEL (DEADLINE_EXCEEDED or CANCELLED) if the call is still open.
func (cs *ClientStream) cancel(cause error) {
	c := cs.s.c
	c.mu.Lock()
	if cs.s.ended {
		c.mu.Unlock()
		return
	}
	st := StatusOf(cause)
	_ = c.eng.Cancel(cs.s.id, st.Code)
	cs.s.setEnd(st.Code, st.Message, nil)
	c.callEnded(cs.s.id)
	c.flushLocked()
}

// CancelCall abandons the call: CANCEL CANCELLED goes to the server.
func (cs *ClientStream) CancelCall() {
	if cs.w != nil {
		cs.w.CancelCall()
		return
	}
	cs.cancel(context.Canceled)
}

func (cs *ClientStream) send(msg []byte, last bool) error {
	c := cs.s.c
	if cs.enc != "" {
		var err error
		if msg, err = wire.Compress(cs.enc, msg); err != nil {
			return &Status{Code: Internal, Message: "compress: " + err.Error()}
		}
	}
	for {
		c.mu.Lock()
		if cs.s.ended {
			c.mu.Unlock()
			return io.EOF
		}
		if c.fullLocked() && !c.waitRoom(cs.ctx.Done()) {
			c.mu.Unlock()
			if err := cs.ctx.Err(); err != nil {
				cs.cancel(err)
				return StatusOf(err)
			}
			continue // the connection ended: the call is over
		}
		if cs.pending != nil {
			if err := c.eng.SendMessage(cs.s.id, cs.pending, cs.pendEnd); err == nil {
				cs.pending = nil
			}
		}
		var err error
		if cs.pending == nil {
			err = c.eng.SendMessage(cs.s.id, msg, last)
			if err == nil {
				c.sendLocked()
				return nil
			}
		} else {
			err = wire.ErrBlocked
		}
		if !errors.Is(err, wire.ErrBlocked) {
			c.mu.Unlock()
			if errors.Is(err, wire.ErrCallClosed) || errors.Is(err, wire.ErrConnClosed) {
				return io.EOF
			}
			return StatusOf(err)
		}
		wn := cs.s.writeNote()
		c.mu.Unlock()
		select {
		case <-wn:
		case <-cs.ctx.Done():
			cs.cancel(cs.ctx.Err())
			return StatusOf(cs.ctx.Err())
		}
	}
}

// flushPending sends a first message that waited for credit (InvokeRaw).
func (cs *ClientStream) flushPending() error {
	if cs.pending == nil {
		return nil
	}
	c := cs.s.c
	for {
		c.mu.Lock()
		if cs.s.ended {
			c.mu.Unlock()
			return nil
		}
		err := c.eng.SendMessage(cs.s.id, cs.pending, cs.pendEnd)
		if err == nil {
			cs.pending = nil
			c.flushLocked()
			return nil
		}
		if !errors.Is(err, wire.ErrBlocked) {
			c.mu.Unlock()
			return StatusOf(err)
		}
		wn := cs.s.writeNote()
		c.mu.Unlock()
		select {
		case <-wn:
		case <-cs.ctx.Done():
			cs.cancel(cs.ctx.Err())
			return StatusOf(cs.ctx.Err())
		}
	}
}

// Send sends one message. msg must not be changed afterwards, even once the call is over
// (a large one is written from the caller's memory, as with grpc-go's SendMsg). It
// returns io.EOF when the call is over: Recv then tells its status.
func (cs *ClientStream) Send(msg []byte) error {
	if cs.w != nil {
		return cs.w.Send(msg)
	}
	return cs.send(msg, false)
}

// SendMsg marshals m with protobuf and sends it.
func (cs *ClientStream) SendMsg(m proto.Message) error {
	if cs.w != nil {
		return cs.w.SendMsg(m)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return &Status{Code: Internal, Message: "marshal: " + err.Error()}
	}
	return cs.send(b, false)
}

// CloseSend says the client sends no more messages.
func (cs *ClientStream) CloseSend() error {
	if cs.w != nil {
		return cs.w.CloseSend()
	}
	c := cs.s.c
	c.mu.Lock()
	err := c.eng.HalfClose(cs.s.id)
	c.flushLocked()
	if err != nil && !errors.Is(err, wire.ErrCallClosed) && !errors.Is(err, wire.ErrConnClosed) {
		return StatusOf(err)
	}
	return nil
}

// Recv returns the next message; io.EOF when the call ended with OK, else a *Status.
func (cs *ClientStream) Recv() ([]byte, error) {
	if cs.w != nil {
		return cs.w.Recv()
	}
	c := cs.s.c
	for {
		c.mu.Lock()
		if msg, ok := cs.s.pop(); ok {
			enc := cs.s.enc
			if c.eng.HasOutput() {
				c.flushLocked()
			} else {
				c.mu.Unlock()
			}
			if enc != "" {
				out, err := wire.Decompress(enc, msg, cs.limit)
				if err != nil {
					st := StatusOf(err)
					cs.cancel(st)
					cs.finish()
					return nil, st
				}
				msg = out
			}
			return msg, nil
		}
		if cs.s.ended {
			code := cs.s.code
			var err error
			if code != OK {
				err = cs.s.status()
			}
			c.mu.Unlock()
			cs.finish()
			if code == OK {
				return nil, io.EOF
			}
			return nil, err
		}
		c.mu.Unlock()
		select {
		case <-cs.s.rnote:
		case <-cs.ctx.Done():
			cs.cancel(cs.ctx.Err())
		}
	}
}

func (cs *ClientStream) finish() {
	if cs.stop != nil {
		cs.stop()
	}
	if cs.opts.header != nil {
		*cs.opts.header = cs.s.headers
	}
	if cs.opts.trailer != nil {
		*cs.opts.trailer = cs.s.trailers
	}
}

// RecvMsg receives the next message into m (protobuf).
func (cs *ClientStream) RecvMsg(m proto.Message) error {
	if cs.w != nil {
		return cs.w.RecvMsg(m)
	}
	b, err := cs.Recv()
	if err != nil {
		return err
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return &Status{Code: Internal, Message: "unmarshal: " + err.Error()}
	}
	return nil
}

// Header waits for the response headers (empty if the server sent none).
func (cs *ClientStream) Header() (Metadata, error) {
	if cs.w != nil {
		return cs.w.Header()
	}
	c := cs.s.c
	for {
		c.mu.Lock()
		if cs.s.gotHeaders || cs.s.head < len(cs.s.recvq) || cs.s.ended {
			md := cs.s.headers
			c.mu.Unlock()
			return md, nil
		}
		c.mu.Unlock()
		select {
		case <-cs.s.rnote:
			// The note may be a stale one (a message Recv took without waiting): check
			// again, and hand it on to Recv only if something did arrive.
			c.mu.Lock()
			if cs.s.gotHeaders || cs.s.head < len(cs.s.recvq) || cs.s.ended {
				cs.s.notifyRead()
			}
			c.mu.Unlock()
		case <-cs.ctx.Done():
			return nil, StatusOf(cs.ctx.Err())
		}
	}
}

// Trailer is the trailers of the call, once Recv returned io.EOF or a status.
func (cs *ClientStream) Trailer() Metadata {
	if cs.w != nil {
		return cs.w.Trailer()
	}
	c := cs.s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	return cs.s.trailers
}

var unaryPool = sync.Pool{New: func() any {
	cs := new(ClientStream)
	cs.s.init(make(chan struct{}, 1))
	return cs
}}

// InvokeRaw makes a unary call with an encoded request and returns the encoded response.
// A large req is written from the caller's memory: do not change it afterwards (as with
// grpc-go's SendMsg); a call that ended early (cancelled, deadline) may still be writing
// it. Invoke and the generated clients marshal into a fresh buffer and have no such rule.
// The client's unary interceptors see req as []byte and the reply as *[]byte.
func (cc *ClientConn) InvokeRaw(ctx context.Context, method string, req []byte, opts ...CallOption) ([]byte, error) {
	if cc.unaryChain != nil {
		var out []byte
		err := cc.unaryChain(ctx, method, req, &out, cc, invokeAny, opts...)
		return out, err
	}
	return cc.invokeRaw(ctx, method, req, opts...)
}

// invokeRaw is InvokeRaw without the interceptors.
func (cc *ClientConn) invokeRaw(ctx context.Context, method string, req []byte, opts ...CallOption) ([]byte, error) {
	cs := unaryPool.Get().(*ClientStream)
	cs.ctx = ctx
	for _, o := range opts {
		o(&cs.opts)
	}
	resp, err := cc.invoke(cs, method, req)
	if unprocessed(err) {
		// The server's GOAWAY says it never saw the call (a connection going idle or away
		// as the call left): sent once more, on a new connection, as grpc-go does.
		cs.reset()
		cs.ctx = ctx
		for _, o := range opts {
			o(&cs.opts)
		}
		resp, err = cc.invoke(cs, method, req)
	}
	// The call is over and forgotten by its connection: the stream can serve again.
	cs.reset()
	unaryPool.Put(cs)
	return resp, err
}

// unprocessed reports whether err is the end of a call the server never processed.
func unprocessed(err error) bool {
	st, ok := err.(*Status)
	return ok && st.Code == Unavailable && st.Message == wire.UnprocessedReason
}

// reset makes a finished pooled stream ready for another call.
func (cs *ClientStream) reset() {
	rnote := cs.s.rnote
	select {
	case <-rnote:
	default:
	}
	*cs = ClientStream{}
	cs.s.init(rnote)
}

func (cc *ClientConn) invoke(cs *ClientStream, method string, req []byte) ([]byte, error) {
	if req == nil {
		req = []byte{}
	}
	if err := cc.startCall(cs.ctx, cs, method, req, true); err != nil {
		return nil, err
	}
	if err := cs.flushPending(); err != nil {
		cs.cancel(err)
		return nil, err
	}
	resp, err := cs.Recv()
	if err != nil {
		if err == io.EOF {
			return nil, &Status{Code: Internal, Message: "unary call ended without a response"}
		}
		return nil, err
	}
	// The END follows; a unary call has exactly one response.
	if _, err := cs.Recv(); err != io.EOF {
		if err == nil {
			cs.cancel(errors.New("more than one response"))
			return nil, &Status{Code: Internal, Message: "unary call answered with more than one message"}
		}
		return nil, err
	}
	return resp, nil
}

// Invoke makes a unary call with protobuf messages (through the client's unary
// interceptors, which see req and resp).
func (cc *ClientConn) Invoke(ctx context.Context, method string, req, resp proto.Message, opts ...CallOption) error {
	if cc.unaryChain != nil {
		return cc.unaryChain(ctx, method, req, resp, cc, invokeAny, opts...)
	}
	return cc.invokeProto(ctx, method, req, resp, opts...)
}

// invokeProto is Invoke without the interceptors.
func (cc *ClientConn) invokeProto(ctx context.Context, method string, req, resp proto.Message, opts ...CallOption) error {
	b, err := proto.Marshal(req)
	if err != nil {
		return &Status{Code: Internal, Message: "marshal: " + err.Error()}
	}
	out, err := cc.invokeRaw(ctx, method, b, opts...)
	if err != nil {
		return err
	}
	if err := proto.Unmarshal(out, resp); err != nil {
		return &Status{Code: Internal, Message: "unmarshal: " + err.Error()}
	}
	return nil
}
