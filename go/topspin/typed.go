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

// ServerStreamOf is a typed view of a ServerStream (used by generated code).
type ServerStreamOf[Req, Resp any] struct{ *ServerStream }

// Recv returns the next request, or io.EOF once the client half-closed.
func (s ServerStreamOf[Req, Resp]) Recv() (*Req, error) {
	m := new(Req)
	if err := s.RecvMsg(any(m).(proto.Message)); err != nil {
		return nil, err
	}
	return m, nil
}

// Send sends one response.
func (s ServerStreamOf[Req, Resp]) Send(m *Resp) error {
	return s.SendMsg(any(m).(proto.Message))
}

// ServerStreaming adapts a typed server-streaming method to a Handler.
func ServerStreaming[Req any, PReq Msg[Req], Resp any](fn func(ctx context.Context, req PReq, stream ServerStreamOf[Req, Resp]) error) Handler {
	return func(ss *ServerStream) error {
		b, err := ss.recvOne()
		if err != nil {
			return err
		}
		req := PReq(new(Req))
		if err := proto.Unmarshal(b, req); err != nil {
			return &Status{Code: InvalidArgument, Message: "unmarshal: " + err.Error()}
		}
		return fn(ss, req, ServerStreamOf[Req, Resp]{ss})
	}
}

// ClientStreaming adapts a typed client-streaming method to a Handler.
func ClientStreaming[Req, Resp any, PResp Msg[Resp]](fn func(ctx context.Context, stream ServerStreamOf[Req, Resp]) (PResp, error)) Handler {
	return func(ss *ServerStream) error {
		resp, err := fn(ss, ServerStreamOf[Req, Resp]{ss})
		if err != nil {
			return err
		}
		b, err := proto.Marshal(resp)
		if err != nil {
			return &Status{Code: Internal, Message: "marshal: " + err.Error()}
		}
		return ss.send(b, true)
	}
}

// BidiStreaming adapts a typed bidirectional method to a Handler.
func BidiStreaming[Req, Resp any](fn func(ctx context.Context, stream ServerStreamOf[Req, Resp]) error) Handler {
	return func(ss *ServerStream) error {
		return fn(ss, ServerStreamOf[Req, Resp]{ss})
	}
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
	if _, err := s.ClientStream.Recv(); err != io.EOF {
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
	cs, err := cc.NewStream(ctx, method, opts...)
	if err != nil {
		return ClientStreamOf[Req, Resp]{}, err
	}
	s := ClientStreamOf[Req, Resp]{cs}
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
