package topspin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/protobuf/proto"
)

// Handler serves one call. It returns nil for OK or an error (a *Status keeps its code;
// any other error is UNKNOWN).
type Handler func(ss *ServerStream) error

type handlerEntry struct {
	codecs []uint8
	h      Handler
}

// Server serves calls on any number of listeners.
type Server struct {
	opts     options
	handlers map[string]handlerEntry

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	stopping  bool
	connWG    sync.WaitGroup
	ctx       context.Context
	cancelAll context.CancelFunc
}

// NewServer makes a server; register methods with Handle (or generated Register functions)
// before Serve.
func NewServer(opts ...Option) *Server {
	s := &Server{opts: defaultOptions(), handlers: make(map[string]handlerEntry),
		listeners: make(map[net.Listener]struct{}), conns: make(map[*conn]struct{})}
	for _, o := range opts {
		o(&s.opts)
	}
	s.ctx, s.cancelAll = context.WithCancel(context.Background())
	return s
}

// Handle registers h for method ("/package.Service/Method") and the codecs it accepts
// (CodecProto when none is given). A call with another codec ends with UNIMPLEMENTED.
func (s *Server) Handle(method string, h Handler, codecs ...uint8) {
	if len(codecs) == 0 {
		codecs = []uint8{CodecProto}
	}
	s.handlers[method] = handlerEntry{codecs: codecs, h: h}
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
		s.serveConn(nc)
	}
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

func (s *Server) serveConn(nc net.Conn) {
	c, err := newConn(nc, wire.Server, s.opts.settings, s.opts.limits)
	if err != nil {
		_ = nc.Close()
		return
	}
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		_ = nc.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	s.mu.Unlock()
	c.onEvent = func(ev *wire.Event) { s.serverEvent(c, ev) }
	c.onClose = func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.connWG.Done()
	}
	if d := s.opts.handshake; d > 0 {
		t := time.AfterFunc(d, func() {
			c.mu.Lock()
			if !c.eng.Established() && !c.eng.Closed() {
				c.eng.Abort(wire.Timeout, fmt.Sprintf("no preface and SETTINGS within %v", d))
				c.drain()
			}
			c.mu.Unlock()
			c.signal()
		})
		go func() {
			select {
			case <-c.established:
			case <-c.done:
			}
			t.Stop()
		}()
	}
	c.start()
}

// GracefulStop stops accepting, sends GOAWAY on every connection, lets open calls finish
// and returns when every connection is closed.
func (s *Server) GracefulStop() {
	s.mu.Lock()
	s.stopping = true
	for l := range s.listeners {
		_ = l.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
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
	s.connWG.Wait()
	s.cancelAll()
}

// Stop closes every listener and connection at once; open calls fail.
func (s *Server) Stop() {
	s.mu.Lock()
	s.stopping = true
	for l := range s.listeners {
		_ = l.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	s.cancelAll()
	for _, c := range conns {
		c.shutdown(errors.New("server stopped"))
	}
	s.connWG.Wait()
}

// ServerStream is one call seen from the server.
type ServerStream struct {
	s       stream
	ctx     context.Context
	cancel  context.CancelFunc
	method  string
	md      Metadata
	header  Metadata
	hdrSet  bool
	trailer Metadata
}

func (s *Server) serverEvent(c *conn, ev *wire.Event) {
	switch ev.Type {
	case wire.EvCallStarted:
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
		ss := &ServerStream{s: newStream(), method: ev.Method, md: ev.Metadata}
		ss.s.c, ss.s.id = c, ev.CallID
		if ev.TimeoutUs > 0 {
			ss.ctx, ss.cancel = context.WithDeadline(s.ctx, time.Now().Add(time.Duration(min(ev.TimeoutUs, 1<<62/1000))*time.Microsecond))
		} else {
			ss.ctx, ss.cancel = context.WithCancel(s.ctx)
		}
		ss.ctx = context.WithValue(ss.ctx, ctxStreamKey{}, ss)
		ss.s.cancel = ss.cancel
		c.streams[ev.CallID] = &ss.s
		go s.run(ss, entry.h)
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
			st.ended = true
			st.status = &Status{Code: ev.Code, Message: ev.Text}
			st.notifyRead()
			st.notifyWrite()
			if st.cancel != nil {
				st.cancel()
			}
		}
		c.callEnded(ev.CallID)
	}
}

func (s *Server) run(ss *ServerStream, h Handler) {
	stop := context.AfterFunc(ss.ctx, func() { ss.end(StatusOf(context.Cause(ss.ctx))) })
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				err = &Status{Code: Internal, Message: fmt.Sprint("handler panicked: ", r)}
			}
		}()
		err = h(ss)
	}()
	stop()
	if err == nil {
		ss.end(&Status{Code: OK})
	} else {
		ss.end(StatusOf(err))
	}
	ss.cancel()
}

// end sends END with st if the call is still open.
func (ss *ServerStream) end(st *Status) {
	c := ss.s.c
	c.mu.Lock()
	if ss.s.ended {
		c.mu.Unlock()
		return
	}
	if ss.hdrSet {
		_ = c.eng.SendHeaders(ss.s.id, ss.header)
		ss.hdrSet = false
	}
	trailers := ss.trailer
	if st.Trailers != nil {
		trailers = append(trailers[:len(trailers):len(trailers)], st.Trailers...)
	}
	_ = c.eng.EndCall(ss.s.id, st.Code, st.Message, trailers)
	ss.s.ended = true
	ss.s.status = st
	c.callEnded(ss.s.id)
	c.mu.Unlock()
	c.signal()
}

// Context is the call's context: cancelled when the client cancels, the deadline passes,
// the connection is lost or the handler returns.
func (ss *ServerStream) Context() context.Context { return ss.ctx }

// Method is the full method name, "/package.Service/Method".
func (ss *ServerStream) Method() string { return ss.method }

// Metadata is the request metadata.
func (ss *ServerStream) Metadata() Metadata { return ss.md }

// SetHeader sets the response headers, sent before the first message (or with the end).
func (ss *ServerStream) SetHeader(md Metadata) {
	c := ss.s.c
	c.mu.Lock()
	ss.header = append(ss.header, md...)
	ss.hdrSet = true
	c.mu.Unlock()
}

// SetTrailer adds trailers, sent with the call's end.
func (ss *ServerStream) SetTrailer(md Metadata) {
	c := ss.s.c
	c.mu.Lock()
	ss.trailer = append(ss.trailer, md...)
	c.mu.Unlock()
}

// Send sends one message. msg must not be changed afterwards.
func (ss *ServerStream) Send(msg []byte) error {
	c := ss.s.c
	for {
		c.mu.Lock()
		if ss.s.ended {
			c.mu.Unlock()
			return ss.s.status
		}
		if ss.hdrSet {
			if err := c.eng.SendHeaders(ss.s.id, ss.header); err != nil {
				c.mu.Unlock()
				return StatusOf(err)
			}
			ss.hdrSet = false
		}
		err := c.eng.SendMessage(ss.s.id, msg, false)
		c.mu.Unlock()
		if err == nil {
			c.signal()
			return nil
		}
		if !errors.Is(err, wire.ErrBlocked) {
			return StatusOf(err)
		}
		select {
		case <-ss.s.wnote:
		case <-ss.ctx.Done():
			return StatusOf(ss.ctx.Err())
		}
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
	c := ss.s.c
	for {
		c.mu.Lock()
		if msg, ok := ss.s.pop(); ok {
			out := c.eng.HasOutput()
			c.mu.Unlock()
			if out {
				c.signal()
			}
			return msg, nil
		}
		if ss.s.remoteDone {
			c.mu.Unlock()
			return nil, io.EOF
		}
		if ss.s.ended {
			st := ss.s.status
			c.mu.Unlock()
			return nil, st
		}
		c.mu.Unlock()
		select {
		case <-ss.s.rnote:
		case <-ss.ctx.Done():
			return nil, StatusOf(ss.ctx.Err())
		}
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

// UnaryRaw adapts a function of one encoded request to one encoded response.
func UnaryRaw(fn func(ctx context.Context, md Metadata, req []byte) ([]byte, error)) Handler {
	return func(ss *ServerStream) error {
		req, err := ss.recvOne()
		if err != nil {
			return err
		}
		resp, err := fn(ss.ctx, ss.md, req)
		if err != nil {
			return err
		}
		return ss.Send(resp)
	}
}

// Unary adapts a typed unary method (protobuf messages) to a Handler.
func Unary[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](fn func(ctx context.Context, req PReq) (Resp, error)) Handler {
	return func(ss *ServerStream) error {
		b, err := ss.recvOne()
		if err != nil {
			return err
		}
		req := PReq(new(Req))
		if err := proto.Unmarshal(b, req); err != nil {
			return &Status{Code: InvalidArgument, Message: "unmarshal: " + err.Error()}
		}
		resp, err := fn(ss.ctx, req)
		if err != nil {
			return err
		}
		return ss.SendMsg(resp)
	}
}

type ctxStreamKey struct{}

// ServerStreamFrom returns the ServerStream of a handler's context (for metadata and
// headers from typed handlers).
func ServerStreamFrom(ctx context.Context) *ServerStream {
	ss, _ := ctx.Value(ctxStreamKey{}).(*ServerStream)
	return ss
}
