package topspin

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/protobuf/proto"
)

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
		// A copy for the interceptors (they may keep it): the caller's variadic slice then
		// stays on its stack, and a call without interceptors allocates none for it.
		err := cc.unaryChain(ctx, method, req, &out, cc, invokeAny, append([]CallOption(nil), opts...)...)
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
		// A copy for the interceptors, as in InvokeRaw.
		return cc.unaryChain(ctx, method, req, resp, cc, invokeAny, append([]CallOption(nil), opts...)...)
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
