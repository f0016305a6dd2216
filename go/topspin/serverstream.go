package topspin

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/topspin-rpc/topspin/go/internal/heapgate"
	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/protobuf/proto"
)

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
	// held: the bytes of the request the handler took last, decompressed, charged to the
	// memory budget until the next one is decompressed or the handler returns.
	held atomic.Int64

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
	ss.endWith(DeadlineExceeded, "deadline exceeded", nil, nil, context.DeadlineExceeded)
}

// endWith sends END (if the call is still open) and ends the context with cause; headers
// (a failing status's) go before it as endLocked says.
func (ss *ServerStream) endWith(code Code, msg string, trailers, headers Metadata, cause error) {
	c := ss.s.c
	c.mu.Lock()
	ss.endLocked(code, msg, trailers, headers)
	ss.cancelLocked(cause)
	c.sendLocked()
}

// endLocked queues END if the call is still open (under mu). The headers set and not sent
// yet, and a failing status's headers after them, go first in a HEADERS frame, unless the
// call sent its headers already or they are over the client's metadata limit: then the END
// goes alone (protocol.md §5.4, as the Rust server).
func (ss *ServerStream) endLocked(code Code, msg string, trailers, headers Metadata) {
	if ss.s.ended {
		return
	}
	c := ss.s.c
	if len(headers) > 0 {
		ss.header = append(ss.header[:len(ss.header):len(ss.header)], headers...)
		ss.hdrSet = true
	}
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

// SendMsg marshals m with protobuf and sends it.
func (ss *ServerStream) SendMsg(m proto.Message) error { return ss.sendMsg(m, false) }

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
				ss.releaseHeld() // the handler is done with the request before
				budget := ss.srv.opts.memoryBudget()
				dec, charged, err := wire.DecompressCharged(enc, msg, ss.limit, budget)
				ss.held.Add(charged)
				if err != nil {
					st := StatusOf(err)
					ss.endWith(st.Code, st.Message, nil, nil, context.Canceled)
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
		if ss.s.rnote == nil {
			ss.s.rnote = make(chan struct{}, 1) // notifications come under mu: none is lost
		}
		rnote := ss.s.rnote
		c.mu.Unlock()
		<-rnote // a message, the half-close, or the end (cancelLocked notifies)
	}
}

// releaseHeld gives back the charge of the decompressed request the handler held.
func (ss *ServerStream) releaseHeld() {
	if n := ss.held.Swap(0); n > 0 {
		ss.srv.opts.memoryBudget().Release(n)
	}
}

// RecvMsg receives the next request into m (protobuf).
func (ss *ServerStream) RecvMsg(m proto.Message) error {
	b, err := ss.Recv()
	if err != nil {
		return err
	}
	if err := unmarshalRequest(b, m); err != nil {
		return err
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

type ctxStreamKey struct{}

// ServerStreamFrom returns the ServerStream of a handler's context (for metadata and
// headers from typed handlers).
func ServerStreamFrom(ctx context.Context) *ServerStream {
	ss, _ := ctx.Value(ctxStreamKey{}).(*ServerStream)
	return ss
}

// largeRequest is the size from which unmarshalling a request waits for the collector when
// the heap is past a Go memory limit (internal/heapgate): its fields and unknown fields are
// copied out of the message, about as many bytes again.
const largeRequest = 256 << 10

// unmarshalRequest unmarshals a request message (protobuf); a bad one is INVALID_ARGUMENT.
func unmarshalRequest(b []byte, m proto.Message) error {
	if len(b) >= largeRequest {
		defer heapgate.Wait(int64(len(b)))()
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return &Status{Code: InvalidArgument, Message: "unmarshal: " + err.Error()}
	}
	return nil
}
