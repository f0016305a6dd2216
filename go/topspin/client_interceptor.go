package topspin

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
)

// Client interceptors, shaped as grpc-go's: unary ones wrap Invoke, InvokeRaw and the
// generated clients' unary methods; stream ones wrap NewStream and the generated clients'
// streaming methods. They see the call before it leaves and its status once it ended,
// whatever the transport or the server (topspin's Rust or Go servers alike).

// UnaryInvoker makes the call: the next interceptor, then the runtime. req is a
// proto.Message (Invoke, generated clients) or a []byte (InvokeRaw); reply a proto.Message
// or a *[]byte.
type UnaryInvoker func(ctx context.Context, method string, req, reply any, cc *ClientConn, opts ...CallOption) error

// UnaryClientInterceptor intercepts a unary call; it calls invoker to make it. The error
// it returns is the call's.
type UnaryClientInterceptor func(ctx context.Context, method string, req, reply any, cc *ClientConn, invoker UnaryInvoker, opts ...CallOption) error

// StreamDesc describes a streaming call to a client interceptor. The generated clients'
// streams say their kind (server streaming: ServerStreams only; client streaming:
// ClientStreams only; bidirectional: both); NewStream cannot tell it and says both.
type StreamDesc struct {
	StreamName    string // the method's name, after the last '/'
	ClientStreams bool
	ServerStreams bool
}

// ClientStreamer is a client-side stream as a stream interceptor sees it; *ClientStream
// implements it. An interceptor may return a wrapper (embed the ClientStreamer, override
// methods): NewStream's *ClientStream and the generated clients' streams then go through it.
type ClientStreamer interface {
	Context() context.Context
	Header() (Metadata, error)
	Trailer() Metadata
	CloseSend() error
	Send(msg []byte) error
	Recv() ([]byte, error)
	SendMsg(m proto.Message) error
	RecvMsg(m proto.Message) error
	CancelCall()
}

var _ ClientStreamer = (*ClientStream)(nil)

// Streamer opens the stream: the next interceptor, then the runtime.
type Streamer func(ctx context.Context, desc *StreamDesc, cc *ClientConn, method string, opts ...CallOption) (ClientStreamer, error)

// StreamClientInterceptor intercepts the opening of a stream; it calls streamer to open it
// and may return a wrapper of what it returns.
type StreamClientInterceptor func(ctx context.Context, desc *StreamDesc, cc *ClientConn, method string, streamer Streamer, opts ...CallOption) (ClientStreamer, error)

// WithUnaryInterceptor sets the client's unary interceptor, outermost of all (setting it
// twice panics, as grpc-go's).
func WithUnaryInterceptor(i UnaryClientInterceptor) Option {
	return func(o *options) {
		if o.icpt.cUnary != nil {
			panic("topspin: the unary client interceptor was already set and may not be reset")
		}
		o.icpt.cUnary = i
	}
}

// WithChainUnaryInterceptor adds unary client interceptors: the first is the outermost
// (after WithUnaryInterceptor's).
func WithChainUnaryInterceptor(is ...UnaryClientInterceptor) Option {
	return func(o *options) { o.icpt.cChainUnary = append(o.icpt.cChainUnary, is...) }
}

// WithStreamInterceptor sets the client's stream interceptor, outermost of all (setting
// it twice panics).
func WithStreamInterceptor(i StreamClientInterceptor) Option {
	return func(o *options) {
		if o.icpt.cStream != nil {
			panic("topspin: the stream client interceptor was already set and may not be reset")
		}
		o.icpt.cStream = i
	}
}

// WithChainStreamInterceptor adds stream client interceptors: the first is the outermost.
func WithChainStreamInterceptor(is ...StreamClientInterceptor) Option {
	return func(o *options) { o.icpt.cChainStream = append(o.icpt.cChainStream, is...) }
}

// clientUnaryChain is the client's unary interceptors as one (nil without any).
func (o *interceptorOptions) clientUnaryChain() UnaryClientInterceptor {
	all := o.cChainUnary
	if o.cUnary != nil {
		all = append([]UnaryClientInterceptor{o.cUnary}, all...)
	}
	if len(all) == 0 {
		return nil
	}
	return func(ctx context.Context, method string, req, reply any, cc *ClientConn, inv UnaryInvoker, opts ...CallOption) error {
		return all[0](ctx, method, req, reply, cc, invokerNext(all, 1, inv), opts...)
	}
}

func invokerNext(all []UnaryClientInterceptor, i int, inv UnaryInvoker) UnaryInvoker {
	if i == len(all) {
		return inv
	}
	return func(ctx context.Context, method string, req, reply any, cc *ClientConn, opts ...CallOption) error {
		return all[i](ctx, method, req, reply, cc, invokerNext(all, i+1, inv), opts...)
	}
}

// clientStreamChain is the client's stream interceptors as one (nil without any).
func (o *interceptorOptions) clientStreamChain() StreamClientInterceptor {
	all := o.cChainStream
	if o.cStream != nil {
		all = append([]StreamClientInterceptor{o.cStream}, all...)
	}
	if len(all) == 0 {
		return nil
	}
	return func(ctx context.Context, desc *StreamDesc, cc *ClientConn, method string, st Streamer, opts ...CallOption) (ClientStreamer, error) {
		return all[0](ctx, desc, cc, method, streamerNext(all, 1, st), opts...)
	}
}

func streamerNext(all []StreamClientInterceptor, i int, st Streamer) Streamer {
	if i == len(all) {
		return st
	}
	return func(ctx context.Context, desc *StreamDesc, cc *ClientConn, method string, opts ...CallOption) (ClientStreamer, error) {
		return all[i](ctx, desc, cc, method, streamerNext(all, i+1, st), opts...)
	}
}

// invokeAny is the runtime's UnaryInvoker: protobuf messages or raw bytes.
func invokeAny(ctx context.Context, method string, req, reply any, cc *ClientConn, opts ...CallOption) error {
	switch r := req.(type) {
	case []byte:
		out, err := cc.invokeRaw(ctx, method, r, opts...)
		if err != nil {
			return err
		}
		switch p := reply.(type) {
		case *[]byte:
			*p = out
		case proto.Message:
			if err := proto.Unmarshal(out, p); err != nil {
				return &Status{Code: Internal, Message: "unmarshal: " + err.Error()}
			}
		default:
			return &Status{Code: Internal, Message: fmt.Sprintf("cannot store a response in %T", reply)}
		}
		return nil
	case proto.Message:
		if p, ok := reply.(proto.Message); ok {
			return cc.invokeProto(ctx, method, r, p, opts...)
		}
		b, err := proto.Marshal(r)
		if err != nil {
			return &Status{Code: Internal, Message: "marshal: " + err.Error()}
		}
		return invokeAny(ctx, method, b, reply, cc, opts...)
	}
	return &Status{Code: Internal, Message: fmt.Sprintf("cannot send a request of type %T", req)}
}

// openStream opens a stream through the client's stream interceptors.
func (cc *ClientConn) openStream(ctx context.Context, desc *StreamDesc, method string, opts ...CallOption) (*ClientStream, error) {
	if cc.streamChain == nil {
		return cc.newStream(ctx, method, opts...)
	}
	desc.StreamName = method[strings.LastIndexByte(method, '/')+1:]
	st, err := cc.streamChain(ctx, desc, cc, method, newStreamAny, opts...)
	if err != nil {
		return nil, err
	}
	if cs, ok := st.(*ClientStream); ok {
		return cs, nil
	}
	return &ClientStream{w: st, ctx: st.Context()}, nil
}

// newStreamAny is the runtime's Streamer.
func newStreamAny(ctx context.Context, _ *StreamDesc, cc *ClientConn, method string, opts ...CallOption) (ClientStreamer, error) {
	cs, err := cc.newStream(ctx, method, opts...)
	if err != nil {
		return nil, err
	}
	return cs, nil
}

// Context is the call's context.
func (cs *ClientStream) Context() context.Context {
	if cs.w != nil {
		return cs.w.Context()
	}
	return cs.ctx
}
