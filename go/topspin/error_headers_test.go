package topspin_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/topspin-rpc/topspin/go/topspin"
	"github.com/topspin-rpc/topspin/go/wire"
)

// failure is the status the handlers below fail with: response headers and trailers.
func failure() *topspin.Status {
	return &topspin.Status{Code: topspin.Unavailable, Message: "draining",
		Headers: topspin.MD("early", "yes"), Trailers: topspin.MD("late", "no")}
}

// errorHeadersServer serves methods that fail with response headers (protocol.md §5.4), over
// TCP; the listener's address is returned too, for the gRPC face.
func errorHeadersServer(t *testing.T) (target string, addr string) {
	t.Helper()
	s := topspin.NewServer()
	s.Handle("/e.S/Fail", topspin.UnaryRaw(func(ctx context.Context, md topspin.Metadata, _ []byte) ([]byte, error) {
		if n, ok := md.Get("big"); ok { // headers over a small client limit
			st := failure()
			st.Headers = topspin.MD("big", strings.Repeat("x", len(n)*100))
			return nil, st
		}
		return nil, failure()
	}), topspin.CodecRaw)
	s.Handle("/e.S/SetThenFail", topspin.UnaryRaw(func(ctx context.Context, _ topspin.Metadata, _ []byte) ([]byte, error) {
		topspin.ServerStreamFrom(ctx).SetHeader(topspin.MD("set", "1"))
		return nil, failure()
	}), topspin.CodecRaw)
	s.Handle("/e.S/StreamFail", func(ss *topspin.ServerStream) error { // server streaming, no message
		if _, err := ss.Recv(); err != nil {
			return err
		}
		return failure()
	}, topspin.CodecRaw)
	s.Handle("/e.S/SentThenFail", func(ss *topspin.ServerStream) error { // headers went with a message
		if _, err := ss.Recv(); err != nil {
			return err
		}
		ss.SetHeader(topspin.MD("first", "1"))
		if err := ss.Send([]byte("one")); err != nil {
			return err
		}
		return failure()
	}, topspin.CodecRaw)
	s.Handle("/e.S/SumFail", func(ss *topspin.ServerStream) error { // client streaming
		for {
			if _, err := ss.Recv(); err == io.EOF {
				return failure()
			} else if err != nil {
				return err
			}
		}
	}, topspin.CodecRaw)
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return "tcp://" + l.Addr().String(), l.Addr().String()
}

// wantFailure checks err is failure() and that its response headers are want.
func wantFailure(t *testing.T, what string, err error, want topspin.Metadata) {
	t.Helper()
	var st *topspin.Status
	if !errors.As(err, &st) || st.Code != topspin.Unavailable || st.Message != "draining" {
		t.Fatalf("%s: %v", what, err)
	}
	if v, _ := st.Trailers.Get("late"); v != "no" || hasKey(st.Trailers, "early") {
		t.Fatalf("%s: trailers %v", what, st.Trailers)
	}
	if len(st.Headers) != len(want) {
		t.Fatalf("%s: headers %v, want %v", what, st.Headers, want)
	}
	for i := range want {
		if st.Headers[i] != want[i] {
			t.Fatalf("%s: headers %v, want %v", what, st.Headers, want)
		}
	}
}

// A failing unary call's response headers reach the client on its *Status (protocol.md
// §5.4), apart from its trailers; headers the handler set come first; a call that sent no
// headers has none.
func TestFailedUnaryCallKeepsItsHeaders(t *testing.T) {
	target, _ := errorHeadersServer(t)
	cc := dial(t, target)
	_, err := cc.InvokeRaw(ctx10(t), "/e.S/Fail", []byte("x"), raw)
	wantFailure(t, "unary", err, topspin.MD("early", "yes"))

	var hdr topspin.Metadata
	_, err = cc.InvokeRaw(ctx10(t), "/e.S/SetThenFail", []byte("x"), raw, topspin.Header(&hdr))
	wantFailure(t, "SetHeader, then a status with headers", err, topspin.MD("set", "1", "early", "yes"))
	if v, _ := hdr.Get("early"); v != "yes" {
		t.Fatalf("the Header call option: %v", hdr)
	}

	// A failing call without headers still has none.
	_, plain := testServer(t, "tcp")
	_, err = dial(t, plain).InvokeRaw(topspin.WithOutgoingMetadata(ctx10(t), topspin.MD("fail", "5")), "/t.S/Echo", []byte("x"), raw)
	if st := topspin.StatusOf(err); st.Code != topspin.NotFound || len(st.Headers) != 0 {
		t.Fatalf("no headers: %v %v", err, st.Headers)
	}
}

// Client streaming: the status of CloseSend then Recv keeps the headers.
func TestFailedClientStreamKeepsItsHeaders(t *testing.T) {
	target, _ := errorHeadersServer(t)
	cc := dial(t, target)
	cs, err := cc.NewStream(ctx10(t), "/e.S/SumFail", raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"1", "2"} {
		if err := cs.Send([]byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	_, err = cs.Recv()
	wantFailure(t, "client streaming", err, topspin.MD("early", "yes"))
}

// A response stream that fails: Header gives the headers sent before the END, the error has
// them too; headers already sent with a message are not sent again (the status's are dropped).
func TestFailedServerStreamHeaders(t *testing.T) {
	target, _ := errorHeadersServer(t)
	cc := dial(t, target)
	cs, err := cc.NewStream(ctx10(t), "/e.S/StreamFail", raw)
	if err == nil {
		err = cs.Send([]byte("x"))
	}
	if err == nil {
		err = cs.CloseSend()
	}
	if err != nil {
		t.Fatal(err)
	}
	h, err := cs.Header()
	if v, _ := h.Get("early"); err != nil || v != "yes" {
		t.Fatalf("Header: %v %v", h, err)
	}
	_, err = cs.Recv()
	wantFailure(t, "server streaming", err, topspin.MD("early", "yes"))

	cs, err = cc.NewStream(ctx10(t), "/e.S/SentThenFail", raw)
	if err == nil {
		err = cs.Send([]byte("x"))
	}
	if err == nil {
		err = cs.CloseSend()
	}
	if err != nil {
		t.Fatal(err)
	}
	if m, err := cs.Recv(); err != nil || string(m) != "one" {
		t.Fatalf("first message: %q %v", m, err)
	}
	_, err = cs.Recv()
	wantFailure(t, "headers sent with a message", err, topspin.MD("first", "1"))
}

// Headers over the client's metadata limit are not sent: the END goes alone, with its code
// (as the Rust server, protocol.md §9).
func TestFailedCallHeadersOverTheClientsLimit(t *testing.T) {
	target, _ := errorHeadersServer(t)
	set := wire.DefaultSettings()
	set.MaxMetadataSize = 512
	cc := dial(t, target, topspin.WithSettings(set))
	ctx := topspin.WithOutgoingMetadata(ctx10(t), topspin.MD("big", "0123456789")) // 1000-byte header
	_, err := cc.InvokeRaw(ctx, "/e.S/Fail", []byte("x"), raw)
	wantFailure(t, "headers over the limit", err, nil)
	// The connection goes on.
	_, err = cc.InvokeRaw(ctx10(t), "/e.S/Fail", []byte("x"), raw)
	wantFailure(t, "after", err, topspin.MD("early", "yes"))
}

// The gRPC face: a status with headers is answered with HEADERS, then the trailers
// (protocol.md §5.4), which a grpc-go client reads with grpc.Header.
func TestGRPCFaceFailedCallHeaders(t *testing.T) {
	_, addr := errorHeadersServer(t)
	cc := grpcClient(t, "tcp", addr)
	var hdr, trl metadata.MD
	_, err := unary(ctx10(t), cc, "/e.S/Fail", []byte("x"), grpc.Header(&hdr), grpc.Trailer(&trl))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("gRPC face: %v", err)
	}
	if got := hdr.Get("early"); len(got) != 1 || got[0] != "yes" {
		t.Fatalf("gRPC face headers: %v", hdr)
	}
	if got := trl.Get("late"); len(got) != 1 || got[0] != "no" || len(trl.Get("early")) != 0 {
		t.Fatalf("gRPC face trailers: %v", trl)
	}
}

func hasKey(md topspin.Metadata, key string) bool {
	_, ok := md.Get(key)
	return ok
}
