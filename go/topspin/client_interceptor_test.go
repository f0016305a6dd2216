package topspin_test

import (
	"context"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/topspin-rpc/topspin/go/examples/kvstore/kvpb"
	"github.com/topspin-rpc/topspin/go/topspin"
	"google.golang.org/protobuf/proto"
)

// clientCounting counts the messages a client stream sends and receives.
type clientCounting struct {
	topspin.ClientStreamer
	tr         *trace
	sent, recv atomic.Int32
}

func (c *clientCounting) SendMsg(m proto.Message) error {
	c.sent.Add(1)
	return c.ClientStreamer.SendMsg(m)
}

func (c *clientCounting) RecvMsg(m proto.Message) error {
	err := c.ClientStreamer.RecvMsg(m)
	switch {
	case err == nil:
		c.recv.Add(1)
	case err == io.EOF:
		c.tr.add("stream end sent=%d recv=%d OK", c.sent.Load(), c.recv.Load())
	default:
		c.tr.add("stream end sent=%d recv=%d %s", c.sent.Load(), c.recv.Load(), topspin.CodeOf(err))
	}
	return err
}

// clientInterceptors: measure (outermost), a and b (order), one that adds metadata (deny
// when the context asks: the server's guard then rejects the call) and reads the status
// details; for streams, one that wraps the stream to count.
func clientInterceptors(tr *trace) []topspin.Option {
	measure := func(ctx context.Context, method string, req, reply any, cc *topspin.ClientConn, inv topspin.UnaryInvoker, opts ...topspin.CallOption) error {
		err := inv(ctx, method, req, reply, cc, opts...)
		tr.add("measure %s %s", method, topspin.CodeOf(err))
		return err
	}
	order := func(name string) topspin.UnaryClientInterceptor {
		return func(ctx context.Context, method string, req, reply any, cc *topspin.ClientConn, inv topspin.UnaryInvoker, opts ...topspin.CallOption) error {
			tr.add("%s> %T %T", name, req, reply)
			err := inv(ctx, method, req, reply, cc, opts...)
			tr.add("%s<", name)
			return err
		}
	}
	md := func(ctx context.Context, method string, req, reply any, cc *topspin.ClientConn, inv topspin.UnaryInvoker, opts ...topspin.CallOption) error {
		if ctx.Value(denyKey{}) != nil {
			ctx = topspin.WithOutgoingMetadata(ctx, topspin.MD("deny", "1"))
		}
		err := inv(ctx, method, req, reply, cc, opts...)
		if st := topspin.StatusOf(err); st != nil && len(st.Details()) > 0 {
			tr.add("details %s", strings.Join(detailStrings(st.Details()), ","))
		}
		return err
	}
	smeasure := func(ctx context.Context, desc *topspin.StreamDesc, cc *topspin.ClientConn, method string, st topspin.Streamer, opts ...topspin.CallOption) (topspin.ClientStreamer, error) {
		tr.add("open %s %s client=%v server=%v", method, desc.StreamName, desc.ClientStreams, desc.ServerStreams)
		return st(ctx, desc, cc, method, opts...)
	}
	count := func(ctx context.Context, desc *topspin.StreamDesc, cc *topspin.ClientConn, method string, st topspin.Streamer, opts ...topspin.CallOption) (topspin.ClientStreamer, error) {
		if ctx.Value(denyKey{}) != nil {
			ctx = topspin.WithOutgoingMetadata(ctx, topspin.MD("deny", "1"))
		}
		cs, err := st(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return &clientCounting{ClientStreamer: cs, tr: tr}, nil
	}
	return []topspin.Option{topspin.WithChainUnaryInterceptor(order("a"), order("b"), md),
		topspin.WithUnaryInterceptor(measure), topspin.WithStreamInterceptor(smeasure),
		topspin.WithChainStreamInterceptor(count)}
}

type denyKey struct{}

// TestClientInterceptors: a client's interceptors run in grpc-go's order around the
// generated client's calls, Invoke and InvokeRaw (seeing the messages or the bytes), add
// metadata the server acts on, read a status's details, and wrap streams (NewStream and
// the generated client's) to count their messages.
func TestClientInterceptors(t *testing.T) {
	str := &trace{}
	addr := icptServer(t, str)
	tr := &trace{}
	cc, err := topspin.Dial(ctx10(t), "tcp://"+addr, clientInterceptors(tr)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	kv := kvpb.NewStoreClient(cc)
	ctx := ctx10(t)
	if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: "c", Value: "v"}); err != nil {
		t.Fatal(err)
	}
	expectTrace(t, tr, "a> *kvpb.PutRequest *kvpb.PutResponse", "b> *kvpb.PutRequest *kvpb.PutResponse",
		"b<", "a<", "measure /kv.v1.Store/Put OK")

	// The server's status, with the details its interceptor added.
	if _, err := kv.Get(ctx, &kvpb.GetRequest{Key: "nope"}); topspin.CodeOf(err) != topspin.NotFound {
		t.Fatal(err)
	}
	expectTrace(t, tr, "a> *kvpb.GetRequest *kvpb.Entry", "b> *kvpb.GetRequest *kvpb.Entry",
		"details added by an interceptor", "b<", "a<", "measure /kv.v1.Store/Get NOT_FOUND")

	// Metadata added by an interceptor: the server's guard rejects the call.
	deny := context.WithValue(ctx, denyKey{}, true)
	if _, err := kv.Put(deny, &kvpb.PutRequest{Key: "c", Value: "w"}); topspin.CodeOf(err) != topspin.PermissionDenied {
		t.Fatal(err)
	}
	tr.take()

	// Invoke and InvokeRaw go through the same chain.
	if err := cc.Invoke(ctx, "/kv.v1.Store/Get", &kvpb.GetRequest{Key: "c"}, new(kvpb.Entry)); err != nil {
		t.Fatal(err)
	}
	expectTrace(t, tr, "a> *kvpb.GetRequest *kvpb.Entry", "b> *kvpb.GetRequest *kvpb.Entry", "b<", "a<",
		"measure /kv.v1.Store/Get OK")
	if out, err := cc.InvokeRaw(ctx, "/t.Raw/Echo", []byte("hi"), topspin.WithCodec(topspin.CodecRaw)); err != nil || string(out) != "hi" {
		t.Fatal(out, err)
	}
	expectTrace(t, tr, "a> []uint8 *[]uint8", "b> []uint8 *[]uint8", "b<", "a<", "measure /t.Raw/Echo OK")
	testClientStreamInterceptors(t, cc, tr)
}

func testClientStreamInterceptors(t *testing.T, cc *topspin.ClientConn, tr *trace) {
	ctx := ctx10(t)
	kv := kvpb.NewStoreClient(cc)
	apply, err := kv.Apply(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"c1", "c2"} {
		if err := apply.Send(&kvpb.Mutation{Op: &kvpb.Mutation_Put{Put: &kvpb.PutRequest{Key: k, Value: "v"}}}); err != nil {
			t.Fatal(err)
		}
	}
	if sum, err := apply.CloseAndRecv(); err != nil || sum.Puts != 2 {
		t.Fatal(sum, err)
	}
	expectTrace(t, tr, "open /kv.v1.Store/Apply Apply client=true server=false", "stream end sent=2 recv=1 OK")

	watch, err := kv.Watch(ctx, &kvpb.WatchRequest{IncludeExisting: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatal(err)
	}
	watch.CancelCall()
	for err == nil { // entries already received may come first
		_, err = watch.Recv()
	}
	if topspin.CodeOf(err) != topspin.Canceled {
		t.Fatal(err)
	}
	got := tr.take()
	if len(got) != 2 || got[0] != "open /kv.v1.Store/Watch Watch client=false server=true" ||
		!strings.HasPrefix(got[1], "stream end sent=1 recv=") || !strings.HasSuffix(got[1], " CANCELLED") {
		t.Fatalf("watch: %q", got)
	}

	// Rejected by the server because of the interceptor's metadata.
	apply, err = kv.Apply(context.WithValue(ctx, denyKey{}, true))
	if err != nil {
		t.Fatal(err)
	}
	_ = apply.Send(&kvpb.Mutation{Op: &kvpb.Mutation_Put{Put: &kvpb.PutRequest{Key: "c3", Value: "v"}}})
	if _, err := apply.CloseAndRecv(); topspin.CodeOf(err) != topspin.PermissionDenied {
		t.Fatal(err)
	}
	expectTrace(t, tr, "open /kv.v1.Store/Apply Apply client=true server=false", "stream end sent=1 recv=0 PERMISSION_DENIED")

	// NewStream returns the wrapped stream.
	cs, err := cc.NewStream(ctx, "/kv.v1.Store/GetMany")
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(&kvpb.GetRequest{Key: "c1"}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for err == nil {
		err = cs.RecvMsg(new(kvpb.Entry))
	}
	if err != io.EOF {
		t.Fatal(err)
	}
	expectTrace(t, tr, "open /kv.v1.Store/GetMany GetMany client=true server=true", "stream end sent=1 recv=1 OK")
}
