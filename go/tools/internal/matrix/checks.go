package matrix

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/topspin-rpc/topspin/go/tools/internal/matrixpb"
	"github.com/topspin-rpc/topspin/go/topspin"
	"github.com/topspin-rpc/topspin/go/topspinotel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// callCtx is a check's context: its 5 s deadline.
func callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), checkDeadline)
}

func (c *client) unary() error {
	ctx, cancel := callCtx()
	defer cancel()
	ctx = topspin.WithOutgoingMetadata(ctx, topspin.MD("x-echo", "v1", "x-echo-bin", "\x00\x01\xff"))
	var header, trailer topspin.Metadata
	resp, err := c.mc.Unary(ctx, &matrixpb.Msg{Payload: []byte("hello")},
		topspin.Header(&header), topspin.Trailer(&trailer))
	if err != nil {
		return err
	}
	if string(resp.Payload) != "hello" {
		return fmt.Errorf("payload %q, want %q", resp.Payload, "hello")
	}
	for _, want := range []struct {
		md         topspin.Metadata
		where, key string
		value      string
	}{
		{header, "header", "x-echo", "v1"},
		{header, "header", "x-echo-bin", "\x00\x01\xff"},
		{trailer, "trailer", "x-echo-t", "v1"},
	} {
		if v, ok := want.md.Get(want.key); !ok || v != want.value {
			return fmt.Errorf("%s %s = %q (present %v), want %q", want.where, want.key, v, ok, want.value)
		}
	}
	return nil
}

func (c *client) large() error {
	ctx, cancel := callCtx()
	defer cancel()
	payload := make([]byte, 300*1024)
	for i := range payload {
		payload[i] = byte(i % 251)
	}
	resp, err := c.mc.Unary(ctx, &matrixpb.Msg{Payload: payload})
	if err != nil {
		return err
	}
	if !bytes.Equal(resp.Payload, payload) {
		return fmt.Errorf("%d bytes back, not the %d sent", len(resp.Payload), len(payload))
	}
	return nil
}

func (c *client) serverStream() error {
	ctx, cancel := callCtx()
	defer cancel()
	stream, err := c.mc.ServerStream(ctx, &matrixpb.StreamReq{Count: 5, Size: 10})
	if err != nil {
		return err
	}
	for n := 0; ; n++ {
		m, err := stream.Recv()
		if err == io.EOF {
			if n != 5 {
				return fmt.Errorf("%d messages, want 5", n)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("after %d messages: %w", n, err)
		}
		if string(m.Payload) != "aaaaaaaaaa" {
			return fmt.Errorf("message %d is %q, want 10 × a", n, m.Payload)
		}
	}
}

// quietStream: the call is handed back while the server sends nothing; cancelled by its
// context after 200 ms, the server sees it.
func (c *client) quietStream() error {
	ctx, cancel := callCtx()
	defer cancel()
	tag := c.tag("quiet-stream")
	stream, err := within(2*time.Second, "ServerStream(hold)", func() (topspin.ServerStreamingClient[matrixpb.Msg], error) {
		return c.mc.ServerStream(ctx, &matrixpb.StreamReq{Hold: true, Tag: tag})
	})
	if err != nil {
		return err
	}
	time.Sleep(200 * time.Millisecond)
	cancel()
	_, err = stream.Recv()
	if err := wantCode(err, topspin.Canceled); err != nil {
		return fmt.Errorf("after the cancel, Recv: %w", err)
	}
	return c.pollCancelled(tag)
}

func (c *client) clientStream() error {
	ctx, cancel := callCtx()
	defer cancel()
	stream, err := c.mc.ClientStream(ctx)
	if err != nil {
		return err
	}
	for _, p := range []string{"a", "bb", "ccc"} {
		if err := stream.Send(&matrixpb.Msg{Payload: []byte(p)}); err != nil {
			return fmt.Errorf("send %q: %w", p, err)
		}
	}
	sum, err := stream.CloseAndRecv()
	if err != nil {
		return err
	}
	if sum.Count != 3 || sum.Bytes != 6 {
		return fmt.Errorf("Summary(count %d, bytes %d), want (3, 6)", sum.Count, sum.Bytes)
	}
	return nil
}

// bidiOpenThenSend: the call handle comes back before anything is sent (the server sends
// nothing before the first message), then two echoes and the end.
func (c *client) bidiOpenThenSend() error {
	ctx, cancel := callCtx()
	defer cancel()
	stream, err := within(2*time.Second, "Bidi (before any send)", func() (topspin.BidiStreamingClient[matrixpb.Msg, matrixpb.Msg], error) {
		return c.mc.Bidi(ctx)
	})
	if err != nil {
		return err
	}
	for _, p := range []string{"a", "b"} {
		if err := stream.Send(&matrixpb.Msg{Payload: []byte(p)}); err != nil {
			return fmt.Errorf("send %q: %w", p, err)
		}
		m, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("echo of %q: %w", p, err)
		}
		if string(m.Payload) != p {
			return fmt.Errorf("echo of %q is %q", p, m.Payload)
		}
	}
	if err := stream.CloseSend(); err != nil {
		return fmt.Errorf("CloseSend: %w", err)
	}
	if m, err := stream.Recv(); err != io.EOF {
		return fmt.Errorf("after CloseSend: message %v, error %v; want the end (OK)", m, err)
	}
	return nil
}

func (c *client) deadline() error {
	tag := c.tag("deadline")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.mc.Sleep(ctx, &matrixpb.SleepReq{Millis: 2000, Tag: tag})
	took := time.Since(start)
	if err := wantCode(err, topspin.DeadlineExceeded); err != nil {
		return err
	}
	if took > 1500*time.Millisecond {
		return fmt.Errorf("DEADLINE_EXCEEDED after %v, want within 1.5 s", took.Round(time.Millisecond))
	}
	return c.pollCancelled(tag)
}

func (c *client) cancel() error {
	tag := c.tag("cancel")
	ctx, cancel := callCtx()
	defer cancel()
	t := time.AfterFunc(200*time.Millisecond, cancel)
	defer t.Stop()
	_, err := c.mc.Sleep(ctx, &matrixpb.SleepReq{Millis: 10000, Tag: tag})
	if err := wantCode(err, topspin.Canceled); err != nil {
		return err
	}
	return c.pollCancelled(tag)
}

// errorDetails compares the raw details bytes: a *topspin.Status keeps its trailers, and the
// details are the topspin-status-details-bin trailer's value, as the server sent it. The
// status keeps the response headers too: the Fail handler's x-fail-h must be among them.
func (c *client) errorDetails() error {
	ctx, cancel := callCtx()
	defer cancel()
	details := []byte{0x08, 0x05, 0x12, 0x04, 'n', 'o', 'p', 'e'}
	_, err := c.mc.Fail(ctx, &matrixpb.FailReq{Code: 5, Message: "nope", Details: details})
	if err := wantCode(err, topspin.NotFound); err != nil {
		return err
	}
	st := topspin.StatusOf(err)
	if st.Message != "nope" {
		return fmt.Errorf("message %q, want %q", st.Message, "nope")
	}
	got, ok := st.Trailers.Get(topspin.KeyStatusDetails)
	if !ok {
		return fmt.Errorf("no %s trailer (trailers %q)", topspin.KeyStatusDetails, st.Trailers)
	}
	if !bytes.Equal([]byte(got), details) {
		return fmt.Errorf("details % x, want % x", got, details)
	}
	// The handler's response header went before the error and stays with it (§5.4).
	if h, ok := st.Headers.Get("x-fail-h"); !ok || h != "v1" {
		return fmt.Errorf("header x-fail-h %q (present %v), want \"v1\" (headers %q, trailers %q)", h, ok, st.Headers, st.Trailers)
	}
	return nil
}

// compression: 64 KiB of 'a' compressed with gzip, then with zstd.
func (c *client) compression() error {
	payload := bytes.Repeat([]byte{'a'}, 64*1024)
	for _, enc := range []string{"gzip", "zstd"} {
		ctx, cancel := callCtx()
		resp, err := c.mc.Unary(ctx, &matrixpb.Msg{Payload: payload}, topspin.CallCompression(enc))
		cancel()
		if err != nil {
			return fmt.Errorf("%s: %w", enc, err)
		}
		if !bytes.Equal(resp.Payload, payload) {
			return fmt.Errorf("%s: %d bytes back, not the %d sent", enc, len(resp.Payload), len(payload))
		}
	}
	return nil
}

// trace: a root span from an SDK tracer provider, current while Unary("trace") goes through
// the client's OpenTelemetry instrumentation (topspinotel, W3C propagator) on a connection
// of its own; the server's x-trace-id header must be the root's trace id.
func (c *client) trace() error {
	ctx, cancel := callCtx()
	defer cancel()
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	opts := append(topspinotel.DialOptions(topspinotel.WithTracerProvider(tp),
		topspinotel.WithPropagators(propagation.TraceContext{})), c.opts...)
	cc, err := topspin.Dial(ctx, c.target, opts...)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer cc.Close()
	ctx, root := tp.Tracer("matrix-client").Start(ctx, "trace")
	var header topspin.Metadata
	resp, err := matrixpb.NewMatrixClient(cc).Unary(ctx, &matrixpb.Msg{Payload: []byte("trace")}, topspin.Header(&header))
	root.End()
	if err != nil {
		return err
	}
	if string(resp.Payload) != "trace" {
		return fmt.Errorf("payload %q, want %q", resp.Payload, "trace")
	}
	want := root.SpanContext().TraceID().String()
	got, ok := header.Get("x-trace-id")
	if !ok {
		return fmt.Errorf("no x-trace-id header (the root's trace id is %s): the server made no span continuing it", want)
	}
	if got != want {
		return fmt.Errorf("x-trace-id %q, want the root span's trace id %s", got, want)
	}
	return nil
}
