package topspin_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
	"github.com/topspin-rpc/topspin/go/wire"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// rawCodec lets a grpc-go client send and receive raw bytes (content-type application/grpc).
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// faceServer serves handlers for the gRPC face tests on network ("tcp", "unix", "tls") and
// returns the server and its listener's address (a TCP address, or the socket path).
func faceServer(t *testing.T, network string, opts ...topspin.Option) (*topspin.Server, string) {
	t.Helper()
	s := topspin.NewServer(opts...)
	faceHandlers(s)
	var l net.Listener
	var err error
	addr := ""
	switch network {
	case "unix":
		addr = filepath.Join(t.TempDir(), "f.sock")
		l, err = topspin.Listen("unix://"+addr, opts...)
	case "tls":
		l, err = topspin.Listen("tls://127.0.0.1:0", opts...)
	default:
		l, err = topspin.Listen("tcp://127.0.0.1:0", opts...)
	}
	if err != nil {
		t.Fatal(err)
	}
	if addr == "" {
		addr = l.Addr().String()
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return s, addr
}

// faceHandlers registers the test methods (raw bytes) on s.
func faceHandlers(s *topspin.Server) {
	s.Handle("/f.S/Echo", topspin.UnaryRaw(func(ctx context.Context, md topspin.Metadata, req []byte) ([]byte, error) {
		ss := topspin.ServerStreamFrom(ctx)
		if v, ok := md.Get("user"); ok {
			ss.SetHeader(topspin.MD("hello", v))
			ss.SetTrailer(topspin.MD("bye", v))
		}
		if v, ok := md.Get("blob-bin"); ok {
			ss.SetHeader(topspin.MD("blob-bin", v+"\xff"))
		}
		if v, ok := md.Get("fail"); ok {
			code, _ := strconv.Atoi(v)
			st, err := (&topspin.Status{Code: topspin.Code(code), Message: "failing as asked",
				Trailers: topspin.MD("why", "asked")}).WithDetails(wrapperspb.String("a detail"))
			if err != nil {
				return nil, err
			}
			return nil, st
		}
		return req, nil
	}), topspin.CodecRaw)
	s.Handle("/f.S/Count", func(ss *topspin.ServerStream) error {
		req, err := ss.Recv()
		if err != nil {
			return err
		}
		n, _ := strconv.Atoi(string(req))
		for i := 0; i < n; i++ {
			if err := ss.Send([]byte(strconv.Itoa(i))); err != nil {
				return err
			}
		}
		return nil
	}, topspin.CodecRaw)
	s.Handle("/f.S/Sum", func(ss *topspin.ServerStream) error {
		sum := 0
		for {
			m, err := ss.Recv()
			if err == io.EOF {
				return ss.Send([]byte(strconv.Itoa(sum)))
			}
			if err != nil {
				return err
			}
			v, _ := strconv.Atoi(string(m))
			sum += v
		}
	}, topspin.CodecRaw)
	s.Handle("/f.S/Bidi", func(ss *topspin.ServerStream) error {
		for {
			m, err := ss.Recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if err := ss.Send(append([]byte("re:"), m...)); err != nil {
				return err
			}
		}
	}, topspin.CodecRaw)
	s.Handle("/f.S/Wait", func(ss *topspin.ServerStream) error {
		if _, ok := ss.Deadline(); !ok {
			return topspin.Errorf(topspin.FailedPrecondition, "no deadline")
		}
		<-ss.Done()
		return ss.Err()
	}, topspin.CodecRaw)
	s.Handle("/f.S/Hold", topspin.UnaryRaw(func(ctx context.Context, _ topspin.Metadata, _ []byte) ([]byte, error) {
		<-ctx.Done() // holds its request until the client cancels
		return nil, ctx.Err()
	}), topspin.CodecRaw)
	s.Handle("/f.S/Who", topspin.UnaryRaw(func(ctx context.Context, _ topspin.Metadata, _ []byte) ([]byte, error) {
		ss := topspin.ServerStreamFrom(ctx)
		return []byte(fmt.Sprintf("tls=%v peer=%v", ss.TLS() != nil, ss.Peer() != nil)), nil
	}), topspin.CodecRaw)
}

// grpcClient is a grpc-go client of addr ("unix" network: a socket path), raw bytes.
func grpcClient(t *testing.T, network, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	target := "passthrough:///" + addr
	if network == "unix" {
		target = "unix://" + addr
	}
	opts = append([]grpc.DialOption{grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})),
		grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	cc, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func unary(ctx context.Context, cc *grpc.ClientConn, method string, req []byte, opts ...grpc.CallOption) ([]byte, error) {
	var out []byte
	err := cc.Invoke(ctx, method, &req, &out, opts...)
	return out, err
}

var streamDesc = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// Every call kind over TCP, a Unix socket and TLS (ALPN h2), on the port native clients use.
func TestGRPCFaceCallKinds(t *testing.T) {
	srvCfg, cliCfg, _ := tlsPair(t)
	for _, network := range []string{"tcp", "unix", "tls"} {
		t.Run(network, func(t *testing.T) {
			_, addr := faceServer(t, network, topspin.WithTLS(srvCfg))
			var opts []grpc.DialOption
			if network == "tls" {
				opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cliCfg)))
			}
			cc := grpcClient(t, network, addr, opts...)
			ctx := ctx10(t)
			if out, err := unary(ctx, cc, "/f.S/Echo", []byte("hi")); err != nil || string(out) != "hi" {
				t.Fatalf("unary: %q %v", out, err)
			}
			if out, err := unary(ctx, cc, "/f.S/Who", nil); err != nil || string(out) != fmt.Sprintf("tls=%v peer=true", network == "tls") {
				t.Fatalf("who: %q %v", out, err)
			}
			checkStreams(t, ctx, cc)
			// The native face answers on the same port.
			target := "tcp://" + addr
			switch network {
			case "unix":
				target = "unix://" + addr
			case "tls":
				target = "tls://" + addr
			}
			native := dial(t, target, topspin.WithTLS(cliCfg))
			if out, err := native.InvokeRaw(ctx, "/f.S/Echo", []byte("native"), raw); err != nil || string(out) != "native" {
				t.Fatalf("native on the same port: %q %v", out, err)
			}
		})
	}
}

// checkStreams makes a server-streaming, a client-streaming and a bidi call.
func checkStreams(t *testing.T, ctx context.Context, cc *grpc.ClientConn) {
	t.Helper()
	cs, err := cc.NewStream(ctx, streamDesc, "/f.S/Count")
	if err != nil {
		t.Fatal(err)
	}
	req := []byte("3")
	if err := cs.SendMsg(&req); err != nil {
		t.Fatal(err)
	}
	_ = cs.CloseSend()
	var got []string
	for {
		var m []byte
		if err := cs.RecvMsg(&m); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("count: %v", err)
		}
		got = append(got, string(m))
	}
	if strings.Join(got, ",") != "0,1,2" {
		t.Fatalf("server streaming: %v", got)
	}
	cs, err = cc.NewStream(ctx, streamDesc, "/f.S/Sum")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"1", "2", "39"} {
		b := []byte(v)
		if err := cs.SendMsg(&b); err != nil {
			t.Fatal(err)
		}
	}
	_ = cs.CloseSend()
	var sum []byte
	if err := cs.RecvMsg(&sum); err != nil || string(sum) != "42" {
		t.Fatalf("client streaming: %q %v", sum, err)
	}
	cs, err = cc.NewStream(ctx, streamDesc, "/f.S/Bidi")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"a", "b"} {
		b := []byte(v)
		if err := cs.SendMsg(&b); err != nil {
			t.Fatal(err)
		}
		var m []byte
		if err := cs.RecvMsg(&m); err != nil || string(m) != "re:"+v {
			t.Fatalf("bidi: %q %v", m, err)
		}
	}
	_ = cs.CloseSend()
	var m []byte
	if err := cs.RecvMsg(&m); err != io.EOF {
		t.Fatalf("bidi end: %v", err)
	}
}

// Metadata both ways, a status with trailers and details, a deadline, a message larger than
// 64 KiB, an unknown method.
func TestGRPCFaceMetadataErrorsDeadlines(t *testing.T) {
	_, addr := faceServer(t, "tcp")
	cc := grpcClient(t, "tcp", addr)
	ctx := ctx10(t)

	var header, trailer metadata.MD
	md := metadata.Pairs("user", "ann", "blob-bin", "\x00\x01")
	out, err := unary(metadata.NewOutgoingContext(ctx, md), cc, "/f.S/Echo", []byte("x"), grpc.Header(&header), grpc.Trailer(&trailer))
	if err != nil || string(out) != "x" {
		t.Fatalf("echo: %q %v", out, err)
	}
	if h, tr := header.Get("hello"), trailer.Get("bye"); len(h) != 1 || h[0] != "ann" || len(tr) != 1 || tr[0] != "ann" {
		t.Fatalf("header %v trailer %v", header, trailer)
	}
	if b := header.Get("blob-bin"); len(b) != 1 || b[0] != "\x00\x01\xff" {
		t.Fatalf("binary metadata both ways: %q", b)
	}

	trailer = nil
	_, err = unary(metadata.AppendToOutgoingContext(ctx, "fail", "5"), cc, "/f.S/Echo", nil, grpc.Trailer(&trailer))
	st := status.Convert(err)
	if st.Code() != codes.NotFound || st.Message() != "failing as asked" || len(trailer.Get("why")) != 1 {
		t.Fatalf("error: %v, trailer %v", err, trailer)
	}
	if d := st.Details(); len(d) != 1 || d[0].(*wrapperspb.StringValue).GetValue() != "a detail" {
		t.Fatalf("details: %v", d)
	}
	if len(trailer.Get("topspin-status-details-bin")) != 0 {
		t.Fatalf("the topspin trailer leaked: %v", trailer)
	}

	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := unary(dctx, cc, "/f.S/Wait", nil); status.Code(err) != codes.DeadlineExceeded || time.Since(start) > 5*time.Second {
		t.Fatalf("deadline: %v after %v", err, time.Since(start))
	}

	big := bytes.Repeat([]byte("0123456789abcdef"), 300<<10/16) // 300 KiB
	if out, err := unary(ctx, cc, "/f.S/Echo", big); err != nil || !bytes.Equal(out, big) {
		t.Fatalf("300 KiB echo: %d bytes, %v", len(out), err)
	}
	if _, err := unary(ctx, cc, "/f.S/Nope", nil); status.Code(err) != codes.Unimplemented {
		t.Fatalf("unknown method: %v", err)
	}
}

// headerStats reports the compression of each response's headers.
type headerStats struct{ onIn func(string) }

func (h *headerStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (h *headerStats) HandleRPC(_ context.Context, s stats.RPCStats) {
	if in, ok := s.(*stats.InHeader); ok && in.Client {
		h.onIn(in.Compression)
	}
}
func (h *headerStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (h *headerStats) HandleConn(context.Context, stats.ConnStats) {}

// gzip and zstd: requests decoded, answers in kind; a server WithCompression answers in its
// encoding a client that accepts it.
func TestGRPCFaceCompression(t *testing.T) {
	_, addr := faceServer(t, "tcp")
	var mu sync.Mutex
	var inCompression []string
	cc := grpcClient(t, "tcp", addr, grpc.WithStatsHandler(&headerStats{onIn: func(c string) {
		mu.Lock()
		inCompression = append(inCompression, c)
		mu.Unlock()
	}}))
	ctx := ctx10(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 300<<10/16) // 300 KiB
	for _, comp := range []string{gzip.Name, "zstd"} {
		mu.Lock()
		inCompression = nil
		mu.Unlock()
		if out, err := unary(ctx, cc, "/f.S/Echo", big, grpc.UseCompressor(comp)); err != nil || !bytes.Equal(out, big) {
			t.Fatalf("%s echo: %d bytes, %v", comp, len(out), err)
		}
		mu.Lock()
		if len(inCompression) != 1 || inCompression[0] != comp {
			t.Fatalf("the answer to a %s call came with encoding %v", comp, inCompression)
		}
		mu.Unlock()
		// Streams of several requests, each compressed (the bridge reads gzip's itself).
		checkStreams(t, ctx, grpcClient(t, "tcp", addr, grpc.WithDefaultCallOptions(grpc.UseCompressor(comp))))
	}

	// A server WithCompression("zstd") answers an uncompressed call in zstd (the client
	// accepts it).
	_, zaddr := faceServer(t, "tcp", topspin.WithCompression("zstd"))
	zc := grpcClient(t, "tcp", zaddr, grpc.WithStatsHandler(&headerStats{onIn: func(c string) {
		mu.Lock()
		inCompression = append(inCompression, c)
		mu.Unlock()
	}}))
	mu.Lock()
	inCompression = nil
	mu.Unlock()
	if out, err := unary(ctx, zc, "/f.S/Echo", big); err != nil || !bytes.Equal(out, big) {
		t.Fatalf("echo from a zstd server: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(inCompression) != 1 || inCompression[0] != "zstd" {
		t.Fatalf("a WithCompression(zstd) server answered with encoding %v", inCompression)
	}
}

// The bounds: a message over the native max message size is RESOURCE_EXHAUSTED; gRPC
// connections count toward max_connections (native and gRPC clients over it are refused).
func TestGRPCFaceBounds(t *testing.T) {
	s, addr := faceServer(t, "tcp", topspin.WithMaxMessageSize(64<<10), topspin.WithMaxConnections(2))
	ctx := ctx10(t)
	a := grpcClient(t, "tcp", addr)
	if _, err := unary(ctx, a, "/f.S/Echo", make([]byte, 100<<10)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized message: %v", err)
	}
	if _, err := unary(ctx, a, "/f.S/Echo", make([]byte, 60<<10)); err != nil {
		t.Fatalf("a message under the limit: %v", err)
	}
	for _, comp := range []string{gzip.Name, "zstd"} { // a few hundred bytes on the wire
		if _, err := unary(ctx, a, "/f.S/Echo", make([]byte, 1<<20), grpc.UseCompressor(comp)); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a %s message decompressing past the limit: %v", comp, err)
		}
	}
	b := grpcClient(t, "tcp", addr)
	if _, err := unary(ctx, b, "/f.S/Echo", []byte("b")); err != nil {
		t.Fatal(err)
	}
	if g := s.Gauges(); g.Connections != 2 {
		t.Fatalf("gauges with two gRPC clients: %+v", g)
	}
	c := grpcClient(t, "tcp", addr)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := unary(sctx, c, "/f.S/Echo", []byte("c")); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "max_connections (2)") {
		t.Fatalf("a third gRPC client: %v", err)
	}
	native, err := topspin.Dial(ctx, "tcp://"+addr)
	if err == nil {
		_, err = native.InvokeRaw(ctx, "/f.S/Echo", []byte("n"), raw)
		_ = native.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "max_connections (2)") {
		t.Fatalf("a native client over the limit: %v", err)
	}
	_ = b.Close()
	waitFor(t, func() bool { return s.Gauges().Connections == 1 })
	if _, err := unary(ctx, grpcClient(t, "tcp", addr), "/f.S/Echo", []byte("d")); err != nil {
		t.Fatalf("after a gRPC client left: %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
	}
}

// GracefulStop lets a gRPC call in flight finish and stops both faces; Stop ends gRPC calls
// at once; WithGRPC(false) turns the face off (a gRPC client then fails).
func TestGRPCFaceGracefulStopAndOff(t *testing.T) {
	s, addr := faceServer(t, "tcp")
	cc := grpcClient(t, "tcp", addr)
	ctx := ctx10(t)
	cs, err := cc.NewStream(ctx, streamDesc, "/f.S/Bidi")
	if err != nil {
		t.Fatal(err)
	}
	first := []byte("1")
	var m []byte
	if err := cs.SendMsg(&first); err != nil || cs.RecvMsg(&m) != nil {
		t.Fatalf("bidi: %v", err)
	}
	stopped := make(chan struct{}) // a signal: closed, never sent on
	go func() { s.GracefulStop(); close(stopped) }()
	time.Sleep(100 * time.Millisecond)
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned with a gRPC call open")
	default:
	}
	second := []byte("2")
	if err := cs.SendMsg(&second); err != nil || cs.RecvMsg(&m) != nil || string(m) != "re:2" {
		t.Fatalf("bidi during GracefulStop: %q %v", m, err)
	}
	_ = cs.CloseSend()
	if err := cs.RecvMsg(&m); err != io.EOF {
		t.Fatalf("bidi end: %v", err)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("GracefulStop did not return after the call ended")
	}

	// Stop ends a gRPC call at once.
	s2, addr2 := faceServer(t, "tcp")
	cs, err = grpcClient(t, "tcp", addr2).NewStream(ctx, streamDesc, "/f.S/Bidi")
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(&first); err != nil || cs.RecvMsg(&m) != nil {
		t.Fatalf("bidi: %v", err)
	}
	s2.Stop()
	if err := cs.RecvMsg(&m); status.Code(err) != codes.Unavailable {
		t.Fatalf("a gRPC call when the server stops: %v", err)
	}

	_, off := faceServer(t, "tcp", topspin.WithGRPC(false))
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := unary(sctx, grpcClient(t, "tcp", off), "/f.S/Echo", []byte("x")); err == nil {
		t.Fatal("a gRPC call succeeded with the face off")
	}
	if out, err := dial(t, "tcp://"+off).InvokeRaw(ctx, "/f.S/Echo", []byte("n"), raw); err != nil || string(out) != "n" {
		t.Fatalf("native with the face off: %v", err)
	}
}

// The memory budget: a request a gRPC handler holds is charged to it; while it is spent new
// calls on both faces are RESOURCE_EXHAUSTED; the charge goes when the handler returns.
func TestGRPCFaceChargesTheMemoryBudget(t *testing.T) {
	budget := wire.NewMemoryBudget(100 << 10)
	s, addr := faceServer(t, "tcp", topspin.WithMemoryBudget(budget))
	cc := grpcClient(t, "tcp", addr)
	native := dial(t, "tcp://"+addr)
	ctx := ctx10(t)
	hctx, cancel := context.WithCancel(ctx)
	held := make(chan error, 1)
	go func() { _, err := unary(hctx, cc, "/f.S/Hold", make([]byte, 120<<10)); held <- err }()
	waitFor(t, func() bool { return s.Gauges().ReservedBytes >= 120<<10 })
	if g := s.Gauges(); g.OpenCalls != 1 || g.Connections != 2 {
		t.Fatalf("gauges with a gRPC call held: %+v", g)
	}
	if _, err := unary(ctx, cc, "/f.S/Echo", []byte("x")); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a gRPC call while the budget is spent: %v", err)
	}
	if _, err := native.InvokeRaw(ctx, "/f.S/Echo", []byte("x"), raw); topspin.CodeOf(err) != topspin.ResourceExhausted {
		t.Fatalf("a native call while the budget is spent: %v", err)
	}
	cancel()
	if err := <-held; status.Code(err) != codes.Canceled {
		t.Fatalf("the held call: %v", err)
	}
	waitFor(t, func() bool { return s.Gauges().ReservedBytes == 0 })
	if _, err := unary(ctx, cc, "/f.S/Echo", []byte("x")); err != nil {
		t.Fatalf("a gRPC call after the charge went: %v", err)
	}
}

// Streams per gRPC connection are bounded by WithMaxConcurrentCalls (the client queues the
// others); time bounds: a connection that sends only 'P' is closed within the handshake
// timeout, a silent one gets the native ERROR TIMEOUT, an idle gRPC connection is closed
// after the idle timeout.
func TestGRPCFaceStreamsAndTimeouts(t *testing.T) {
	s, addr := faceServer(t, "tcp", topspin.WithMaxConcurrentCalls(2),
		topspin.WithHandshakeTimeout(300*time.Millisecond), topspin.WithIdleTimeout(500*time.Millisecond))
	cc := grpcClient(t, "tcp", addr)
	ctx := ctx10(t)
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 3)
	for i := 0; i < 3; i++ {
		go func() { _, err := unary(hctx, cc, "/f.S/Hold", []byte("x")); done <- err }()
	}
	waitFor(t, func() bool { return s.Gauges().OpenCalls == 2 })
	time.Sleep(100 * time.Millisecond)
	if g := s.Gauges(); g.OpenCalls != 2 {
		t.Fatalf("3 calls on one gRPC connection limited to 2 streams: %+v", g)
	}
	cancel()
	for i := 0; i < 3; i++ {
		<-done
	}

	half, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	if _, err := half.Write([]byte("P")); err != nil {
		t.Fatal(err)
	}
	_ = half.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(half); err != nil {
		t.Fatalf("a connection stuck in the HTTP/2 preface was not closed: %v", err)
	}
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	lastIs(t, closedByServer(t, silent, 5*time.Second), wire.TypeError, wire.Timeout, "handshake timeout")

	waitFor(t, func() bool { return s.Gauges().Connections == 0 }) // the idle gRPC connection went
}

// Keep-alive enforcement: a gRPC peer that pings more often than every 100 ms (the native
// face's PING rate) gets GOAWAY ENHANCE_YOUR_CALM; one that pings every 150 ms, with no call
// open, is kept (grpc-go's default policy would refuse it).
func TestGRPCFacePingFloodIsRefused(t *testing.T) {
	_, addr := faceServer(t, "tcp")
	if g := pingAndRead(t, addr, 5, 0); g == nil || g.code != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("a PING flood: GOAWAY %+v", g)
	}
	if g := pingAndRead(t, addr, 4, 150*time.Millisecond); g != nil {
		t.Fatalf("PINGs every 150 ms: GOAWAY %+v", g)
	}
}

// goAway is a GOAWAY a server sent.
type goAway struct {
	code  http2.ErrCode
	debug string
}

// pingAndRead opens an HTTP/2 connection, sends n PINGs every gap, and returns the GOAWAY the
// server sent within 300 ms after (nil if none).
func pingAndRead(t *testing.T, addr string, n int, gap time.Duration) *goAway {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(nc, nc)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	frames := make(chan *goAway, 1)
	go func() {
		defer close(frames)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if g, ok := f.(*http2.GoAwayFrame); ok {
				frames <- &goAway{g.ErrCode, string(g.DebugData())}
				return
			}
		}
	}()
	for i := 0; i < n; i++ {
		time.Sleep(gap)
		if fr.WritePing(false, [8]byte{byte(i)}) != nil {
			break // closed already
		}
	}
	select {
	case g, ok := <-frames:
		if ok {
			return g
		}
		t.Fatal("closed without GOAWAY")
	case <-time.After(300 * time.Millisecond):
	}
	return nil
}
