package topspin

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Handler serves one call. It returns nil for OK or an error (a *Status keeps its code;
// any other error is UNKNOWN).
type Handler func(ss *ServerStream) error

type handlerEntry struct {
	codecs []uint8
	h      Handler
	kind   handlerKind
}

// Server serves calls on any number of listeners.
type Server struct {
	opts     options
	handlers map[string]handlerEntry

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	work      chan job
	conns     map[*conn]struct{}
	refusing  int // connections over max_connections being told why (at most maxRefusals)
	stopping  bool
	connWG    sync.WaitGroup

	services  map[string]protoreflect.ServiceDescriptor // described services (RegisterService)
	grpcSvcs  []grpcService                             // served on the gRPC face only
	face      *grpcFace                                 // the gRPC face, once serving (nil when off)
	faceOnce  sync.Once
	grpcConns int          // connections the gRPC face holds
	sniffing  int          // connections whose first byte is awaited
	grpcCalls atomic.Int64 // calls open on the gRPC face
	health    *Health

	unaryChain  UnaryServerInterceptor  // the interceptors as one (nil: none)
	streamChain StreamServerInterceptor // (interceptor.go)
}

// NewServer makes a server; register methods with Handle (or generated Register functions)
// before Serve.
func NewServer(opts ...Option) *Server {
	s := &Server{opts: defaultOptions(), handlers: make(map[string]handlerEntry),
		listeners: make(map[net.Listener]struct{}), conns: make(map[*conn]struct{}),
		work: make(chan job), services: make(map[string]protoreflect.ServiceDescriptor)}
	for _, o := range opts {
		o(&s.opts)
	}
	s.unaryChain, s.streamChain = s.opts.icpt.serverUnaryChain(), s.opts.icpt.serverStreamChain()
	return s
}

// Handle registers h for method ("/package.Service/Method") and the codecs it accepts
// (CodecProto when none is given). A call with another codec ends with UNIMPLEMENTED.
func (s *Server) Handle(method string, h Handler, codecs ...uint8) {
	if len(codecs) == 0 {
		codecs = []uint8{CodecProto}
	}
	s.handlers[method] = handlerEntry{codecs: codecs, h: h, kind: kindOf(h)}
}

// Serve accepts connections on l until it is closed or the server stops.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return errors.New("topspin: server stopped")
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	face := s.startFace()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	var delay time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			stopping := s.stopping
			s.mu.Unlock()
			if stopping || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				delay = min(max(delay*2, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		if tc, ok := nc.(*tls.Conn); ok {
			if s.full() {
				_ = nc.Close() // not worth a TLS handshake to refuse it
				continue
			}
			go s.handshakeTLS(tc)
			continue
		}
		if face == nil {
			s.serveConn(nc, nil, time.Time{})
			continue
		}
		if s.admitSniff() {
			go s.sniff(nc, time.Now())
		} else {
			_ = nc.Close()
		}
	}
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// handshakeTLS completes the server side of a TLS handshake (bounded by the handshake
// timeout) before the connection is served; a failed handshake closes it.
func (s *Server) handshakeTLS(tc *tls.Conn) {
	ctx := context.Background()
	if d := s.opts.handshake; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = tc.Close()
		return
	}
	s.afterTLS(tc)
}

// serveConn serves nc with the native engine; pre are bytes already read from it (the
// sniffed first byte) and acceptedAt when it was accepted (zero: now), from which the
// handshake timeout runs.
func (s *Server) serveConn(nc net.Conn, pre []byte, acceptedAt time.Time) {
	c, err := newConn(nc, wire.Server, &s.opts)
	if err != nil {
		_ = nc.Close()
		return
	}
	c.pre, c.acceptedAt = pre, acceptedAt
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		_ = nc.Close()
		return
	}
	if s.openLocked() >= s.opts.maxConns {
		if s.refusing >= maxRefusals {
			s.mu.Unlock()
			_ = nc.Close()
			return
		}
		s.refusing++
		s.mu.Unlock()
		go s.refuse(nc, pre)
		return
	}
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	s.mu.Unlock()
	c.server = s
	c.onClose = func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.connWG.Done()
	}
	c.start()
}

// GracefulStop stops accepting, sends GOAWAY on every connection, lets open calls finish
// and returns when every connection is closed.
func (s *Server) GracefulStop() {
	if h := s.healthTable(); h != nil {
		h.serverStopping()
	}
	s.mu.Lock()
	s.stopping = true
	for l := range s.listeners {
		_ = l.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	face := s.face
	s.mu.Unlock()
	for _, c := range conns {
		c.mu.Lock()
		if c.eng.Established() {
			_ = c.eng.GoAway(wire.NoError, "server shutting down")
		}
		if c.eng.OpenCalls() == 0 || !c.eng.Established() {
			c.finishing = true
		}
		c.mu.Unlock()
		c.signal()
	}
	if face != nil {
		face.gs.GracefulStop()
	}
	s.connWG.Wait()
}

// Stop closes every listener and connection at once; open calls fail.
func (s *Server) Stop() {
	if h := s.healthTable(); h != nil {
		h.serverStopping()
	}
	s.mu.Lock()
	s.stopping = true
	for l := range s.listeners {
		_ = l.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	face := s.face
	s.mu.Unlock()
	if face != nil {
		face.gs.Stop()
	}
	for _, c := range conns {
		c.shutdown(errors.New("server stopped"))
	}
	s.connWG.Wait()
}

// ServerStream is one call seen from the server. It is also the handler's
// context.Context: done when the client cancels, the deadline passes, the connection is
// lost, the server stops or the handler returns.
type ServerStream struct {
	s       stream
	g       *grpcCall // the call's gRPC face (nil: native)
	srv     *Server
	kind    handlerKind
	wrapped ServerStreamer // a stream interceptor's wrapper (nil: none)
	method  string
	md      Metadata
	header  Metadata
	hdrSet  bool
	trailer Metadata

	respEnc string // the encoding of the responses ("" for none, §15)
	limit   uint32 // MAX_MESSAGE_SIZE of decompressed requests

	deadline time.Time
	hasDL    bool
	timer    *time.Timer
	done     chan struct{} // made on first Done()
	err      error         // the context's error once done
}

var _ context.Context = (*ServerStream)(nil)

// Deadline implements context.Context: the call's deadline, if the client set one.
func (ss *ServerStream) Deadline() (time.Time, bool) { return ss.deadline, ss.hasDL }

// Done implements context.Context.
func (ss *ServerStream) Done() <-chan struct{} {
	if ss.g != nil {
		return ss.g.ctx.Done()
	}
	c := ss.s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	return ss.doneLocked()
}

func (ss *ServerStream) doneLocked() <-chan struct{} {
	if ss.done == nil {
		ss.done = make(chan struct{}) // a signal: closed, never sent on, so it holds nothing
		if ss.err != nil {
			close(ss.done)
		}
	}
	return ss.done
}

// Err implements context.Context.
func (ss *ServerStream) Err() error {
	if ss.g != nil {
		return ss.g.ctx.Err()
	}
	c := ss.s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	return ss.err
}

// Value implements context.Context; ServerStreamFrom uses it.
func (ss *ServerStream) Value(key any) any {
	if key == (ctxStreamKey{}) {
		return ss
	}
	if ss.g != nil {
		return ss.g.ctx.Value(key)
	}
	return nil
}

// cancelLocked ends the context (under mu).
func (ss *ServerStream) cancelLocked(err error) {
	if ss.err != nil {
		return
	}
	ss.err = err
	if ss.done != nil {
		close(ss.done)
	}
	if ss.timer != nil {
		ss.timer.Stop()
	}
	ss.s.notifyRead()
	ss.s.notifyWrite()
}

func (ss *ServerStream) deadlineFired() {
	ss.endWith(DeadlineExceeded, "deadline exceeded", nil, context.DeadlineExceeded)
}

func (s *Server) serverEvent(c *conn, ev *wire.Event) {
	switch ev.Type {
	case wire.EvCallStarted:
		c.lastCall = c.lastRecv
		entry, ok := s.handlers[ev.Method]
		if !ok {
			_ = c.eng.EndCall(ev.CallID, Unimplemented, "unknown method "+ev.Method, nil)
			return
		}
		codecOK := false
		for _, k := range entry.codecs {
			codecOK = codecOK || k == ev.Codec
		}
		if !codecOK {
			_ = c.eng.EndCall(ev.CallID, Unimplemented, fmt.Sprintf("codec %d not supported by %s", ev.Codec, ev.Method), nil)
			return
		}
		ss := &ServerStream{method: ev.Method, md: ev.Metadata, srv: s, kind: entry.kind}
		if !s.negotiate(c, ev, ss) {
			return
		}
		ss.s.init(make(chan struct{}, 1))
		ss.s.c, ss.s.id, ss.s.ss = c, ev.CallID, ss
		if ev.TimeoutUs > 0 {
			d := time.Duration(min(ev.TimeoutUs, 1<<62/1000)) * time.Microsecond
			ss.deadline, ss.hasDL = time.Now().Add(d), true
			ss.timer = time.AfterFunc(d, ss.deadlineFired)
		}
		c.streams[ev.CallID] = &ss.s
		if c.fullLocked() {
			// The client does not read its answers: its new calls wait to start.
			c.held = append(c.held, job{ss, entry.h})
			return
		}
		s.dispatch(job{ss, entry.h})
	case wire.EvMessage:
		if st := c.streams[ev.CallID]; st != nil {
			st.push(ev.Message, ev.Cost)
		}
	case wire.EvHalfClosed:
		if st := c.streams[ev.CallID]; st != nil {
			st.remoteDone = true
			st.notifyRead()
		}
	case wire.EvCancelled:
		if st := c.streams[ev.CallID]; st != nil {
			st.ended, st.code, st.msg = true, ev.Code, ev.Text
			if st.ss != nil {
				st.ss.cancelLocked(context.Canceled)
			}
		}
		c.callEnded(ev.CallID)
	}
}

// negotiate applies the call's message compression (protocol.md §15): requests are
// decoded with the client's topspin-encoding (a call with one this server cannot decode ends
// UNIMPLEMENTED, naming the accepted ones); responses use the server's WithCompression
// encoding when the client's topspin-accept-encoding lists it, announced in HEADERS.
func (s *Server) negotiate(c *conn, ev *wire.Event, ss *ServerStream) bool {
	if e, ok := ev.Metadata.Get(wire.KeyEncoding); ok && e != wire.EncodingIdentity {
		if !wire.SupportedEncoding(e) {
			_ = c.eng.EndCall(ev.CallID, Unimplemented,
				fmt.Sprintf("message encoding %q is not supported; accepted: %s", e, wire.AcceptedEncodings),
				Metadata{{Key: wire.KeyAcceptEncoding, Value: wire.AcceptedEncodings}})
			return false
		}
		ss.s.enc = e
	}
	ss.limit = s.opts.settings.MaxMessageSize
	if want := s.opts.compress; want != "" && want != wire.EncodingIdentity && wire.SupportedEncoding(want) {
		if acc, ok := ev.Metadata.Get(wire.KeyAcceptEncoding); ok {
			for _, a := range strings.Split(acc, ",") {
				if strings.TrimSpace(a) == want {
					ss.respEnc = want
					ss.header = Metadata{{Key: wire.KeyEncoding, Value: want}}
					ss.hdrSet = true
					break
				}
			}
		}
	}
	return true
}

// job is a call for a worker goroutine.
type job struct {
	ss *ServerStream
	h  Handler
}

// dispatch runs a call's handler on an idle worker, or a new one.
func (s *Server) dispatch(j job) {
	select {
	case s.work <- j:
	default:
		go s.worker(j)
	}
}

// startHeld starts the calls that waited for room in the send buffer, while there is room
// (under mu).
func (c *conn) startHeld() {
	for len(c.held) > 0 && !c.fullLocked() {
		j := c.held[0]
		c.held[0] = job{}
		c.held = c.held[1:]
		if !j.ss.s.ended { // not cancelled, nor past its deadline, meanwhile
			c.server.dispatch(j)
		}
	}
	if len(c.held) == 0 {
		c.held = nil
	}
}

// workerIdle is how long a worker goroutine waits for the next call before it exits.
const workerIdle = 5 * time.Second

// worker runs calls' handlers, one after the other, and waits a while for more: reusing
// a goroutine (and its grown stack) is cheaper than starting one per call.
func (s *Server) worker(j job) {
	var idle *time.Timer
	for {
		s.run(j.ss, j.h)
		if idle == nil {
			idle = time.NewTimer(workerIdle)
		} else {
			idle.Reset(workerIdle)
		}
		select {
		case j = <-s.work:
			idle.Stop()
		case <-idle.C:
			return
		}
	}
}

func (s *Server) run(ss *ServerStream, h Handler) {
	err := callHandler(h, ss)
	if err == nil {
		ss.endWith(OK, "", nil, context.Canceled)
		return
	}
	st := StatusOf(err)
	ss.endWith(st.Code, st.Message, st.Trailers, context.Canceled)
}

// endWith sends END (if the call is still open) and ends the context with cause.
func (ss *ServerStream) endWith(code Code, msg string, trailers Metadata, cause error) {
	c := ss.s.c
	c.mu.Lock()
	ss.endLocked(code, msg, trailers)
	ss.cancelLocked(cause)
	c.sendLocked()
}

// endLocked queues END if the call is still open (under mu).
func (ss *ServerStream) endLocked(code Code, msg string, trailers Metadata) {
	if ss.s.ended {
		return
	}
	c := ss.s.c
	if ss.hdrSet {
		_ = c.eng.SendHeaders(ss.s.id, ss.header)
		ss.hdrSet = false
	}
	all := ss.trailer
	if len(trailers) > 0 {
		all = append(all[:len(all):len(all)], trailers...)
	}
	_ = c.eng.EndCall(ss.s.id, code, msg, all)
	ss.s.ended, ss.s.code, ss.s.msg = true, code, msg
	c.callEnded(ss.s.id)
}

// Context is the call's context (the ServerStream itself).
func (ss *ServerStream) Context() context.Context { return ss }

// Method is the full method name, "/package.Service/Method".
func (ss *ServerStream) Method() string { return ss.method }

// IsGRPC reports whether the call came through the server's gRPC face (a gRPC client on
// HTTP/2) rather than the native protocol.
func (ss *ServerStream) IsGRPC() bool { return ss.g != nil }

// Metadata is the request metadata.
func (ss *ServerStream) Metadata() Metadata { return ss.md }

// Peer is the client's address.
func (ss *ServerStream) Peer() net.Addr {
	if ss.g != nil {
		return ss.g.peer()
	}
	return ss.s.c.nc.RemoteAddr()
}

// TLS is the connection's TLS state (nil without TLS): with mutual TLS,
// PeerCertificates[0] is the client's verified certificate, the call's peer identity
// (protocol.md §14.1).
func (ss *ServerStream) TLS() *tls.ConnectionState {
	if ss.g != nil {
		return ss.g.tls()
	}
	tc, ok := ss.s.c.nc.(*tls.Conn)
	if !ok {
		return nil
	}
	st := tc.ConnectionState()
	return &st
}

// SetHeader adds response headers, sent before the first message (or with the end).
func (ss *ServerStream) SetHeader(md Metadata) {
	if ss.g != nil {
		ss.g.setHeader(md)
		return
	}
	c := ss.s.c
	c.mu.Lock()
	ss.header = append(ss.header, md...)
	ss.hdrSet = true
	c.mu.Unlock()
}

// SetTrailer adds trailers, sent with the call's end.
func (ss *ServerStream) SetTrailer(md Metadata) {
	if ss.g != nil {
		ss.g.setTrailer(md)
		return
	}
	c := ss.s.c
	c.mu.Lock()
	ss.trailer = append(ss.trailer, md...)
	c.mu.Unlock()
}

// Send sends one message. msg must not be changed afterwards.
func (ss *ServerStream) Send(msg []byte) error { return ss.send(msg, false) }

// send queues msg; with end, END OK follows in the same write (unary answers).
func (ss *ServerStream) send(msg []byte, end bool) error {
	if ss.g != nil {
		return ss.g.send(msg)
	}
	c := ss.s.c
	if ss.respEnc != "" {
		var err error
		if msg, err = wire.Compress(ss.respEnc, msg); err != nil {
			return &Status{Code: Internal, Message: "compress: " + err.Error()}
		}
	}
	for {
		c.mu.Lock()
		if ss.s.ended {
			c.mu.Unlock()
			if ss.s.code == OK {
				return &Status{Code: FailedPrecondition, Message: "send after the call ended"}
			}
			return ss.s.status()
		}
		if c.fullLocked() && !c.waitRoom(ss.doneLocked()) {
			c.mu.Unlock()
			continue // the call or the connection ended: reported above
		}
		if ss.hdrSet {
			if err := c.eng.SendHeaders(ss.s.id, ss.header); err != nil {
				c.mu.Unlock()
				return StatusOf(err)
			}
			ss.hdrSet = false
		}
		err := c.eng.SendMessage(ss.s.id, msg, false)
		if err == nil {
			if end {
				ss.endLocked(OK, "", nil)
				ss.cancelLocked(context.Canceled)
			}
			c.sendLocked()
			return nil
		}
		if !errors.Is(err, wire.ErrBlocked) {
			c.mu.Unlock()
			return StatusOf(err)
		}
		wn := ss.s.writeNote()
		if ss.err != nil {
			c.mu.Unlock()
			return StatusOf(ss.err)
		}
		c.mu.Unlock()
		<-wn // credit came back, or the call ended (cancelLocked notifies)
	}
}

// SendMsg marshals m with protobuf and sends it.
func (ss *ServerStream) SendMsg(m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return &Status{Code: Internal, Message: "marshal: " + err.Error()}
	}
	return ss.Send(b)
}

// Recv returns the next request message, or io.EOF once the client half-closed.
func (ss *ServerStream) Recv() ([]byte, error) {
	if ss.g != nil {
		return ss.g.recv()
	}
	c := ss.s.c
	for {
		c.mu.Lock()
		if msg, ok := ss.s.pop(); ok {
			out := c.eng.HasOutput()
			enc := ss.s.enc
			c.mu.Unlock()
			if out {
				c.signal()
			}
			if enc != "" {
				dec, err := wire.Decompress(enc, msg, ss.limit)
				if err != nil {
					st := StatusOf(err)
					ss.endWith(st.Code, st.Message, nil, context.Canceled)
					return nil, st
				}
				msg = dec
			}
			return msg, nil
		}
		if ss.s.remoteDone {
			c.mu.Unlock()
			return nil, io.EOF
		}
		if ss.s.ended {
			st := ss.s.status()
			c.mu.Unlock()
			return nil, st
		}
		if ss.err != nil {
			c.mu.Unlock()
			return nil, StatusOf(ss.err)
		}
		c.mu.Unlock()
		<-ss.s.rnote // a message, the half-close, or the end (cancelLocked notifies)
	}
}

// RecvMsg receives the next request into m (protobuf).
func (ss *ServerStream) RecvMsg(m proto.Message) error {
	b, err := ss.Recv()
	if err != nil {
		return err
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return &Status{Code: InvalidArgument, Message: "unmarshal: " + err.Error()}
	}
	return nil
}

// recvOne reads exactly one request message for a unary or server-streaming method.
func (ss *ServerStream) recvOne() ([]byte, error) {
	msg, err := ss.Recv()
	if err == io.EOF {
		return nil, &Status{Code: InvalidArgument, Message: "no request message"}
	}
	if err != nil {
		return nil, err
	}
	if _, err := ss.Recv(); err != io.EOF {
		if err == nil {
			return nil, &Status{Code: InvalidArgument, Message: "more than one request message for a unary method"}
		}
		return nil, err
	}
	return msg, nil
}

// UnaryRaw adapts a function of one encoded request to one encoded response. The server's
// unary interceptors see req and the response as []byte.
func UnaryRaw(fn func(ctx context.Context, md Metadata, req []byte) ([]byte, error)) Handler {
	return adapter(func(ss *ServerStream) error {
		req, err := ss.recvOne()
		if err != nil {
			return err
		}
		var resp []byte
		if ic := ss.unaryChain(); ic != nil {
			resp, err = interceptUnary(ss, ic, req, func(ctx context.Context, r any) ([]byte, error) {
				b, ok := r.([]byte)
				if !ok {
					return nil, wrongRequest(ss, r, b)
				}
				return fn(ctx, ss.md, b)
			})
		} else {
			resp, err = fn(ss, ss.md, req)
		}
		if err != nil {
			return err
		}
		return ss.send(resp, true)
	}, kindUnary)
}

// Unary adapts a typed unary method (protobuf messages) to a Handler. The server's unary
// interceptors see the decoded request and the response.
func Unary[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](fn func(ctx context.Context, req PReq) (Resp, error)) Handler {
	return adapter(func(ss *ServerStream) error {
		b, err := ss.recvOne()
		if err != nil {
			return err
		}
		req := PReq(new(Req))
		if err := proto.Unmarshal(b, req); err != nil {
			return &Status{Code: InvalidArgument, Message: "unmarshal: " + err.Error()}
		}
		var resp Resp
		if ic := ss.unaryChain(); ic != nil {
			resp, err = interceptUnary(ss, ic, req, func(ctx context.Context, r any) (Resp, error) {
				q, ok := r.(PReq)
				if !ok {
					var zero Resp
					return zero, wrongRequest(ss, r, q)
				}
				return fn(ctx, q)
			})
		} else {
			resp, err = fn(ss, req)
		}
		if err != nil {
			return err
		}
		b, err = proto.Marshal(resp)
		if err != nil {
			return &Status{Code: Internal, Message: "marshal: " + err.Error()}
		}
		return ss.send(b, true)
	}, kindUnary)
}

type ctxStreamKey struct{}

// ServerStreamFrom returns the ServerStream of a handler's context (for metadata and
// headers from typed handlers).
func ServerStreamFrom(ctx context.Context) *ServerStream {
	ss, _ := ctx.Value(ctxStreamKey{}).(*ServerStream)
	return ss
}
