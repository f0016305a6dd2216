package topspin_test

import (
	"context"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/topspin-rpc/topspin/go/examples/kvstore"
	"github.com/topspin-rpc/topspin/go/examples/kvstore/kvpb"
	"github.com/topspin-rpc/topspin/go/topspin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// trace records what the interceptors saw, in order.
type trace struct {
	mu sync.Mutex
	ev []string
}

func (t *trace) add(format string, args ...any) {
	t.mu.Lock()
	t.ev = append(t.ev, fmt.Sprintf(format, args...))
	t.mu.Unlock()
}

func (t *trace) take() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ev := t.ev
	t.ev = nil
	return ev
}

func denied(ctx context.Context) bool {
	_, ok := topspin.ServerStreamFrom(ctx).Metadata().Get("deny")
	return ok
}

// unaryInterceptors: measure (outermost), a and b (order), a guard that rejects calls
// with "deny" metadata and adds a header and a trailer, and one that adds details to a
// NOT_FOUND status.
func unaryInterceptors(tr *trace) []topspin.Option {
	measure := func(ctx context.Context, req any, info *topspin.UnaryServerInfo, h topspin.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		tr.add("measure %s %s", info.FullMethod, topspin.CodeOf(err))
		return resp, err
	}
	order := func(name string) topspin.UnaryServerInterceptor {
		return func(ctx context.Context, req any, info *topspin.UnaryServerInfo, h topspin.UnaryHandler) (any, error) {
			tr.add("%s> %T", name, req)
			resp, err := h(ctx, req)
			tr.add("%s< %T", name, resp)
			return resp, err
		}
	}
	guard := func(ctx context.Context, req any, info *topspin.UnaryServerInfo, h topspin.UnaryHandler) (any, error) {
		if denied(ctx) {
			return nil, topspin.Errorf(topspin.PermissionDenied, "denied by an interceptor")
		}
		topspin.SetHeader(ctx, topspin.MD("x-intercepted", info.FullMethod))
		topspin.SetTrailer(ctx, topspin.MD("x-trailer", "unary"))
		return h(ctx, req)
	}
	details := func(ctx context.Context, req any, info *topspin.UnaryServerInfo, h topspin.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if topspin.CodeOf(err) == topspin.NotFound {
			st, derr := topspin.StatusOf(err).WithDetails(wrapperspb.String("added by an interceptor"))
			if derr != nil {
				return nil, derr
			}
			return nil, st
		}
		return resp, err
	}
	return []topspin.Option{topspin.ChainUnaryInterceptor(order("a"), order("b"), guard, details),
		topspin.UnaryInterceptor(measure)}
}

// countingStream counts the messages a typed streaming method receives and sends.
type countingStream struct {
	topspin.ServerStreamer
	recv, sent *atomic.Int32
}

func (c countingStream) RecvMsg(m proto.Message) error {
	err := c.ServerStreamer.RecvMsg(m)
	if err == nil {
		c.recv.Add(1)
	}
	return err
}

func (c countingStream) SendMsg(m proto.Message) error {
	c.sent.Add(1)
	return c.ServerStreamer.SendMsg(m)
}

// streamInterceptors: the same roles for streams, and one that wraps the stream to count.
func streamInterceptors(tr *trace) []topspin.Option {
	measure := func(srv any, ss topspin.ServerStreamer, info *topspin.StreamServerInfo, h topspin.StreamHandler) error {
		err := h(srv, ss)
		tr.add("measure %s %s client=%v server=%v", info.FullMethod, topspin.CodeOf(err), info.IsClientStream, info.IsServerStream)
		return err
	}
	order := func(name string) topspin.StreamServerInterceptor {
		return func(srv any, ss topspin.ServerStreamer, info *topspin.StreamServerInfo, h topspin.StreamHandler) error {
			tr.add("%s>", name)
			err := h(srv, ss)
			tr.add("%s<", name)
			return err
		}
	}
	guard := func(srv any, ss topspin.ServerStreamer, info *topspin.StreamServerInfo, h topspin.StreamHandler) error {
		if denied(ss.Context()) {
			return topspin.Errorf(topspin.PermissionDenied, "denied by an interceptor")
		}
		ss.SetHeader(topspin.MD("x-intercepted", info.FullMethod))
		ss.SetTrailer(topspin.MD("x-trailer", "stream"))
		return h(srv, ss)
	}
	count := func(srv any, ss topspin.ServerStreamer, info *topspin.StreamServerInfo, h topspin.StreamHandler) error {
		var recv, sent atomic.Int32
		err := h(srv, countingStream{ss, &recv, &sent})
		tr.add("count recv=%d sent=%d", recv.Load(), sent.Load())
		return err
	}
	return []topspin.Option{topspin.StreamInterceptor(measure),
		topspin.ChainStreamInterceptor(order("a"), order("b"), guard, count)}
}

// icptServer serves the kvstore and two raw methods with the interceptors above on both
// faces, and returns its address.
func icptServer(t *testing.T, tr *trace) string {
	t.Helper()
	s := topspin.NewServer(append(unaryInterceptors(tr), streamInterceptors(tr)...)...)
	kvpb.RegisterStoreServer(s, kvstore.NewStore())
	s.Handle("/t.Raw/Echo", topspin.UnaryRaw(func(_ context.Context, _ topspin.Metadata, req []byte) ([]byte, error) {
		return req, nil
	}), topspin.CodecRaw)
	s.Handle("/t.Raw/Count", func(ss *topspin.ServerStream) error {
		for i := 0; i < 3; i++ {
			if err := ss.Send([]byte{}); err != nil { // an empty message
				return err
			}
		}
		return nil
	}, topspin.CodecProto, topspin.CodecRaw)
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

// result is what a client saw of a call, on either face.
type result struct {
	code    topspin.Code
	header  string // x-intercepted
	trailer string // x-trailer
	details []string
	n       int // messages received
	raw     []byte
}

func detailStrings(ds []*anypb.Any) []string {
	var out []string
	for _, d := range ds {
		v := new(wrapperspb.StringValue)
		if d.UnmarshalTo(v) == nil {
			out = append(out, v.Value)
		}
	}
	return out
}

// faceClient calls the server through one face.
type faceClient interface {
	unary(ctx context.Context, method string, deny bool, req, resp proto.Message) result
	stream(ctx context.Context, method string, deny bool, reqs []proto.Message, newResp func() proto.Message) result
	raw(ctx context.Context, method string, req []byte) result
}

type nativeFace struct{ cc *topspin.ClientConn }

func nativeCtx(ctx context.Context, deny bool) context.Context {
	if deny {
		return topspin.WithOutgoingMetadata(ctx, topspin.MD("deny", "1"))
	}
	return ctx
}

func nativeResult(err error, hdr, trl topspin.Metadata) result {
	r := result{code: topspin.CodeOf(err)}
	r.header, _ = hdr.Get("x-intercepted")
	r.trailer, _ = trl.Get("x-trailer")
	if err != nil {
		r.details = detailStrings(topspin.StatusOf(err).Details())
		if v, ok := topspin.StatusOf(err).Trailers.Get("x-trailer"); ok {
			r.trailer = v
		}
	}
	return r
}

func (f nativeFace) unary(ctx context.Context, method string, deny bool, req, resp proto.Message) result {
	var hdr, trl topspin.Metadata
	err := f.cc.Invoke(nativeCtx(ctx, deny), method, req, resp, topspin.Header(&hdr), topspin.Trailer(&trl))
	return nativeResult(err, hdr, trl)
}

func (f nativeFace) stream(ctx context.Context, method string, deny bool, reqs []proto.Message, newResp func() proto.Message) result {
	cs, err := f.cc.NewStream(nativeCtx(ctx, deny), method)
	if err != nil {
		return nativeResult(err, nil, nil)
	}
	for _, m := range reqs {
		if err := cs.SendMsg(m); err != nil {
			break
		}
	}
	_ = cs.CloseSend()
	n := 0
	for {
		if err = cs.RecvMsg(newResp()); err != nil {
			break
		}
		n++
	}
	if err == io.EOF {
		err = nil
	}
	hdr, _ := cs.Header()
	r := nativeResult(err, hdr, cs.Trailer())
	r.n = n
	return r
}

func (f nativeFace) raw(ctx context.Context, method string, req []byte) result {
	out, err := f.cc.InvokeRaw(ctx, method, req, topspin.WithCodec(topspin.CodecRaw))
	r := nativeResult(err, nil, nil)
	r.raw = out
	return r
}

type grpcFace struct{ cc *grpc.ClientConn }

func grpcCtx(ctx context.Context, deny bool) context.Context {
	if deny {
		return metadata.AppendToOutgoingContext(ctx, "deny", "1")
	}
	return ctx
}

func grpcResult(err error, hdr, trl metadata.MD) result {
	st := status.Convert(err)
	r := result{code: topspin.Code(st.Code()), details: detailStrings(st.Proto().GetDetails())}
	if v := hdr.Get("x-intercepted"); len(v) > 0 {
		r.header = v[0]
	}
	if v := trl.Get("x-trailer"); len(v) > 0 {
		r.trailer = v[0]
	}
	return r
}

func (f grpcFace) unary(ctx context.Context, method string, deny bool, req, resp proto.Message) result {
	var hdr, trl metadata.MD
	err := f.cc.Invoke(grpcCtx(ctx, deny), method, req, resp, grpc.Header(&hdr), grpc.Trailer(&trl))
	return grpcResult(err, hdr, trl)
}

func (f grpcFace) stream(ctx context.Context, method string, deny bool, reqs []proto.Message, newResp func() proto.Message) result {
	cs, err := f.cc.NewStream(grpcCtx(ctx, deny), &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method)
	if err != nil {
		return grpcResult(err, nil, nil)
	}
	for _, m := range reqs {
		if err := cs.SendMsg(m); err != nil {
			break
		}
	}
	_ = cs.CloseSend()
	n := 0
	for {
		if err = cs.RecvMsg(newResp()); err != nil {
			break
		}
		n++
	}
	if err == io.EOF {
		err = nil
	}
	hdr, _ := cs.Header()
	r := grpcResult(err, hdr, cs.Trailer())
	r.n = n
	return r
}

func (f grpcFace) raw(ctx context.Context, method string, req []byte) result {
	var out []byte
	err := f.cc.Invoke(ctx, method, &req, &out, grpc.ForceCodecV2(rawCodec{}))
	r := grpcResult(err, nil, nil)
	r.raw = out
	return r
}

func icptFaces(t *testing.T, addr string) map[string]faceClient {
	cc, err := topspin.Dial(ctx10(t), "tcp://"+addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	gc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gc.Close() })
	return map[string]faceClient{"native": nativeFace{cc}, "grpc": grpcFace{gc}}
}

func expectTrace(t *testing.T, tr *trace, want ...string) {
	t.Helper()
	if got := tr.take(); !reflect.DeepEqual(got, want) {
		t.Fatalf("interceptors saw\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestServerUnaryInterceptors: on both faces, the unary chain runs once per call in
// grpc-go's order around typed (generated) and raw methods, sees the decoded request and
// the response, rejects a call before its handler, adds metadata and status details, and
// a measuring interceptor sees the method and the final code.
func TestServerUnaryInterceptors(t *testing.T) {
	tr := &trace{}
	addr := icptServer(t, tr)
	for name, f := range icptFaces(t, addr) {
		t.Run(name, func(t *testing.T) {
			ctx := ctx10(t)
			key := "k-" + name
			r := f.unary(ctx, "/kv.v1.Store/Put", false, &kvpb.PutRequest{Key: key, Value: "v"}, new(kvpb.PutResponse))
			if r.code != topspin.OK || r.header != "/kv.v1.Store/Put" || r.trailer != "unary" {
				t.Fatalf("put: %+v", r)
			}
			expectTrace(t, tr, "a> *kvpb.PutRequest", "b> *kvpb.PutRequest", "b< *kvpb.PutResponse",
				"a< *kvpb.PutResponse", "measure /kv.v1.Store/Put OK")

			// Rejected: the handler does not run (the key keeps its value).
			r = f.unary(ctx, "/kv.v1.Store/Put", true, &kvpb.PutRequest{Key: key, Value: "w"}, new(kvpb.PutResponse))
			if r.code != topspin.PermissionDenied || r.header != "" {
				t.Fatalf("denied put: %+v", r)
			}
			expectTrace(t, tr, "a> *kvpb.PutRequest", "b> *kvpb.PutRequest", "b< <nil>", "a< <nil>",
				"measure /kv.v1.Store/Put PERMISSION_DENIED")
			entry := new(kvpb.Entry)
			if r = f.unary(ctx, "/kv.v1.Store/Get", false, &kvpb.GetRequest{Key: key}, entry); r.code != topspin.OK || entry.Value != "v" {
				t.Fatalf("get after a denied put: %+v %v", r, entry)
			}
			tr.take()

			// A status changed by an interceptor: details added to the handler's NOT_FOUND.
			r = f.unary(ctx, "/kv.v1.Store/Get", false, &kvpb.GetRequest{Key: "nope"}, new(kvpb.Entry))
			if r.code != topspin.NotFound || !reflect.DeepEqual(r.details, []string{"added by an interceptor"}) || r.trailer != "unary" {
				t.Fatalf("get of a missing key: %+v", r)
			}
			expectTrace(t, tr, "a> *kvpb.GetRequest", "b> *kvpb.GetRequest", "b< <nil>", "a< <nil>",
				"measure /kv.v1.Store/Get NOT_FOUND")

			// UnaryRaw: the chain sees []byte.
			if r = f.raw(ctx, "/t.Raw/Echo", []byte("hi")); r.code != topspin.OK || string(r.raw) != "hi" {
				t.Fatalf("raw echo: %+v", r)
			}
			expectTrace(t, tr, "a> []uint8", "b> []uint8", "b< []uint8", "a< []uint8", "measure /t.Raw/Echo OK")
		})
	}
}

func putMutation(key string) proto.Message {
	return &kvpb.Mutation{Op: &kvpb.Mutation_Put{Put: &kvpb.PutRequest{Key: key, Value: "v"}}}
}

// TestServerStreamInterceptors: on both faces, the stream chain runs once per streaming
// call in grpc-go's order, with the call's kind; a wrapper of the stream counts what the
// generated methods receive and send; a rejected call never reaches its handler; the
// interceptors' header and trailer reach the client; raw Handlers run inside the chain.
func TestServerStreamInterceptors(t *testing.T) {
	tr := &trace{}
	addr := icptServer(t, tr)
	newSummary := func() proto.Message { return new(kvpb.ApplySummary) }
	newEntry := func() proto.Message { return new(kvpb.Entry) }
	for name, f := range icptFaces(t, addr) {
		t.Run(name, func(t *testing.T) {
			ctx := ctx10(t)
			k := func(i int) string { return fmt.Sprintf("s-%s-%d", name, i) }
			r := f.stream(ctx, "/kv.v1.Store/Apply", false, []proto.Message{putMutation(k(1)), putMutation(k(2)), putMutation(k(3))}, newSummary)
			if r.code != topspin.OK || r.n != 1 || r.header != "/kv.v1.Store/Apply" || r.trailer != "stream" {
				t.Fatalf("apply: %+v", r)
			}
			expectTrace(t, tr, "a>", "b>", "count recv=3 sent=1", "b<", "a<",
				"measure /kv.v1.Store/Apply OK client=true server=false")

			gets := []proto.Message{&kvpb.GetRequest{Key: k(1)}, &kvpb.GetRequest{Key: k(3)}}
			if r = f.stream(ctx, "/kv.v1.Store/GetMany", false, gets, newEntry); r.code != topspin.OK || r.n != 2 {
				t.Fatalf("get many: %+v", r)
			}
			expectTrace(t, tr, "a>", "b>", "count recv=2 sent=2", "b<", "a<",
				"measure /kv.v1.Store/GetMany OK client=true server=true")

			// Rejected: Apply's handler does not run (the key stays absent).
			r = f.stream(ctx, "/kv.v1.Store/Apply", true, []proto.Message{putMutation(k(4))}, newSummary)
			if r.code != topspin.PermissionDenied || r.n != 0 {
				t.Fatalf("denied apply: %+v", r)
			}
			expectTrace(t, tr, "a>", "b>", "b<", "a<", "measure /kv.v1.Store/Apply PERMISSION_DENIED client=true server=false")
			if r = f.unary(ctx, "/kv.v1.Store/Get", false, &kvpb.GetRequest{Key: k(4)}, new(kvpb.Entry)); r.code != topspin.NotFound {
				t.Fatalf("get after a denied apply: %+v", r)
			}
			tr.take()
			r = f.stream(ctx, "/kv.v1.Store/Watch", true, []proto.Message{&kvpb.WatchRequest{}}, newEntry)
			if r.code != topspin.PermissionDenied {
				t.Fatalf("denied watch: %+v", r)
			}
			expectTrace(t, tr, "a>", "b>", "b<", "a<", "measure /kv.v1.Store/Watch PERMISSION_DENIED client=false server=true")

			// A raw Handler runs inside the chain (of any kind: both flags). It reads and
			// writes its *ServerStream itself, so a wrapper does not see its messages.
			if r = f.stream(ctx, "/t.Raw/Count", false, nil, newSummary); r.code != topspin.OK || r.n != 3 || r.header != "/t.Raw/Count" {
				t.Fatalf("raw count: %+v", r)
			}
			expectTrace(t, tr, "a>", "b>", "count recv=0 sent=0", "b<", "a<",
				"measure /t.Raw/Count OK client=true server=true")
		})
	}
}

// TestUnaryInterceptorMisuse: an interceptor that passes on a request of another type, or
// returns no response without an error, ends the call INTERNAL naming it; one that panics
// ends it INTERNAL too.
func TestUnaryInterceptorMisuse(t *testing.T) {
	misuse := func(ctx context.Context, req any, info *topspin.UnaryServerInfo, h topspin.UnaryHandler) (any, error) {
		switch string(req.([]byte)) {
		case "swap":
			return h(ctx, "not bytes")
		case "nothing":
			return nil, nil
		case "panic":
			panic("in an interceptor")
		}
		return h(ctx, req)
	}
	s := topspin.NewServer(topspin.UnaryInterceptor(misuse))
	s.Handle("/t.Raw/Echo", topspin.UnaryRaw(func(_ context.Context, _ topspin.Metadata, req []byte) ([]byte, error) {
		return req, nil
	}), topspin.CodecRaw)
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	cc, err := topspin.Dial(ctx10(t), "tcp://"+l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for req, want := range map[string]string{"swap": "passed string", "nothing": "returned <nil>", "panic": "panicked"} {
		_, err := cc.InvokeRaw(ctx10(t), "/t.Raw/Echo", []byte(req), topspin.WithCodec(topspin.CodecRaw))
		if st := topspin.StatusOf(err); st == nil || st.Code != topspin.Internal || !strings.Contains(st.Message, want) {
			t.Fatalf("%s: %v", req, err)
		}
	}
	if out, err := cc.InvokeRaw(ctx10(t), "/t.Raw/Echo", []byte("ok"), topspin.WithCodec(topspin.CodecRaw)); err != nil || string(out) != "ok" {
		t.Fatal(out, err)
	}
}
