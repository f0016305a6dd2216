package topspin

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/protobuf/proto"
)

// serverEvent acts on an event of a server connection's engine (under c.mu).
func (s *Server) serverEvent(c *conn, ev *wire.Event) {
	switch ev.Type {
	case wire.EvCallStarted:
		s.callStarted(c, ev)
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
// callStarted opens a call: an unknown method or codec, or an unsupported encoding, ends it
// at once; otherwise its handler runs (or waits while the client does not read).
func (s *Server) callStarted(c *conn, ev *wire.Event) {
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
	ss.s.init(nil) // made by Recv when it first waits: most unary handlers never do
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
}

// negotiate takes the call's message encoding and picks the response's (the server's
// WithCompression when the client accepts it); false: the call was ended (UNIMPLEMENTED).
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
	ss.releaseHeld()
	if err == nil {
		ss.endWith(OK, "", nil, nil, context.Canceled)
		return
	}
	st := StatusOf(err)
	ss.endWith(st.Code, st.Message, st.Trailers, st.Headers, context.Canceled)
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
		if err := unmarshalRequest(b, req); err != nil {
			return err
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
		return ss.sendMsg(resp, true)
	}, kindUnary)
}
