package topspin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/protobuf/proto"
)

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
	md, first, err := cc.callEncoding(ctx, cs, first)
	if err != nil {
		return err
	}
	lost := 0 // connections that closed under this call before it could start
	for {
		timeoutUs, err := timeoutOf(ctx)
		if err != nil {
			return err
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
			return c.callStartedLocked(cs, id, first, last)
		case errors.Is(err, wire.ErrTooManyCalls):
			c.waitSlotLocked(ctx)
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

// callEncoding picks the call's message encoding (the call's CallCompression, else the
// connection's WithCompression): the request metadata says it and that zstd and gzip are
// accepted, and the first message (if any) is compressed.
func (cc *ClientConn) callEncoding(ctx context.Context, cs *ClientStream, first []byte) (Metadata, []byte, error) {
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
			return nil, nil, &Status{Code: InvalidArgument, Message: fmt.Sprintf("unknown compression %q (zstd, gzip)", enc)}
		}
		md = append(md[:len(md):len(md)], wire.MetadataEntry{Key: wire.KeyEncoding, Value: enc},
			wire.MetadataEntry{Key: wire.KeyAcceptEncoding, Value: wire.AcceptedEncodings})
		if first != nil {
			var err error
			if first, err = wire.Compress(enc, first); err != nil {
				return nil, nil, &Status{Code: Internal, Message: "compress: " + err.Error()}
			}
		}
	}
	cs.enc, cs.limit = enc, cc.opts.settings.MaxMessageSize
	return md, first, nil
}

// timeoutOf is the time left before ctx's deadline in whole microseconds, rounded up (0:
// no deadline); DEADLINE_EXCEEDED once it passed.
func timeoutOf(ctx context.Context) (uint64, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0, nil
	}
	left := time.Until(dl)
	if left <= 0 {
		return 0, &Status{Code: DeadlineExceeded, Message: "deadline passed before the call was sent"}
	}
	return uint64((left + time.Microsecond - 1) / time.Microsecond), nil
}

// callStartedLocked binds the call the engine started to cs and sends its first message
// (or keeps it for when credit comes). Called with mu held; returns with it released.
func (c *conn) callStartedLocked(cs *ClientStream, id uint32, first []byte, last bool) error {
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
}

// waitSlotLocked waits until a call of the connection ends (or it closes, or ctx ends).
// Called with mu held; returns with it released.
func (c *conn) waitSlotLocked(ctx context.Context) {
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
