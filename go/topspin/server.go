package topspin

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
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
	defer s.holdMemoryLimit()()
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
