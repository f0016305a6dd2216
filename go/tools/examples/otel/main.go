// Command otel traces kvstore calls with OpenTelemetry: server and client instrumented by
// topspinotel, the client's trace context carried to the server in the request metadata
// (W3C traceparent), both spans in one trace, and the duration histograms recorded.
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/topspin-rpc/topspin/go/examples/kvstore"
	"github.com/topspin-rpc/topspin/go/examples/kvstore/kvpb"
	"github.com/topspin-rpc/topspin/go/topspin"
	"github.com/topspin-rpc/topspin/go/topspinotel"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func main() {
	// The SDK, set globally: spans recorded in memory and metrics read on demand here (a
	// service would give the providers exporters, e.g. OTLP), the W3C propagator.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	metrics := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(metrics))
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.TraceContext{})

	// Server: every call (native or gRPC face) gets a server span continuing the caller's.
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := topspin.NewServer(topspinotel.ServerOptions()...)
	kvpb.RegisterStoreServer(srv, kvstore.NewStore())
	go srv.Serve(l)
	defer srv.GracefulStop()

	// Client: every call gets a client span, a child of the caller's current span.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc, err := topspin.Dial(ctx, "tcp://"+l.Addr().String(), topspinotel.DialOptions()...)
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()

	ctx, root := otel.Tracer("example").Start(ctx, "greet")
	_, err = kvpb.NewStoreClient(cc).Put(ctx, &kvpb.PutRequest{Key: "greeting", Value: "hello"})
	root.End()
	if err != nil {
		log.Fatal(err)
	}

	for _, s := range spans.Ended() { // the server's span ends first, before its answer leaves
		fmt.Printf("%s %s: trace of root %v, parent %s\n", s.SpanKind(), s.Name(),
			s.SpanContext().TraceID() == root.SpanContext().TraceID(), parentName(spans.Ended(), s))
	}
	var rm metricdata.ResourceMetrics
	if err := metrics.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h := m.Data.(metricdata.Histogram[float64])
			fmt.Printf("%s (%s): %d call\n", m.Name, m.Unit, h.DataPoints[0].Count)
		}
	}
}

// parentName is the name of s's parent among spans.
func parentName(spans []sdktrace.ReadOnlySpan, s sdktrace.ReadOnlySpan) string {
	for _, p := range spans {
		if p.SpanContext().SpanID() == s.Parent().SpanID() {
			return p.Name() + " (" + p.SpanKind().String() + ")"
		}
	}
	return "none"
}
