// Package topspinotel instruments topspin servers and clients with OpenTelemetry, as
// otelgrpc does grpc-go: a span per call, W3C trace context carried in the request metadata,
// and the rpc.server.duration / rpc.client.duration histograms of the RPC semantic
// conventions. It is built on the runtime's interceptors, so a server's instrumentation
// covers its native face and its gRPC face alike, and a client's works against any topspin
// server (Go, Rust, …).
//
//	srv := topspin.NewServer(topspinotel.ServerOptions()...)
//	cc, err := topspin.Dial(ctx, target, topspinotel.DialOptions()...)
//
// Without options the globally configured TracerProvider, MeterProvider and propagator
// (otel.GetTracerProvider, otel.GetMeterProvider, otel.GetTextMapPropagator) are used, at
// the time of each call; WithTracerProvider, WithMeterProvider and WithPropagators name
// others.
//
// Spans are named after the method ("package.Service/Method"), of kind client or server,
// with the attributes rpc.system ("topspin"; "grpc" for a call on the server's gRPC face),
// rpc.service, rpc.method and, once the call ended, rpc.grpc.status_code (topspin's codes are
// gRPC's). A client span's status is Error for any code but OK; a server span's for the codes
// the semantic conventions count as server errors (UNKNOWN, DEADLINE_EXCEEDED,
// UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS), as otelgrpc does. The client writes its
// span's context into the request metadata (traceparent, tracestate with the W3C
// propagator, replacing any already there); the server continues the context it finds
// there, so both spans are in one trace, the server's a child of the client's.
//
// On the server a handler's ctx carries the span (trace.SpanFromContext) for unary methods
// and the generated streaming methods. A raw topspin.Handler (func(*ServerStream) error) is
// instrumented too, but its *ServerStream context does not carry the span.
package topspinotel

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
	"github.com/topspin-rpc/topspin/go/wire"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/topspin-rpc/topspin/go/topspinotel"

// Option configures the instrumentation.
type Option func(*config)

type config struct {
	tp     trace.TracerProvider
	mp     metric.MeterProvider
	prop   propagation.TextMapPropagator
	filter func(method string) bool
}

// WithTracerProvider makes spans with tp instead of the global TracerProvider.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tp = tp } }

// WithMeterProvider records metrics with mp instead of the global MeterProvider.
func WithMeterProvider(mp metric.MeterProvider) Option { return func(c *config) { c.mp = mp } }

// WithPropagators injects and extracts trace context with p instead of the global
// propagator (which is a no-op until otel.SetTextMapPropagator is called; the matrix and the
// other topspin implementations use propagation.TraceContext{}).
func WithPropagators(p propagation.TextMapPropagator) Option { return func(c *config) { c.prop = p } }

// WithFilter instruments only the calls whose method ("/package.Service/Method") f returns
// true for; others pass through untouched (no span, no metric, no trace context).
func WithFilter(f func(method string) bool) Option { return func(c *config) { c.filter = f } }

// side is one side's instruments.
type side struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	duration metric.Float64Histogram
	filter   func(string) bool
	server   bool
}

func newSide(server bool, opts []Option) *side {
	c := config{tp: otel.GetTracerProvider(), mp: otel.GetMeterProvider()}
	for _, o := range opts {
		o(&c)
	}
	s := &side{
		tracer: c.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		prop:   c.prop,
		filter: c.filter,
		server: server,
	}
	meter := c.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	name, desc := "rpc.client.duration", "Measures the duration of outbound RPC."
	if server {
		name, desc = "rpc.server.duration", "Measures the duration of inbound RPC."
	}
	h, err := meter.Float64Histogram(name, metric.WithUnit("ms"), metric.WithDescription(desc))
	if err != nil {
		otel.Handle(err) // h is still usable (a no-op instrument)
	}
	s.duration = h
	return s
}

func (s *side) propagator() propagation.TextMapPropagator {
	if s.prop != nil {
		return s.prop
	}
	return otel.GetTextMapPropagator()
}

func (s *side) skip(method string) bool { return s.filter != nil && !s.filter(method) }

// call is one instrumented call.
type call struct {
	s     *side
	span  trace.Span
	attrs []attribute.KeyValue // rpc.system, rpc.service, rpc.method
	start time.Time
	once  sync.Once
}

// methodAttrs are the span name and the rpc.* attributes of a method.
func methodAttrs(fullMethod, system string) (string, []attribute.KeyValue) {
	name := strings.TrimPrefix(fullMethod, "/")
	attrs := []attribute.KeyValue{semconv.RPCSystemKey.String(system)}
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		if svc := name[:i]; svc != "" {
			attrs = append(attrs, semconv.RPCService(svc))
		}
		if m := name[i+1:]; m != "" {
			attrs = append(attrs, semconv.RPCMethod(m))
		}
	}
	return name, attrs
}

// peerAttrs describes the client of a server call.
func peerAttrs(a net.Addr) []attribute.KeyValue {
	switch a := a.(type) {
	case *net.TCPAddr:
		return []attribute.KeyValue{semconv.NetworkPeerAddress(a.IP.String()), semconv.NetworkPeerPort(a.Port),
			semconv.NetworkTransportTCP}
	case *net.UnixAddr:
		return []attribute.KeyValue{semconv.NetworkTransportUnix}
	}
	return nil
}

// startServer starts a server call's span, a child of the trace context in md (if any).
func (s *side) startServer(ctx context.Context, method string, md topspin.Metadata) (context.Context, *call) {
	system := "topspin"
	var extra []attribute.KeyValue
	if ss := topspin.ServerStreamFrom(ctx); ss != nil {
		if ss.IsGRPC() {
			system = "grpc"
		}
		extra = peerAttrs(ss.Peer())
	}
	ctx = s.propagator().Extract(ctx, mdReader(md))
	name, attrs := methodAttrs(method, system)
	ctx, span := s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attrs...), trace.WithAttributes(extra...))
	return ctx, &call{s: s, span: span, attrs: attrs, start: time.Now()}
}

// startClient starts a client call's span, a child of ctx's, and writes its context into
// the request metadata.
func (s *side) startClient(ctx context.Context, method string) (context.Context, *call) {
	name, attrs := methodAttrs(method, "topspin")
	ctx, span := s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	var w mdWriter
	s.propagator().Inject(ctx, &w)
	if len(w) > 0 {
		old := topspin.OutgoingMetadata(ctx)
		md := make(topspin.Metadata, 0, len(old)+len(w))
		for _, e := range old {
			if !w.has(e.Key) {
				md = append(md, e)
			}
		}
		ctx = topspin.ReplaceOutgoingMetadata(ctx, append(md, topspin.Metadata(w)...))
	}
	return ctx, &call{s: s, span: span, attrs: attrs, start: time.Now()}
}

// end ends the call with err's status (io.EOF and nil are OK); only its first end counts.
func (c *call) end(ctx context.Context, err error) {
	c.once.Do(func() {
		if err == io.EOF {
			err = nil
		}
		st := topspin.StatusOf(err)
		code := topspin.CodeOf(err)
		codeAttr := semconv.RPCGRPCStatusCodeKey.Int(int(code))
		c.span.SetAttributes(codeAttr)
		if code != topspin.OK && (!c.s.server || serverError(code)) {
			c.span.SetStatus(otelcodes.Error, st.Message)
		}
		c.span.End()
		ms := float64(time.Since(c.start)) / float64(time.Millisecond)
		attrs := make([]attribute.KeyValue, 0, len(c.attrs)+1)
		attrs = append(append(attrs, c.attrs...), codeAttr)
		c.s.duration.Record(ctx, ms, metric.WithAttributes(attrs...))
	})
}

// serverError: the codes the semantic conventions count as a server span's error.
func serverError(code topspin.Code) bool {
	switch code {
	case topspin.Unknown, topspin.DeadlineExceeded, topspin.Unimplemented, topspin.Internal,
		topspin.Unavailable, topspin.DataLoss:
		return true
	}
	return false
}

// mdReader reads trace context from received metadata.
type mdReader topspin.Metadata

func (m mdReader) Get(key string) string {
	v, _ := topspin.Metadata(m).Get(strings.ToLower(key))
	return v
}

func (m mdReader) Set(string, string) {}

func (m mdReader) Keys() []string {
	keys := make([]string, len(m))
	for i, e := range m {
		keys[i] = e.Key
	}
	return keys
}

// mdWriter collects what the propagator writes.
type mdWriter topspin.Metadata

func (m *mdWriter) Get(key string) string {
	v, _ := topspin.Metadata(*m).Get(strings.ToLower(key))
	return v
}

func (m *mdWriter) has(key string) bool {
	_, ok := topspin.Metadata(*m).Get(key)
	return ok
}

func (m *mdWriter) Set(key, value string) {
	key = strings.ToLower(key)
	for i, e := range *m {
		if e.Key == key {
			(*m)[i].Value = value
			return
		}
	}
	*m = append(*m, wire.MetadataEntry{Key: key, Value: value})
}

func (m *mdWriter) Keys() []string {
	keys := make([]string, len(*m))
	for i, e := range *m {
		keys[i] = e.Key
	}
	return keys
}

var (
	_ propagation.TextMapCarrier = mdReader(nil)
	_ propagation.TextMapCarrier = (*mdWriter)(nil)
)

// UnaryServerInterceptor instruments a server's unary calls.
func UnaryServerInterceptor(opts ...Option) topspin.UnaryServerInterceptor {
	return newSide(true, opts).unaryServer
}

func (s *side) unaryServer(ctx context.Context, req any, info *topspin.UnaryServerInfo, handler topspin.UnaryHandler) (any, error) {
	if s.skip(info.FullMethod) {
		return handler(ctx, req)
	}
	var md topspin.Metadata
	if ss := topspin.ServerStreamFrom(ctx); ss != nil {
		md = ss.Metadata()
	}
	ctx, c := s.startServer(ctx, info.FullMethod, md)
	resp, err := handler(ctx, req)
	c.end(ctx, err)
	return resp, err
}

// StreamServerInterceptor instruments a server's streaming calls (and its raw Handlers'
// calls). The handler's stream carries the span in its Context().
func StreamServerInterceptor(opts ...Option) topspin.StreamServerInterceptor {
	return newSide(true, opts).streamServer
}

func (s *side) streamServer(srv any, ss topspin.ServerStreamer, info *topspin.StreamServerInfo, handler topspin.StreamHandler) error {
	if s.skip(info.FullMethod) {
		return handler(srv, ss)
	}
	ctx, c := s.startServer(ss.Context(), info.FullMethod, ss.Metadata())
	err := handler(srv, &serverStream{ServerStreamer: ss, ctx: ctx})
	c.end(ctx, err)
	return err
}

// serverStream is the handler's stream: its Context carries the call's span.
type serverStream struct {
	topspin.ServerStreamer
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }

// UnaryClientInterceptor instruments a client's unary calls.
func UnaryClientInterceptor(opts ...Option) topspin.UnaryClientInterceptor {
	return newSide(false, opts).unaryClient
}

func (s *side) unaryClient(ctx context.Context, method string, req, reply any, cc *topspin.ClientConn, invoker topspin.UnaryInvoker, opts ...topspin.CallOption) error {
	if s.skip(method) {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	ctx, c := s.startClient(ctx, method)
	err := invoker(ctx, method, req, reply, cc, opts...)
	c.end(ctx, err)
	return err
}

// StreamClientInterceptor instruments a client's streams. A stream's span ends when a
// receive returns the end (io.EOF: OK) or an error, when it is cancelled (CancelCall), or
// when its context ends; a stream left unread and never cancelled keeps its span open.
func StreamClientInterceptor(opts ...Option) topspin.StreamClientInterceptor {
	return newSide(false, opts).streamClient
}

func (s *side) streamClient(ctx context.Context, desc *topspin.StreamDesc, cc *topspin.ClientConn, method string, streamer topspin.Streamer, opts ...topspin.CallOption) (topspin.ClientStreamer, error) {
	if s.skip(method) {
		return streamer(ctx, desc, cc, method, opts...)
	}
	ctx, c := s.startClient(ctx, method)
	st, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		c.end(ctx, err)
		return nil, err
	}
	cs := &clientStream{ClientStreamer: st, c: c, ctx: ctx}
	cs.stop = context.AfterFunc(ctx, func() { c.end(ctx, ctx.Err()) })
	return cs, nil
}

// clientStream ends the call's span with the stream.
type clientStream struct {
	topspin.ClientStreamer
	c    *call
	ctx  context.Context
	stop func() bool
}

func (s *clientStream) finish(err error) {
	s.stop()
	s.c.end(s.ctx, err)
}

func (s *clientStream) Recv() ([]byte, error) {
	b, err := s.ClientStreamer.Recv()
	if err != nil {
		s.finish(err)
	}
	return b, err
}

func (s *clientStream) RecvMsg(m proto.Message) error {
	err := s.ClientStreamer.RecvMsg(m)
	if err != nil {
		s.finish(err)
	}
	return err
}

func (s *clientStream) CancelCall() {
	s.ClientStreamer.CancelCall()
	s.finish(context.Canceled)
}

// ServerOptions are the options of topspin.NewServer that instrument every call: the unary
// and the stream interceptor (added to the chains: give them first to have them outermost).
func ServerOptions(opts ...Option) []topspin.Option {
	s := newSide(true, opts)
	return []topspin.Option{topspin.ChainUnaryInterceptor(s.unaryServer), topspin.ChainStreamInterceptor(s.streamServer)}
}

// DialOptions are the options of topspin.Dial that instrument every call: the unary and the
// stream interceptor (added to the chains).
func DialOptions(opts ...Option) []topspin.Option {
	s := newSide(false, opts)
	return []topspin.Option{topspin.WithChainUnaryInterceptor(s.unaryClient), topspin.WithChainStreamInterceptor(s.streamClient)}
}
