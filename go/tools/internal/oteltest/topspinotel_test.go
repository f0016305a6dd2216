package oteltest_test

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/tools/internal/matrix"
	"github.com/topspin-rpc/topspin/go/tools/internal/matrixpb"
	"github.com/topspin-rpc/topspin/go/topspin"
	"github.com/topspin-rpc/topspin/go/topspinotel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// telemetry is a test's in-memory SDK: spans in rec, metrics through reader.
type telemetry struct {
	rec    *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newTelemetry(t *testing.T) *telemetry {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return &telemetry{rec: rec, tp: tp, reader: reader, mp: mp}
}

func (tm *telemetry) opts() []topspinotel.Option {
	return []topspinotel.Option{topspinotel.WithTracerProvider(tm.tp), topspinotel.WithMeterProvider(tm.mp),
		topspinotel.WithPropagators(propagation.TraceContext{})}
}

// ended waits (at most 3 s) for n ended spans and returns them.
func (tm *telemetry) ended(t *testing.T, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		spans := tm.rec.Ended()
		if len(spans) >= n || time.Now().After(deadline) {
			if len(spans) != n {
				t.Fatalf("%d spans ended, want %d: %v", len(spans), n, names(spans))
			}
			return spans
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, fmt.Sprintf("%s(%s)", s.Name(), s.SpanKind()))
	}
	return out
}

// find is the one span of kind among spans.
func find(t *testing.T, spans []sdktrace.ReadOnlySpan, kind trace.SpanKind) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanKind() == kind {
			if found != nil {
				t.Fatalf("two %s spans: %v", kind, names(spans))
			}
			found = s
		}
	}
	if found == nil {
		t.Fatalf("no %s span: %v", kind, names(spans))
	}
	return found
}

func attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// wantAttrs checks the rpc.* attributes of a call's span.
func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, system, method string, code topspin.Code) {
	t.Helper()
	for key, want := range map[string]any{
		"rpc.system": system, "rpc.service": "matrix.v1.Matrix", "rpc.method": method,
		"rpc.grpc.status_code": int64(code),
	} {
		v, ok := attr(s, key)
		if !ok || v.AsInterface() != want {
			t.Errorf("%s span %s: %s = %v (present %v), want %v", s.SpanKind(), s.Name(), key, v.AsInterface(), ok, want)
		}
	}
	if s.Name() != "matrix.v1.Matrix/"+method {
		t.Errorf("span name %q, want %q", s.Name(), "matrix.v1.Matrix/"+method)
	}
}

// spy is the matrix service, recording the span context its handlers' ctx carries and the
// request metadata of Unary.
type spy struct {
	*matrix.Service
	mu  sync.Mutex
	scs []trace.SpanContext
	md  []topspin.Metadata
}

func (s *spy) note(ctx context.Context) {
	s.mu.Lock()
	s.scs = append(s.scs, trace.SpanContextFromContext(ctx))
	s.mu.Unlock()
}

func (s *spy) seen() []trace.SpanContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]trace.SpanContext(nil), s.scs...)
}

func (s *spy) metadata() []topspin.Metadata {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]topspin.Metadata(nil), s.md...)
}

func (s *spy) Unary(ctx context.Context, req *matrixpb.Msg) (*matrixpb.Msg, error) {
	s.note(ctx)
	s.mu.Lock()
	s.md = append(s.md, topspin.ServerStreamFrom(ctx).Metadata())
	s.mu.Unlock()
	return s.Service.Unary(ctx, req)
}

func (s *spy) ServerStream(ctx context.Context, req *matrixpb.StreamReq, stream topspin.ServerStreamingServer[matrixpb.Msg]) error {
	s.note(ctx)
	return s.Service.ServerStream(ctx, req, stream)
}

func (s *spy) ClientStream(ctx context.Context, stream topspin.ClientStreamingServer[matrixpb.Msg, matrixpb.Summary]) (*matrixpb.Summary, error) {
	s.note(ctx)
	return s.Service.ClientStream(ctx, stream)
}

func (s *spy) Bidi(ctx context.Context, stream topspin.BidiStreamingServer[matrixpb.Msg, matrixpb.Msg]) error {
	s.note(ctx)
	return s.Service.Bidi(ctx, stream)
}

// serve starts a matrix server (instrumented unless serverOpts is nil) and returns its
// address (host:port) and the spy.
func serve(t *testing.T, serverOpts []topspin.Option) (string, *spy) {
	t.Helper()
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := topspin.NewServer(serverOpts...)
	impl := &spy{Service: matrix.NewService()}
	matrixpb.RegisterMatrixServer(srv, impl)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return l.Addr().String(), impl
}

func dial(t *testing.T, addr string, opts ...topspin.Option) *matrixpb.MatrixClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc, err := topspin.Dial(ctx, "tcp://"+addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return matrixpb.NewMatrixClient(cc)
}

// wantChain checks root → client → server: one trace, each the parent of the next, and
// the server's handler ran with the server span in its ctx.
func wantChain(t *testing.T, root trace.Span, client, server sdktrace.ReadOnlySpan, handler trace.SpanContext) {
	t.Helper()
	rootSC := root.SpanContext()
	if client.SpanContext().TraceID() != rootSC.TraceID() || server.SpanContext().TraceID() != rootSC.TraceID() {
		t.Errorf("trace ids: root %s, client %s, server %s: want one trace", rootSC.TraceID(),
			client.SpanContext().TraceID(), server.SpanContext().TraceID())
	}
	if client.Parent().SpanID() != rootSC.SpanID() || client.Parent().IsRemote() {
		t.Errorf("client span's parent %v, want the root span %s (local)", client.Parent(), rootSC.SpanID())
	}
	if server.Parent().SpanID() != client.SpanContext().SpanID() || !server.Parent().IsRemote() {
		t.Errorf("server span's parent %v, want the client span %s (remote)", server.Parent(), client.SpanContext().SpanID())
	}
	if handler.SpanID() != server.SpanContext().SpanID() {
		t.Errorf("the handler's ctx has span %s, want the server span %s", handler.SpanID(), server.SpanContext().SpanID())
	}
}

func TestUnaryClientAndServerSpansAreOneTrace(t *testing.T) {
	tm := newTelemetry(t)
	addr, impl := serve(t, topspinotel.ServerOptions(tm.opts()...))
	mc := dial(t, addr, topspinotel.DialOptions(tm.opts()...)...)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx, root := tm.tp.Tracer("test").Start(ctx, "root")
	// A traceparent already in the metadata is replaced, not sent twice.
	ctx = topspin.WithOutgoingMetadata(ctx, topspin.MD("traceparent", "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01", "x-keep", "yes"))
	if _, err := mc.Unary(ctx, &matrixpb.Msg{Payload: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	root.End()

	spans := tm.ended(t, 3)
	client, server := find(t, spans, trace.SpanKindClient), find(t, spans, trace.SpanKindServer)
	wantAttrs(t, client, "topspin", "Unary", topspin.OK)
	wantAttrs(t, server, "topspin", "Unary", topspin.OK)
	if v, _ := attr(server, "network.peer.address"); v.AsString() != "127.0.0.1" {
		t.Errorf("server span network.peer.address = %q", v.AsString())
	}
	for _, s := range []sdktrace.ReadOnlySpan{client, server} {
		if s.Status().Code != otelcodes.Unset {
			t.Errorf("%s span status %v, want unset", s.SpanKind(), s.Status())
		}
	}
	wantChain(t, root, client, server, impl.seen()[0])

	md := impl.metadata()[0]
	n := 0
	for _, e := range md {
		if e.Key == "traceparent" {
			n++
		}
	}
	if keep, _ := md.Get("x-keep"); n != 1 || keep != "yes" {
		t.Errorf("request metadata %q: want one traceparent and x-keep", md)
	}
}

func TestFailedCallsSetErrorStatus(t *testing.T) {
	tm := newTelemetry(t)
	addr, _ := serve(t, topspinotel.ServerOptions(tm.opts()...))
	mc := dial(t, addr, topspinotel.DialOptions(tm.opts()...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// INTERNAL is an error on both sides; NOT_FOUND only on the client's (the semantic
	// conventions' rule for gRPC server spans).
	for _, tc := range []struct {
		code        topspin.Code
		serverError bool
	}{{topspin.Internal, true}, {topspin.NotFound, false}} {
		tm.rec.Reset()
		_, err := mc.Fail(ctx, &matrixpb.FailReq{Code: uint32(tc.code), Message: "boom"})
		if topspin.CodeOf(err) != tc.code {
			t.Fatalf("Fail: %v, want %s", err, tc.code)
		}
		spans := tm.ended(t, 2)
		client, server := find(t, spans, trace.SpanKindClient), find(t, spans, trace.SpanKindServer)
		wantAttrs(t, client, "topspin", "Fail", tc.code)
		wantAttrs(t, server, "topspin", "Fail", tc.code)
		if st := client.Status(); st.Code != otelcodes.Error || st.Description != "boom" {
			t.Errorf("%s: client span status %v, want Error \"boom\"", tc.code, st)
		}
		want := otelcodes.Unset
		if tc.serverError {
			want = otelcodes.Error
		}
		if st := server.Status(); st.Code != want {
			t.Errorf("%s: server span status %v, want %v", tc.code, st, want)
		}
	}
}

func TestStreamsAreTraced(t *testing.T) {
	tm := newTelemetry(t)
	addr, impl := serve(t, topspinotel.ServerOptions(tm.opts()...))
	mc := dial(t, addr, topspinotel.DialOptions(tm.opts()...)...)
	tracer := tm.tp.Tracer("test")

	for _, tc := range []struct {
		method string
		run    func(ctx context.Context) error
		code   topspin.Code
	}{
		{"ServerStream", func(ctx context.Context) error {
			st, err := mc.ServerStream(ctx, &matrixpb.StreamReq{Count: 3, Size: 4})
			if err != nil {
				return err
			}
			for {
				if _, err := st.Recv(); err == io.EOF {
					return nil
				} else if err != nil {
					return err
				}
			}
		}, topspin.OK},
		{"ClientStream", func(ctx context.Context) error {
			st, err := mc.ClientStream(ctx)
			if err != nil {
				return err
			}
			for range 3 {
				if err := st.Send(&matrixpb.Msg{Payload: []byte("x")}); err != nil {
					return err
				}
			}
			sum, err := st.CloseAndRecv()
			if err == nil && sum.Count != 3 {
				err = fmt.Errorf("count %d", sum.Count)
			}
			return err
		}, topspin.OK},
		{"Bidi", func(ctx context.Context) error {
			st, err := mc.Bidi(ctx)
			if err != nil {
				return err
			}
			if err := st.Send(&matrixpb.Msg{Payload: []byte("a")}); err != nil {
				return err
			}
			if _, err := st.Recv(); err != nil {
				return err
			}
			if err := st.CloseSend(); err != nil {
				return err
			}
			if _, err := st.Recv(); err != io.EOF {
				return fmt.Errorf("after CloseSend: %v", err)
			}
			return nil
		}, topspin.OK},
		{"ServerStream", func(ctx context.Context) error { // cancelled by the client
			st, err := mc.ServerStream(ctx, &matrixpb.StreamReq{Hold: true, Tag: "t"})
			if err != nil {
				return err
			}
			time.Sleep(50 * time.Millisecond)
			st.CancelCall()
			return nil
		}, topspin.Canceled},
	} {
		tm.rec.Reset()
		before := len(impl.seen())
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ctx, root := tracer.Start(ctx, "root")
		if err := tc.run(ctx); err != nil {
			t.Fatalf("%s: %v", tc.method, err)
		}
		root.End()
		spans := tm.ended(t, 3)
		cancel()
		client, server := find(t, spans, trace.SpanKindClient), find(t, spans, trace.SpanKindServer)
		wantAttrs(t, client, "topspin", tc.method, tc.code)
		wantAttrs(t, server, "topspin", tc.method, tc.code)
		wantChain(t, root, client, server, impl.seen()[before])
		if tc.code != topspin.OK && client.Status().Code != otelcodes.Error {
			t.Errorf("%s: client span status %v, want Error", tc.method, client.Status())
		}
	}
}

func TestDurationMetrics(t *testing.T) {
	tm := newTelemetry(t)
	addr, _ := serve(t, topspinotel.ServerOptions(tm.opts()...))
	mc := dial(t, addr, topspinotel.DialOptions(tm.opts()...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 2 {
		if _, err := mc.Unary(ctx, &matrixpb.Msg{}); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = mc.Fail(ctx, &matrixpb.FailReq{Code: uint32(topspin.NotFound)})
	tm.ended(t, 6) // the server's spans (and measurements) end before its answers leave

	var rm metricdata.ResourceMetrics
	if err := tm.reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != topspinotel.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			found[m.Name] = true
			if m.Unit != "ms" {
				t.Errorf("%s: unit %q, want ms", m.Name, m.Unit)
			}
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok {
				t.Fatalf("%s: %T, want a float64 histogram", m.Name, m.Data)
			}
			counts := map[string]uint64{}
			for _, dp := range h.DataPoints {
				method, _ := dp.Attributes.Value("rpc.method")
				code, _ := dp.Attributes.Value("rpc.grpc.status_code")
				system, _ := dp.Attributes.Value("rpc.system")
				if system.AsString() != "topspin" {
					t.Errorf("%s: rpc.system %q", m.Name, system.AsString())
				}
				counts[fmt.Sprintf("%s/%d", method.AsString(), code.AsInt64())] += dp.Count
			}
			if counts["Unary/0"] != 2 || counts["Fail/5"] != 1 || len(counts) != 2 {
				t.Errorf("%s: counts %v, want Unary/0: 2, Fail/5: 1", m.Name, counts)
			}
		}
	}
	if !found["rpc.server.duration"] || !found["rpc.client.duration"] {
		t.Errorf("metrics %v, want rpc.server.duration and rpc.client.duration", found)
	}
}

// A traceparent written by another implementation (here by hand, by a plain client) is
// continued by the server.
func TestServerContinuesATraceparentFromAnyClient(t *testing.T) {
	tm := newTelemetry(t)
	addr, impl := serve(t, topspinotel.ServerOptions(tm.opts()...))
	mc := dial(t, addr) // no instrumentation
	const tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = topspin.WithOutgoingMetadata(ctx, topspin.MD("traceparent", "00-"+tid+"-"+sid+"-01", "tracestate", "vendor=x"))
	if _, err := mc.Unary(ctx, &matrixpb.Msg{}); err != nil {
		t.Fatal(err)
	}
	server := find(t, tm.ended(t, 1), trace.SpanKindServer)
	if got := server.SpanContext().TraceID().String(); got != tid {
		t.Errorf("server span trace id %s, want %s", got, tid)
	}
	if got := server.Parent().SpanID().String(); got != sid || !server.Parent().IsRemote() {
		t.Errorf("server span parent %s (remote %v), want %s", got, server.Parent().IsRemote(), sid)
	}
	if got := server.SpanContext().TraceState().Get("vendor"); got != "x" {
		t.Errorf("tracestate vendor=%q, want x", got)
	}
	if h := impl.seen()[0]; h.TraceID().String() != tid {
		t.Errorf("the handler's span is in trace %s, want %s", h.TraceID(), tid)
	}

	// Without a traceparent the server span is a root.
	tm.rec.Reset()
	if _, err := mc.Unary(context.Background(), &matrixpb.Msg{}); err != nil {
		t.Fatal(err)
	}
	if server := find(t, tm.ended(t, 1), trace.SpanKindServer); server.Parent().IsValid() {
		t.Errorf("server span without traceparent has parent %v", server.Parent())
	}
}

// The Go client's traceparent is W3C's, as any other implementation's server reads it (here
// a plain server records what arrives).
func TestClientSendsW3CTraceparent(t *testing.T) {
	tm := newTelemetry(t)
	addr, impl := serve(t, nil) // no instrumentation
	mc := dial(t, addr, topspinotel.DialOptions(tm.opts()...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx, root := tm.tp.Tracer("test").Start(ctx, "root")
	if _, err := mc.Unary(ctx, &matrixpb.Msg{}); err != nil {
		t.Fatal(err)
	}
	root.End()
	client := find(t, tm.ended(t, 2), trace.SpanKindClient)
	md := impl.metadata()[0]
	tp, ok := md.Get("traceparent")
	if !ok {
		t.Fatalf("no traceparent in %q", md)
	}
	if !regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`).MatchString(tp) {
		t.Errorf("traceparent %q is not 00-<32 hex>-<16 hex>-01", tp)
	}
	if want := fmt.Sprintf("00-%s-%s-01", root.SpanContext().TraceID(), client.SpanContext().SpanID()); tp != want {
		t.Errorf("traceparent %q, want %q (the root's trace, the client span)", tp, want)
	}
}

// The gRPC face is instrumented by the same interceptors: a grpc-go client's traceparent
// (as otelgrpc sends it) is continued, and the span says rpc.system "grpc".
func TestGRPCFaceIsTraced(t *testing.T) {
	tm := newTelemetry(t)
	addr, impl := serve(t, topspinotel.ServerOptions(tm.opts()...))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const tid, sid = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+tid+"-"+sid+"-01")
	var resp matrixpb.Msg
	if err := conn.Invoke(ctx, "/matrix.v1.Matrix/Unary", &matrixpb.Msg{Payload: []byte("g")}, &resp); err != nil {
		t.Fatal(err)
	}
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/matrix.v1.Matrix/ServerStream")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SendMsg(&matrixpb.StreamReq{Count: 2, Size: 1}); err != nil {
		t.Fatal(err)
	}
	_ = st.CloseSend()
	for {
		if err := st.RecvMsg(&resp); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	spans := tm.ended(t, 2)
	for i, s := range spans {
		method := map[string]string{"matrix.v1.Matrix/Unary": "Unary", "matrix.v1.Matrix/ServerStream": "ServerStream"}[s.Name()]
		wantAttrs(t, s, "grpc", method, topspin.OK)
		if s.SpanKind() != trace.SpanKindServer || s.SpanContext().TraceID().String() != tid || s.Parent().SpanID().String() != sid {
			t.Errorf("span %d: %s in trace %s, parent %s; want a server span in %s under %s", i, s.SpanKind(),
				s.SpanContext().TraceID(), s.Parent().SpanID(), tid, sid)
		}
	}
	for _, h := range impl.seen() {
		if h.TraceID().String() != tid {
			t.Errorf("a handler's span is in trace %s, want %s", h.TraceID(), tid)
		}
	}
}

// The filter leaves calls out.
func TestFilter(t *testing.T) {
	tm := newTelemetry(t)
	noWasCancelled := topspinotel.WithFilter(func(m string) bool { return m != "/matrix.v1.Matrix/WasCancelled" })
	addr, _ := serve(t, topspinotel.ServerOptions(append(tm.opts(), noWasCancelled)...))
	mc := dial(t, addr, topspinotel.DialOptions(append(tm.opts(), noWasCancelled)...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := mc.WasCancelled(ctx, &matrixpb.Tag{Tag: "x"}); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.Unary(ctx, &matrixpb.Msg{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range tm.ended(t, 2) {
		if s.Name() != "matrix.v1.Matrix/Unary" {
			t.Errorf("span %s: filtered out, yet traced", s.Name())
		}
	}
}
