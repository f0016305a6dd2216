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

// ServerStreamOf is a typed view of a ServerStream (used by generated code). Its methods
// go through a stream interceptor's wrapper when one was handed on (ServerStreamer).
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
		if err := proto.Unmarshal(b, req); err != nil {
			return &Status{Code: InvalidArgument, Message: "unmarshal: " + err.Error()}
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
func ServerStreaming[Req any, PReq Msg[Req], Resp any](fn func(ctx context.Context, req PReq, stream ServerStreamOf[Req, Resp]) error) Handler {
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
func ClientStreaming[Req, Resp any, PResp Msg[Resp]](fn func(ctx context.Context, stream ServerStreamOf[Req, Resp]) (PResp, error)) Handler {
	return adapter(func(ss *ServerStream) error {
		st := ServerStreamOf[Req, Resp]{ss}
		resp, err := fn(st.Context(), st)
		if err != nil {
			return err
		}
		if ss.wrapped != nil {
			return ss.wrapped.SendMsg(resp)
		}
		b, err := proto.Marshal(resp)
		if err != nil {
			return &Status{Code: Internal, Message: "marshal: " + err.Error()}
		}
		return ss.send(b, true)
	}, kindClientStream)
}

// BidiStreaming adapts a typed bidirectional method to a Handler.
func BidiStreaming[Req, Resp any](fn func(ctx context.Context, stream ServerStreamOf[Req, Resp]) error) Handler {
	return adapter(func(ss *ServerStream) error {
		st := ServerStreamOf[Req, Resp]{ss}
		return fn(st.Context(), st)
	}, kindBidi)
}

// ClientStreamOf is a typed view of a ClientStream (used by generated code).
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

// NewStreamOf starts a typed streaming call; with req non-nil it sends it and half-closes
// (server streaming).
func NewStreamOf[Req, Resp any](ctx context.Context, cc *ClientConn, method string, req *Req, opts ...CallOption) (ClientStreamOf[Req, Resp], error) {
	desc := &StreamDesc{ClientStreams: req == nil, ServerStreams: true}
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
