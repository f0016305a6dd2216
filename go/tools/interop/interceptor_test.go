package interop_test

import (
	"context"
	"fmt"
	"io"
	"reflect"
	"sync"
	"testing"

	"github.com/topspin-rpc/topspin/go/examples/kvstore/kvpb"
	"github.com/topspin-rpc/topspin/go/topspin"
	"google.golang.org/protobuf/proto"
)

// countingClientStream counts a client stream's messages and records its end.
type countingClientStream struct {
	topspin.ClientStreamer
	log        func(string, ...any)
	sent, recv int
}

func (c *countingClientStream) SendMsg(m proto.Message) error {
	c.sent++
	return c.ClientStreamer.SendMsg(m)
}

func (c *countingClientStream) RecvMsg(m proto.Message) error {
	err := c.ClientStreamer.RecvMsg(m)
	switch err {
	case nil:
		c.recv++
	case io.EOF:
		c.log("%s sent=%d recv=%d OK", "end", c.sent, c.recv)
	default:
		c.log("%s sent=%d recv=%d %s", "end", c.sent, c.recv, topspin.CodeOf(err))
	}
	return err
}

// TestGoClientInterceptorsRustServer: the client's interceptors are the client's, whatever
// the server: against the Rust kvstore-server they run in order, see the messages, the
// method and the final code, and wrap a stream to count its messages.
func TestGoClientInterceptorsRustServer(t *testing.T) {
	target := startRust(t, "")
	var mu sync.Mutex
	var got []string
	log := func(f string, args ...any) {
		mu.Lock()
		got = append(got, fmt.Sprintf(f, args...))
		mu.Unlock()
	}
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := got
		got = nil
		return out
	}
	order := func(name string) topspin.UnaryClientInterceptor {
		return func(ctx context.Context, method string, req, reply any, cc *topspin.ClientConn, inv topspin.UnaryInvoker, opts ...topspin.CallOption) error {
			log("%s> %T", name, req)
			err := inv(ctx, method, req, reply, cc, opts...)
			log("%s< %s %s", name, method, topspin.CodeOf(err))
			return err
		}
	}
	count := func(ctx context.Context, desc *topspin.StreamDesc, cc *topspin.ClientConn, method string, st topspin.Streamer, opts ...topspin.CallOption) (topspin.ClientStreamer, error) {
		log("open %s", method)
		cs, err := st(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return &countingClientStream{ClientStreamer: cs, log: log}, nil
	}
	cc, err := topspin.Dial(ctx(t), target, topspin.WithChainUnaryInterceptor(order("a"), order("b")),
		topspin.WithStreamInterceptor(count))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	kv := kvpb.NewStoreClient(cc)
	c := ctx(t)
	if _, err := kv.Put(c, &kvpb.PutRequest{Key: "i", Value: "v"}); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(c, &kvpb.GetRequest{Key: "missing"}); topspin.CodeOf(err) != topspin.NotFound {
		t.Fatal(err)
	}
	want := []string{"a> *kvpb.PutRequest", "b> *kvpb.PutRequest", "b< /kv.v1.Store/Put OK", "a< /kv.v1.Store/Put OK",
		"a> *kvpb.GetRequest", "b> *kvpb.GetRequest", "b< /kv.v1.Store/Get NOT_FOUND", "a< /kv.v1.Store/Get NOT_FOUND"}
	if g := take(); !reflect.DeepEqual(g, want) {
		t.Fatalf("unary: %q, want %q", g, want)
	}
	apply, err := kv.Apply(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"i1", "i2", "i3"} {
		if err := apply.Send(&kvpb.Mutation{Op: &kvpb.Mutation_Put{Put: &kvpb.PutRequest{Key: k, Value: "v"}}}); err != nil {
			t.Fatal(err)
		}
	}
	if sum, err := apply.CloseAndRecv(); err != nil || sum.Puts != 3 {
		t.Fatal(sum, err)
	}
	want = []string{"open /kv.v1.Store/Apply", "end sent=3 recv=1 OK"}
	if g := take(); !reflect.DeepEqual(g, want) {
		t.Fatalf("stream: %q, want %q", g, want)
	}
}
