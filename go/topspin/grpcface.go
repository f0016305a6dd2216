package topspin

import (
	"context"
	"crypto/tls"
	"errors"
	"math"
	"net"
	"sync"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// The gRPC face: a server answers gRPC clients (HTTP/2) on its own ports, with the handlers
// registered for the native protocol. On accept a connection's first byte decides (protocol.md
// §14.3): 'P', the first byte of the HTTP/2 preface, goes to a grpc-go server fed through a
// channel-backed listener, anything else to the native engine. After a TLS handshake ALPN
// "h2" is gRPC, "topspin/1" native, and none is sniffed the same way.

// grpcFace is a server's gRPC side.
type grpcFace struct {
	gs  *grpc.Server
	lis *chanListener
}

// grpcService is a service served on the gRPC face only (RegisterGRPCService).
type grpcService struct {
	desc *grpc.ServiceDesc
	impl any
}

// RegisterGRPCService registers a grpc-go service on the gRPC face only (the reflection
// package registers gRPC server reflection this way). Call it before Serve.
func (s *Server) RegisterGRPCService(desc *grpc.ServiceDesc, impl any) {
	s.grpcSvcs = append(s.grpcSvcs, grpcService{desc, impl})
}

// startFace starts the gRPC face on the first Serve; nil when it is off.
func (s *Server) startFace() *grpcFace {
	s.faceOnce.Do(func() {
		if s.opts.grpcOff {
			return
		}
		f := &grpcFace{lis: newChanListener(), gs: grpc.NewServer(s.grpcOptions()...)}
		for _, r := range s.grpcSvcs {
			f.gs.RegisterService(r.desc, r.impl)
		}
		s.mu.Lock()
		if s.stopping { // stopped before it started: nothing would stop it
			s.mu.Unlock()
			return
		}
		s.face = f
		s.mu.Unlock()
		go func() { _ = f.gs.Serve(f.lis) }()
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.face
}

// grpcHeaderRoom is the header list's room beyond MaxMetadataSize, for the HTTP/2 and gRPC
// headers themselves (as the Rust face's HEADER_ROOM); the metadata itself is checked
// against MaxMetadataSize by the bridge.
const grpcHeaderRoom = 4 << 10

// grpcWindowConns is how many calls' windows the connection window of the gRPC face holds
// (as the Rust server's).
const grpcWindowConns = 2

// grpcWindow is the gRPC face's stream window: the settings' InitialCallWindow.
func grpcWindow(o *options) int32 {
	return int32(min(max(o.settings.InitialCallWindow, 64<<10), 1<<30))
}

// grpcMaxRecv is the largest request message of the gRPC face: the max message size, within
// what grpc-go takes (an int32).
func grpcMaxRecv(o *options) uint32 { return min(o.settings.MaxMessageSize, 1<<31-1) }

// grpcOptions are the gRPC face's bounds, taken from the server's options.
func (s *Server) grpcOptions() []grpc.ServerOption {
	o := &s.opts
	win := grpcWindow(o)
	kp := keepalive.ServerParameters{MaxConnectionIdle: o.idleTimeout}
	if o.kaInterval > 0 {
		kp.Time, kp.Timeout = o.kaInterval, o.kaTimeout
	}
	opts := []grpc.ServerOption{
		grpc.UnknownServiceHandler(s.bridge),
		grpc.ForceServerCodecV2(bridgeCodec{}),
		grpc.Creds(doneTLS{}),
		grpc.MaxRecvMsgSize(int(grpcMaxRecv(o))),
		//lint:ignore SA1019 the only per-server decompressor: zstd requests charged to this server's budget
		grpc.RPCDecompressor(grpcCharged{enc: wire.EncodingZstd, budget: o.memoryBudget(), limit: grpcMaxRecv(o)}),
		grpc.MaxConcurrentStreams(o.settings.MaxConcurrentCalls),
		grpc.MaxHeaderListSize(min(o.settings.MaxMetadataSize, math.MaxUint32-grpcHeaderRoom) + grpcHeaderRoom),
		grpc.InitialWindowSize(win),
		grpc.InitialConnWindowSize(win * grpcWindowConns),
		grpc.KeepaliveParams(kp),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime: MinKeepaliveInterval, PermitWithoutStream: true}),
	}
	if o.handshake > 0 {
		opts = append(opts, grpc.ConnectionTimeout(o.handshake))
	}
	return opts
}

// sniff reads a connection's first byte, within the handshake timeout counted from accept:
// 'P' goes to the gRPC face, anything else (or silence) to the native engine, which is
// handed the byte (and answers silence with ERROR TIMEOUT, its handshake timeout being spent).
func (s *Server) sniff(nc net.Conn, acceptedAt time.Time) {
	var b [1]byte
	if d := s.opts.handshake; d > 0 {
		_ = nc.SetReadDeadline(acceptedAt.Add(d))
	}
	n, err := nc.Read(b[:])
	_ = nc.SetReadDeadline(time.Time{})
	s.mu.Lock()
	s.sniffing--
	s.mu.Unlock()
	var ne net.Error
	switch {
	case n == 1 && b[0] == 'P':
		s.serveGRPC(&faceConn{Conn: nc, pre: b[:1]})
	case n == 1 || errors.As(err, &ne) && ne.Timeout():
		s.serveConn(nc, b[:n:n], acceptedAt)
	default:
		_ = nc.Close() // closed (or failed) before it said anything
	}
}

// afterTLS routes a connection whose TLS handshake is done, by its ALPN protocol.
func (s *Server) afterTLS(tc *tls.Conn) {
	s.mu.Lock()
	face := s.face
	s.mu.Unlock()
	switch p := tc.ConnectionState().NegotiatedProtocol; {
	case p == ALPNGRPC && face != nil:
		s.serveGRPC(&faceConn{Conn: tc, tls: tc})
	case p == ALPNGRPC:
		_ = tc.Close() // the gRPC face is off
	case p == "" && face != nil && s.admitSniff():
		s.sniff(tc, time.Now())
	default:
		s.serveConn(tc, nil, time.Time{})
	}
}

// serveGRPC hands a connection to the gRPC face, counting it toward max_connections; over
// the limit it is told why (refuseGRPC) or, when as many are being refused, closed at once.
func (s *Server) serveGRPC(fc *faceConn) {
	s.mu.Lock()
	face := s.face
	if !s.stopping && face != nil && s.openLocked() >= s.opts.maxConns && s.refusing < maxRefusals {
		s.refusing++
		s.mu.Unlock()
		s.refuseGRPC(fc)
		return
	}
	if s.stopping || face == nil || s.openLocked() >= s.opts.maxConns {
		s.mu.Unlock()
		_ = fc.Conn.Close()
		return
	}
	s.grpcConns++
	s.mu.Unlock()
	fc.writeTimeout = s.opts.writeTimeout
	s.watchGRPC(fc)
	fc.onClose = func() {
		s.mu.Lock()
		s.grpcConns--
		s.mu.Unlock()
	}
	if !face.lis.hand(fc) {
		_ = fc.Close()
	}
}

// faceConn is a connection of the gRPC face: it replays the sniffed byte, keeps the TLS
// connection under it (for handlers' TLS()), bounds its writes by the write timeout
// (grpcconn.go) and uncounts itself when closed.
type faceConn struct {
	net.Conn
	pre     []byte
	tls     *tls.Conn
	once    sync.Once
	onClose func()

	writeTimeout time.Duration // 0: none
	writeBy      time.Time     // the socket's write deadline (grpc-go writes from one goroutine at a time)
	wmu          sync.Mutex

	watch *grpcWatch // its request messages under way (grpcwatch.go)
}

func (c *faceConn) Read(p []byte) (n int, err error) {
	if len(c.pre) > 0 {
		n = copy(p, c.pre)
		c.pre = c.pre[n:]
	} else {
		n, err = c.Conn.Read(p)
	}
	if c.watch != nil && n > 0 {
		if why := c.watch.in(p[:n], time.Now()); why != "" {
			c.cut()
		}
	}
	return n, err
}

func (c *faceConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		if c.watch != nil {
			c.watch.close()
		}
		if c.onClose != nil {
			c.onClose()
		}
	})
	return err
}

// chanListener is the gRPC face's listener: connections are handed to it after sniffing.
type chanListener struct {
	conns chan net.Conn
	done  chan struct{} // a signal: closed, never sent on
	once  sync.Once
}

func newChanListener() *chanListener {
	return &chanListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// hand gives c to the accepting grpc-go server; false once the listener is closed.
func (l *chanListener) hand(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return faceAddr{} }

type faceAddr struct{}

func (faceAddr) Network() string { return "topspin-grpc-face" }
func (faceAddr) String() string  { return "topspin-grpc-face" }

// doneTLS is the gRPC face's transport credentials: TLS, when there is any, is done before
// the connection reaches grpc-go, so the handshake only reports it (credentials.TLSInfo).
type doneTLS struct{}

func (doneTLS) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, nil, errors.New("topspin: the gRPC face is server-side only")
}

func (doneTLS) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if fc, ok := c.(*faceConn); ok && fc.tls != nil {
		return c, credentials.TLSInfo{State: fc.tls.ConnectionState(),
			CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
	}
	return c, nil, nil
}

func (doneTLS) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "topspin"}
}

func (doneTLS) Clone() credentials.TransportCredentials { return doneTLS{} }

func (doneTLS) OverrideServerName(string) error { return nil }
