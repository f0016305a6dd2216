// Package matrix is the Go side of the cross-language matrix (testdata/matrix/README.md): the
// matrix.v1.Matrix service (Service) and the client's checks (Run), used by
// cmd/matrix-server and cmd/matrix-client.
package matrix

import (
	"bytes"
	"context"
	"io"
	"sync"
	"time"

	"github.com/topspin-rpc/topspin/go/tools/internal/matrixpb"
	"github.com/topspin-rpc/topspin/go/topspin"
	"github.com/topspin-rpc/topspin/go/topspinotel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ServerOptions are the options a matrix server runs with (besides TLS): the OpenTelemetry
// instrumentation (topspinotel) with an SDK tracer provider (no exporter) and the W3C
// trace-context propagator, so that the server's spans continue the client's trace (the
// README's "Tracing").
func ServerOptions() []topspin.Option {
	return topspinotel.ServerOptions(topspinotel.WithTracerProvider(sdktrace.NewTracerProvider()),
		topspinotel.WithPropagators(propagation.TraceContext{}))
}

// Service implements matrix.v1.Matrix as matrix.proto describes it. It records the tags of
// the calls it saw cancelled (or past their deadline) for WasCancelled.
type Service struct {
	mu        sync.Mutex
	cancelled map[string]bool
}

var _ matrixpb.MatrixServer = (*Service)(nil)

// NewService returns a Service with no cancellation recorded.
func NewService() *Service { return &Service{cancelled: make(map[string]bool)} }

// record notes that the call tagged tag ended with its context (cancelled, deadline passed,
// connection lost).
func (s *Service) record(tag string) {
	s.mu.Lock()
	s.cancelled[tag] = true
	s.mu.Unlock()
}

// Unary echoes the payload; x-echo comes back as the header x-echo and the trailer x-echo-t,
// x-echo-bin as the header x-echo-bin, and the trace id of the call's span (the
// instrumentation's, in ctx) as the header x-trace-id, when there is one.
func (s *Service) Unary(ctx context.Context, req *matrixpb.Msg) (*matrixpb.Msg, error) {
	ss := topspin.ServerStreamFrom(ctx)
	md := ss.Metadata()
	if v, ok := md.Get("x-echo"); ok {
		ss.SetHeader(topspin.MD("x-echo", v))
		ss.SetTrailer(topspin.MD("x-echo-t", v))
	}
	if v, ok := md.Get("x-echo-bin"); ok {
		ss.SetHeader(topspin.MD("x-echo-bin", v))
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		ss.SetHeader(topspin.MD("x-trace-id", sc.TraceID().String()))
	}
	return &matrixpb.Msg{Payload: req.Payload}, nil
}

// ServerStream sends count messages of size bytes of 'a'; with hold, nothing until the call
// ends, recording its tag.
func (s *Service) ServerStream(ctx context.Context, req *matrixpb.StreamReq, stream topspin.ServerStreamingServer[matrixpb.Msg]) error {
	if req.Hold {
		<-ctx.Done()
		s.record(req.Tag)
		return topspin.StatusOf(ctx.Err())
	}
	payload := bytes.Repeat([]byte{'a'}, int(req.Size))
	for range req.Count {
		if err := stream.Send(&matrixpb.Msg{Payload: payload}); err != nil {
			return err
		}
	}
	return nil
}

// ClientStream counts the messages and their payload bytes.
func (s *Service) ClientStream(ctx context.Context, stream topspin.ClientStreamingServer[matrixpb.Msg, matrixpb.Summary]) (*matrixpb.Summary, error) {
	sum := &matrixpb.Summary{}
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return sum, nil
		}
		if err != nil {
			return nil, err
		}
		sum.Count++
		sum.Bytes += uint64(len(m.Payload))
	}
}

// Bidi echoes every message as it arrives (nothing, headers included, goes before the first).
func (s *Service) Bidi(ctx context.Context, stream topspin.BidiStreamingServer[matrixpb.Msg, matrixpb.Msg]) error {
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(&matrixpb.Msg{Payload: m.Payload}); err != nil {
			return err
		}
	}
}

// Fail sets the response header x-fail-h: v1, then ends the call with the code, message and
// details asked for. The details are the
// bytes of a google.rpc.Status: they go as they are in the topspin-status-details-bin
// trailer (Status.WithDetails would build a new google.rpc.Status from messages instead).
func (s *Service) Fail(ctx context.Context, req *matrixpb.FailReq) (*matrixpb.Msg, error) {
	if req.Code == 0 || req.Code > uint32(topspin.Unauthenticated) {
		return nil, topspin.Errorf(topspin.InvalidArgument, "code %d is not a failure status code (1..16)", req.Code)
	}
	// A response header set before the handler fails: it goes out before the error
	// (protocol.md §5.4), and the client finds it on its error.
	topspin.SetHeader(ctx, topspin.MD("x-fail-h", "v1"))
	st := &topspin.Status{Code: topspin.Code(req.Code), Message: req.Message}
	if len(req.Details) > 0 {
		st.Trailers = topspin.MD(topspin.KeyStatusDetails, string(req.Details))
	}
	return nil, st
}

// Sleep answers after millis ms, or ends with the call's context (recording its tag).
func (s *Service) Sleep(ctx context.Context, req *matrixpb.SleepReq) (*matrixpb.Msg, error) {
	t := time.NewTimer(time.Duration(req.Millis) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return &matrixpb.Msg{}, nil
	case <-ctx.Done():
		s.record(req.Tag)
		return nil, topspin.StatusOf(ctx.Err())
	}
}

// WasCancelled reports whether a call tagged tag was seen cancelled or past its deadline.
func (s *Service) WasCancelled(ctx context.Context, req *matrixpb.Tag) (*matrixpb.Flag, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &matrixpb.Flag{Value: s.cancelled[req.Tag]}, nil
}
