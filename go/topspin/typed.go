package topspin

import (
	"context"
	"io"

	"google.golang.org/protobuf/proto"
)

// Msg is the constraint of generated message types: *T is a protobuf message.
type Msg[T any] interface {
	*T
	proto.Message
}

// Typed streams, shaped as grpc-go's generic ones: a generated method gets (or, on the
// client, returns) a stream that exposes only its direction. A server-streaming handler
// gets a ServerStreamingServer (Send), a client-streaming one a ClientStreamingServer (Recv;
// it returns its response), a bidirectional one a BidiStreamingServer (both). A client gets
// a ServerStreamingClient (Recv), a ClientStreamingClient (Send, CloseAndRecv) or a
// BidiStreamingClient (Send, Recv, CloseSend). ServerStreamOf and ClientStreamOf implement
// them all.

// ServerStreamCommon is what every typed server stream has, whatever its direction.
type ServerStreamCommon interface {
	// Context is the call's context (a stream interceptor's wrapper's, if any).
	Context() context.Context
	// Method is the call's "/package.Service/Method".
	Method() string
	// Metadata is the request metadata.
	Metadata() Metadata
	// SetHeader adds response headers (sent with the first response, or the end).
	SetHeader(md Metadata)
	// SetTrailer adds trailers (sent with the end).
	SetTrailer(md Metadata)
}

// ServerStreamingServer is the stream of a server-streaming method's handler: it sends.
type ServerStreamingServer[Resp any] interface {
	ServerStreamCommon
	// Send sends one response.
	Send(m *Resp) error
}

// ClientStreamingServer is the stream of a client-streaming method's handler: it receives
// (the handler returns the one response). Resp is the method's response type, as in
// grpc-go's ClientStreamingServer.
type ClientStreamingServer[Req, Resp any] interface {
	ServerStreamCommon
	// Recv returns the next request, or io.EOF once the client half-closed.
	Recv() (*Req, error)
}

// BidiStreamingServer is the stream of a bidirectional method's handler: it receives and
// sends.
type BidiStreamingServer[Req, Resp any] interface {
	ServerStreamCommon
	// Recv returns the next request, or io.EOF once the client half-closed.
	Recv() (*Req, error)
	// Send sends one response.
	Send(m *Resp) error
}

// ClientStreamCommon is what every typed client stream has, whatever its direction.
type ClientStreamCommon interface {
	// Context is the call's context.
	Context() context.Context
	// Header waits for the response headers (empty if the server sent none).
	Header() (Metadata, error)
	// Trailer is the trailers, once the call ended.
	Trailer() Metadata
	// CancelCall ends the call with CANCELLED.
	CancelCall()
}

// ServerStreamingClient is a client's server-streaming call (its request already sent): it
// receives.
type ServerStreamingClient[Resp any] interface {
	ClientStreamCommon
	// Recv returns the next response; io.EOF when the call ended with OK, else a *Status.
	Recv() (*Resp, error)
}

// ClientStreamingClient is a client's client-streaming call: it sends, then half-closes and
// takes the one response.
type ClientStreamingClient[Req, Resp any] interface {
	ClientStreamCommon
	// Send sends one request; io.EOF when the call is over (CloseAndRecv tells its status).
	Send(m *Req) error
	// CloseAndRecv half-closes and returns the response.
	CloseAndRecv() (*Resp, error)
}

// BidiStreamingClient is a client's bidirectional call: it sends and receives.
type BidiStreamingClient[Req, Resp any] interface {
	ClientStreamCommon
	// Send sends one request; io.EOF when the call is over (Recv tells its status).
	Send(m *Req) error
	// CloseSend says the client sends no more requests.
	CloseSend() error
	// Recv returns the next response; io.EOF when the call ended with OK, else a *Status.
	Recv() (*Resp, error)
}

var (
	_ ServerStreamingServer[int]      = ServerStreamOf[int, int]{}
	_ ClientStreamingServer[int, int] = ServerStreamOf[int, int]{}
	_ BidiStreamingServer[int, int]   = ServerStreamOf[int, int]{}
	_ ServerStreamingClient[int]      = ClientStreamOf[int, int]{}
	_ ClientStreamingClient[int, int] = ClientStreamOf[int, int]{}
	_ BidiStreamingClient[int, int]   = ClientStreamOf[int, int]{}
)

// ServerStreamOf is a typed view of a ServerStream, both directions: generated handlers get
// it as the interface of their direction. Its methods go through a stream interceptor's
// wrapper when one was handed on (ServerStreamer).
type ServerStreamOf[Req, Resp any] struct{ *ServerStream }

// Recv returns the next request, or io.EOF once the client half-closed.
func (s ServerStreamOf[Req, Resp]) Recv() (*Req, error) {
	m := new(Req)
	if err := s.stream().RecvMsg(any(m).(proto.Message)); err != nil {
		return nil, err
	}
	return m, nil
}

// Send sends one response.
func (s ServerStreamOf[Req, Resp]) Send(m *Resp) error {
	return s.stream().SendMsg(any(m).(proto.Message))
}

// SendMsg sends one response (through the interceptors' wrapper, if any).
func (s ServerStreamOf[Req, Resp]) SendMsg(m proto.Message) error { return s.stream().SendMsg(m) }

// RecvMsg receives the next request into m (through the interceptors' wrapper, if any).
func (s ServerStreamOf[Req, Resp]) RecvMsg(m proto.Message) error { return s.stream().RecvMsg(m) }

// Context is the call's context (the interceptors' wrapper's, if any).
func (s ServerStreamOf[Req, Resp]) Context() context.Context { return s.stream().Context() }

// SetHeader adds response headers (through the interceptors' wrapper, if any).
func (s ServerStreamOf[Req, Resp]) SetHeader(md Metadata) { s.stream().SetHeader(md) }

// SetTrailer adds trailers (through the interceptors' wrapper, if any).
func (s ServerStreamOf[Req, Resp]) SetTrailer(md Metadata) { s.stream().SetTrailer(md) }

// recvRequest reads the single request of a server-streaming call into req.
func recvRequest(ss *ServerStream, req proto.Message) error {
	if ss.wrapped == nil {
		b, err := ss.recvOne()
		if err != nil {
			return err
		}
		if err := unmarshalRequest(b, req); err != nil {
			return err
		}
		return nil
	}
	if err := ss.wrapped.RecvMsg(req); err != nil {
		if err == io.EOF {
			return &Status{Code: InvalidArgument, Message: "no request message"}
		}
		return err
	}
	if _, err := ss.Recv(); err != io.EOF {
		if err == nil {
			return &Status{Code: InvalidArgument, Message: "more than one request message for a server-streaming method"}
		}
		return err
	}
	return nil
}

// ServerStreaming adapts a typed server-streaming method to a Handler.
func ServerStreaming[Req any, PReq Msg[Req], Resp any](fn func(ctx context.Context, req PReq, stream ServerStreamingServer[Resp]) error) Handler {
	return adapter(func(ss *ServerStream) error {
		req := PReq(new(Req))
		if err := recvRequest(ss, req); err != nil {
			return err
		}
		st := ServerStreamOf[Req, Resp]{ss}
		return fn(st.Context(), req, st)
	}, kindServerStream)
}

// ClientStreaming adapts a typed client-streaming method to a Handler.
func ClientStreaming[Req, Resp any, PResp Msg[Resp]](fn func(ctx context.Context, stream ClientStreamingServer[Req, Resp]) (PResp, error)) Handler {
	return adapter(func(ss *ServerStream) error {
		st := ServerStreamOf[Req, Resp]{ss}
		resp, err := fn(st.Context(), st)
		if err != nil {
			return err
		}
		if ss.wrapped != nil {
			return ss.wrapped.SendMsg(resp)
		}
		return ss.sendMsg(resp, true)
	}, kindClientStream)
}

// BidiStreaming adapts a typed bidirectional method to a Handler.
func BidiStreaming[Req, Resp any](fn func(ctx context.Context, stream BidiStreamingServer[Req, Resp]) error) Handler {
	return adapter(func(ss *ServerStream) error {
		st := ServerStreamOf[Req, Resp]{ss}
		return fn(st.Context(), st)
	}, kindBidi)
}

// ClientStreamOf is a typed view of a ClientStream, both directions: generated clients
// return it as the interface of their call's direction.
type ClientStreamOf[Req, Resp any] struct{ *ClientStream }

// Send sends one request.
func (s ClientStreamOf[Req, Resp]) Send(m *Req) error {
	return s.SendMsg(any(m).(proto.Message))
}

// Recv returns the next response; io.EOF when the call ended with OK, else a *Status.
func (s ClientStreamOf[Req, Resp]) Recv() (*Resp, error) {
	m := new(Resp)
	if err := s.RecvMsg(any(m).(proto.Message)); err != nil {
		return nil, err
	}
	return m, nil
}

// CloseAndRecv half-closes and returns the single response of a client-streaming call.
func (s ClientStreamOf[Req, Resp]) CloseAndRecv() (*Resp, error) {
	if err := s.CloseSend(); err != nil {
		return nil, err
	}
	m, err := s.Recv()
	if err == io.EOF {
		return nil, &Status{Code: Internal, Message: "call ended without a response"}
	}
	if err != nil {
		return nil, err
	}
	var err2 error
	if w := s.ClientStream.w; w != nil { // an interceptor's wrapper sees the end
		err2 = w.RecvMsg(any(new(Resp)).(proto.Message))
	} else {
		_, err2 = s.ClientStream.Recv()
	}
	if err := err2; err != io.EOF {
		if err == nil {
			return nil, &Status{Code: Internal, Message: "more than one response"}
		}
		return nil, err
	}
	return m, nil
}

// NewServerStreamingClient starts a server-streaming call: it sends req and half-closes
// (used by generated clients).
func NewServerStreamingClient[Req, Resp any](ctx context.Context, cc *ClientConn, method string, req *Req, opts ...CallOption) (ServerStreamingClient[Resp], error) {
	s, err := newStreamOf[Req, Resp](ctx, cc, &StreamDesc{ServerStreams: true}, method, req, opts...)
	if err != nil {
		if s.ClientStream != nil {
			s.CancelCall()
		}
		return nil, err
	}
	return s, nil
}

// NewClientStreamingClient starts a client-streaming call (used by generated clients).
func NewClientStreamingClient[Req, Resp any](ctx context.Context, cc *ClientConn, method string, opts ...CallOption) (ClientStreamingClient[Req, Resp], error) {
	s, err := newStreamOf[Req, Resp](ctx, cc, &StreamDesc{ClientStreams: true}, method, nil, opts...)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// NewBidiStreamingClient starts a bidirectional call (used by generated clients).
func NewBidiStreamingClient[Req, Resp any](ctx context.Context, cc *ClientConn, method string, opts ...CallOption) (BidiStreamingClient[Req, Resp], error) {
	s, err := newStreamOf[Req, Resp](ctx, cc, &StreamDesc{ClientStreams: true, ServerStreams: true}, method, nil, opts...)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// NewStreamOf starts a typed streaming call, both directions; with req non-nil it sends it
// and half-closes (server streaming). Generated clients use NewServerStreamingClient,
// NewClientStreamingClient and NewBidiStreamingClient instead.
func NewStreamOf[Req, Resp any](ctx context.Context, cc *ClientConn, method string, req *Req, opts ...CallOption) (ClientStreamOf[Req, Resp], error) {
	return newStreamOf[Req, Resp](ctx, cc, &StreamDesc{ClientStreams: req == nil, ServerStreams: true}, method, req, opts...)
}

func newStreamOf[Req, Resp any](ctx context.Context, cc *ClientConn, desc *StreamDesc, method string, req *Req, opts ...CallOption) (ClientStreamOf[Req, Resp], error) {
	cs, err := cc.openStream(ctx, desc, method, opts...)
	if err != nil {
		return ClientStreamOf[Req, Resp]{}, err
	}
	s := ClientStreamOf[Req, Resp]{cs}
	if req != nil && cs.w != nil {
		if err := cs.w.SendMsg(any(req).(proto.Message)); err != nil && err != io.EOF {
			return s, err
		}
		if err := cs.w.CloseSend(); err != nil {
			return s, err
		}
		return s, nil
	}
	if req != nil {
		b, err := proto.Marshal(any(req).(proto.Message))
		if err != nil {
			cs.CancelCall()
			return s, &Status{Code: Internal, Message: "marshal: " + err.Error()}
		}
		if err := cs.send(b, true); err != nil && err != io.EOF {
			return s, err
		}
	}
	return s, nil
}

// InvokeOf makes a typed unary call.
func InvokeOf[Req any, Resp any, PResp Msg[Resp]](ctx context.Context, cc *ClientConn, method string, req *Req, opts ...CallOption) (PResp, error) {
	resp := PResp(new(Resp))
	if err := cc.Invoke(ctx, method, any(req).(proto.Message), resp, opts...); err != nil {
		return nil, err
	}
	return resp, nil
}
