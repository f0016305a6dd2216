package topspin

import (
	"context"
	"fmt"
	"reflect"
	"sync"

	"google.golang.org/protobuf/proto"
)

// Server interceptors, shaped as grpc-go's. A unary interceptor sees the decoded request
// and the response of methods registered with Unary (generated code) or UnaryRaw ([]byte);
// a stream interceptor wraps every other handler: the typed streaming adapters of generated
// code and raw Handlers. Both run on the native face and on the gRPC face, once per call.

// UnaryServerInfo describes a unary call to an interceptor.
type UnaryServerInfo struct {
	FullMethod string // "/package.Service/Method"
}

// UnaryHandler is the rest of a unary call: the next interceptor, then the method.
type UnaryHandler func(ctx context.Context, req any) (any, error)

// UnaryServerInterceptor intercepts a unary call: req is the decoded request (a
// proto.Message; []byte for UnaryRaw), handler runs the rest of the chain. The error it
// returns is the call's status (a *Status keeps its code and trailers).
type UnaryServerInterceptor func(ctx context.Context, req any, info *UnaryServerInfo, handler UnaryHandler) (any, error)

// StreamServerInfo describes a streaming call (or a raw Handler's call) to an interceptor.
type StreamServerInfo struct {
	FullMethod     string
	IsClientStream bool
	IsServerStream bool
}

// ServerStreamer is a server-side stream as a stream interceptor sees it; *ServerStream
// implements it. An interceptor may hand the handler a wrapper (embed the ServerStreamer
// and override methods): the typed streaming methods of generated code then receive and
// send through it, and take its Context() as their ctx.
type ServerStreamer interface {
	Context() context.Context
	Method() string
	Metadata() Metadata
	SetHeader(md Metadata)
	SetTrailer(md Metadata)
	Send(msg []byte) error
	Recv() ([]byte, error)
	SendMsg(m proto.Message) error
	RecvMsg(m proto.Message) error
}

var _ ServerStreamer = (*ServerStream)(nil)

// StreamHandler is the rest of a streaming call. srv is always nil (handlers are registered
// per method, not per service object); it is there for grpc-go's shape.
type StreamHandler func(srv any, stream ServerStreamer) error

// StreamServerInterceptor intercepts a streaming call; it calls handler (with ss or a
// wrapper of it) to run the rest of the chain.
type StreamServerInterceptor func(srv any, ss ServerStreamer, info *StreamServerInfo, handler StreamHandler) error

// interceptorOptions are the interceptors given as options (server and client).
type interceptorOptions struct {
	unary       UnaryServerInterceptor
	chainUnary  []UnaryServerInterceptor
	stream      StreamServerInterceptor
	chainStream []StreamServerInterceptor

	cUnary       UnaryClientInterceptor
	cChainUnary  []UnaryClientInterceptor
	cStream      StreamClientInterceptor
	cChainStream []StreamClientInterceptor
}

// UnaryInterceptor sets the server's unary interceptor, outermost of all (as grpc-go's;
// setting it twice panics).
func UnaryInterceptor(i UnaryServerInterceptor) Option {
	return func(o *options) {
		if o.icpt.unary != nil {
			panic("topspin: the unary server interceptor was already set and may not be reset")
		}
		o.icpt.unary = i
	}
}

// ChainUnaryInterceptor adds unary server interceptors: the first is the outermost (after
// UnaryInterceptor's), the last runs just before the method.
func ChainUnaryInterceptor(is ...UnaryServerInterceptor) Option {
	return func(o *options) { o.icpt.chainUnary = append(o.icpt.chainUnary, is...) }
}

// StreamInterceptor sets the server's stream interceptor, outermost of all (setting it
// twice panics).
func StreamInterceptor(i StreamServerInterceptor) Option {
	return func(o *options) {
		if o.icpt.stream != nil {
			panic("topspin: the stream server interceptor was already set and may not be reset")
		}
		o.icpt.stream = i
	}
}

// ChainStreamInterceptor adds stream server interceptors: the first is the outermost.
func ChainStreamInterceptor(is ...StreamServerInterceptor) Option {
	return func(o *options) { o.icpt.chainStream = append(o.icpt.chainStream, is...) }
}

// serverUnaryChain is the server's unary interceptors as one (nil without any).
func (o *interceptorOptions) serverUnaryChain() UnaryServerInterceptor {
	all := o.chainUnary
	if o.unary != nil {
		all = append([]UnaryServerInterceptor{o.unary}, all...)
	}
	switch len(all) {
	case 0:
		return nil
	case 1:
		return all[0]
	}
	return func(ctx context.Context, req any, info *UnaryServerInfo, h UnaryHandler) (any, error) {
		return all[0](ctx, req, info, unaryNext(all, 1, info, h))
	}
}

func unaryNext(all []UnaryServerInterceptor, i int, info *UnaryServerInfo, h UnaryHandler) UnaryHandler {
	if i == len(all) {
		return h
	}
	return func(ctx context.Context, req any) (any, error) {
		return all[i](ctx, req, info, unaryNext(all, i+1, info, h))
	}
}

// serverStreamChain is the server's stream interceptors as one (nil without any).
func (o *interceptorOptions) serverStreamChain() StreamServerInterceptor {
	all := o.chainStream
	if o.stream != nil {
		all = append([]StreamServerInterceptor{o.stream}, all...)
	}
	switch len(all) {
	case 0:
		return nil
	case 1:
		return all[0]
	}
	return func(srv any, ss ServerStreamer, info *StreamServerInfo, h StreamHandler) error {
		return all[0](srv, ss, info, streamNext(all, 1, info, h))
	}
}

func streamNext(all []StreamServerInterceptor, i int, info *StreamServerInfo, h StreamHandler) StreamHandler {
	if i == len(all) {
		return h
	}
	return func(srv any, ss ServerStreamer) error {
		return all[i](srv, ss, info, streamNext(all, i+1, info, h))
	}
}

// handlerKind is the call kind of a Handler made by this package's adapters.
type handlerKind uint8

const (
	kindRaw          handlerKind = iota // a Handler of the application: any kind
	kindUnary                           // Unary, UnaryRaw: the unary chain, in the adapter
	kindServerStream                    // ServerStreaming
	kindClientStream                    // ClientStreaming
	kindBidi                            // BidiStreaming
)

// adapterKinds maps the code of the adapters' closures to their kind. A closure's code
// pointer is shared by every closure of one function literal (per instantiation), so it
// tells an adapter's Handler from an application's without running it.
var adapterKinds sync.Map // uintptr -> handlerKind

func adapter(h Handler, k handlerKind) Handler {
	adapterKinds.Store(reflect.ValueOf(h).Pointer(), k)
	return h
}

func kindOf(h Handler) handlerKind {
	if k, ok := adapterKinds.Load(reflect.ValueOf(h).Pointer()); ok {
		return k.(handlerKind)
	}
	return kindRaw
}

// runHandler runs a call's handler inside the server's stream interceptors, unless it is
// unary (its adapter runs the unary chain) or there are none.
func runHandler(h Handler, ss *ServerStream) error {
	if ss.srv == nil || ss.srv.streamChain == nil || ss.kind == kindUnary {
		return h(ss)
	}
	info := &StreamServerInfo{FullMethod: ss.method,
		IsClientStream: ss.kind != kindServerStream, IsServerStream: ss.kind != kindClientStream}
	return ss.srv.streamChain(nil, ss, info, func(_ any, st ServerStreamer) error {
		if p, ok := st.(*ServerStream); !ok || p != ss {
			ss.wrapped = st
		}
		return h(ss)
	})
}

// unaryChain is the server's unary interceptors (nil without any).
func (ss *ServerStream) unaryChain() UnaryServerInterceptor {
	if ss.srv == nil {
		return nil
	}
	return ss.srv.unaryChain
}

// stream is the stream a handler uses: the interceptors' wrapper, or ss.
func (ss *ServerStream) stream() ServerStreamer {
	if ss.wrapped != nil {
		return ss.wrapped
	}
	return ss
}

// interceptUnary runs a decoded unary request through the unary chain to fn and returns
// the response to send.
func interceptUnary[Resp any](ss *ServerStream, ic UnaryServerInterceptor, req any, fn func(context.Context, any) (Resp, error)) (Resp, error) {
	var zero Resp
	out, err := ic(ss, req, &UnaryServerInfo{FullMethod: ss.method}, func(ctx context.Context, r any) (any, error) {
		return fn(ctx, r)
	})
	if err != nil {
		return zero, err
	}
	resp, ok := out.(Resp)
	if !ok {
		return zero, &Status{Code: Internal, Message: fmt.Sprintf("unary interceptor returned %T for %s, not %T", out, ss.method, zero)}
	}
	return resp, nil
}

// wrongRequest is the error of a unary interceptor that passed on a request of another type.
func wrongRequest(ss *ServerStream, got, want any) error {
	return &Status{Code: Internal, Message: fmt.Sprintf("unary interceptor passed %T for %s, not %T", got, ss.method, want)}
}

// SetHeader adds response headers to the call of a handler's (or interceptor's) context,
// as grpc.SetHeader; false when ctx is not a call's.
func SetHeader(ctx context.Context, md Metadata) bool {
	ss := ServerStreamFrom(ctx)
	if ss == nil {
		return false
	}
	ss.SetHeader(md)
	return true
}

// SetTrailer adds trailers to the call of a handler's (or interceptor's) context, as
// grpc.SetTrailer; false when ctx is not a call's.
func SetTrailer(ctx context.Context, md Metadata) bool {
	ss := ServerStreamFrom(ctx)
	if ss == nil {
		return false
	}
	ss.SetTrailer(md)
	return true
}
