package matrix_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/tools/internal/matrix"
	"github.com/topspin-rpc/topspin/go/tools/internal/matrixpb"
	"github.com/topspin-rpc/topspin/go/topspin"
)

// serve starts a server of impl on network ("tcp" or "unix") and returns its target.
func serve(t *testing.T, network string, impl matrixpb.MatrixServer) string {
	return serveWith(t, network, impl, matrix.ServerOptions()...)
}

func serveWith(t *testing.T, network string, impl matrixpb.MatrixServer, opts ...topspin.Option) string {
	t.Helper()
	target := "tcp://127.0.0.1:0"
	if network == "unix" {
		dir, err := os.MkdirTemp("", "mx") // short: a socket path has at most 107 bytes
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		target = "unix://" + filepath.Join(dir, "m.sock")
	}
	l, err := topspin.Listen(target)
	if err != nil {
		t.Fatal(err)
	}
	srv := topspin.NewServer(opts...)
	matrixpb.RegisterMatrixServer(srv, impl)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	if network == "tcp" {
		target = "tcp://" + l.Addr().String()
	}
	return target
}

// encodings records the request encoding of the compression check's calls (64 KiB
// payloads): the check itself sees only the echo.
type encodings struct {
	*matrix.Service
	mu   sync.Mutex
	seen []string
}

func (e *encodings) Unary(ctx context.Context, req *matrixpb.Msg) (*matrixpb.Msg, error) {
	if len(req.Payload) == 64*1024 {
		enc, _ := topspin.ServerStreamFrom(ctx).Metadata().Get("topspin-encoding")
		e.mu.Lock()
		e.seen = append(e.seen, enc)
		e.mu.Unlock()
	}
	return e.Service.Unary(ctx, req)
}

// The Go client's checks against the Go server, in process: every check ok, in order.
func TestGoClientAgainstGoServer(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			svc := &encodings{Service: matrix.NewService()}
			target := serve(t, network, svc)
			var out bytes.Buffer
			if !matrix.Run(target, fmt.Sprintf("go-test-%s", network), &out) {
				t.Errorf("a check failed:\n%s", out.String())
			}
			svc.mu.Lock()
			if got := strings.Join(svc.seen, ","); got != "gzip,zstd" {
				t.Errorf("the compression check's requests came in %q, want gzip then zstd", got)
			}
			svc.mu.Unlock()
			var want strings.Builder
			for _, name := range matrix.CheckNames() {
				fmt.Fprintf(&want, "ok %s\n", name)
			}
			if out.String() != want.String() {
				t.Errorf("output:\n%s\nwant:\n%s", out.String(), want.String())
			}
		})
	}
}

// broken answers every method UNIMPLEMENTED except those overridden below.
type broken struct {
	matrixpb.UnimplementedMatrixServer
}

// Unary answers without the metadata echoes.
func (broken) Unary(ctx context.Context, req *matrixpb.Msg) (*matrixpb.Msg, error) {
	return &matrixpb.Msg{Payload: req.Payload}, nil
}

// A server that does not follow the contract fails the checks by name, and quickly.
func TestChecksFailAgainstABrokenServer(t *testing.T) {
	target := serve(t, "tcp", broken{})
	var out bytes.Buffer
	start := time.Now()
	if matrix.Run(target, "go-test-broken", &out) {
		t.Fatalf("every check passed against a broken server:\n%s", out.String())
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the run took %v", took)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	names := matrix.CheckNames()
	if len(lines) != len(names) {
		t.Fatalf("%d lines for %d checks:\n%s", len(lines), len(names), out.String())
	}
	for i, line := range lines {
		want := "FAIL " + names[i] + ": "
		if names[i] == "large" || names[i] == "compression" { // plain echoes: they pass
			want = "ok " + names[i]
		}
		if !strings.HasPrefix(line, want) {
			t.Errorf("line %d: %q, want %q…", i, line, want)
		}
	}
	if !strings.Contains(lines[0], "x-echo") {
		t.Errorf("the unary check does not name the missing header: %q", lines[0])
	}
}

// The trace check passes only when the server's instrumentation continued the client's
// trace: without it the Unary handler has no span and sends no x-trace-id.
func TestTraceCheckNeedsTheServersInstrumentation(t *testing.T) {
	target := serveWith(t, "tcp", matrix.NewService()) // no OpenTelemetry
	var out bytes.Buffer
	if matrix.Run(target, "go-test-untraced", &out) {
		t.Fatalf("every check passed against an untraced server:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "\nok compression\nFAIL trace: no x-trace-id header") {
		t.Errorf("want only the trace check failing, naming the header:\n%s", out.String())
	}
	if strings.Count(out.String(), "FAIL") != 1 {
		t.Errorf("more than the trace check failed:\n%s", out.String())
	}
}

// trailerOnly fails as asked but sends x-fail-h as a trailer, not a response header.
type trailerOnly struct {
	*matrix.Service
}

func (trailerOnly) Fail(ctx context.Context, req *matrixpb.FailReq) (*matrixpb.Msg, error) {
	return nil, &topspin.Status{Code: topspin.Code(req.Code), Message: req.Message,
		Trailers: topspin.MD(topspin.KeyStatusDetails, string(req.Details), "x-fail-h", "v1")}
}

// The error-details check wants the Fail handler's header among the error's response
// headers (protocol.md §5.4): the same header as a trailer does not pass.
func TestErrorDetailsCheckWantsTheHeaderOnTheError(t *testing.T) {
	target := serve(t, "tcp", trailerOnly{matrix.NewService()})
	var out bytes.Buffer
	if matrix.Run(target, "go-test-trailer-only", &out) {
		t.Fatalf("every check passed against a server that sends no x-fail-h header:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "\nFAIL error-details: header x-fail-h") {
		t.Errorf("want the error-details check failing, naming the header:\n%s", out.String())
	}
	if strings.Count(out.String(), "FAIL") != 1 {
		t.Errorf("more than the error-details check failed:\n%s", out.String())
	}
}

// A client given a closed port fails every check with the reason, without hanging.
func TestUnreachableServerFailsEveryCheck(t *testing.T) {
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := "tcp://" + l.Addr().String()
	_ = l.Close()
	var out bytes.Buffer
	if matrix.Run(target, "go-test-down", &out) {
		t.Fatal("passed with no server")
	}
	if n := strings.Count(out.String(), "FAIL "); n != len(matrix.CheckNames()) {
		t.Errorf("%d FAIL lines:\n%s", n, out.String())
	}
}

// A WebSocket target: the Go runtime has none, so every check is a skip (nothing failed).
func TestWebSocketTargetIsSkipped(t *testing.T) {
	var out bytes.Buffer
	if !matrix.Run("ws://127.0.0.1:1/", "go-test-ws", &out) {
		t.Error("a run of skips failed")
	}
	if n := strings.Count(out.String(), "skip "); n != len(matrix.CheckNames()) || strings.Count(out.String(), "\n") != n {
		t.Errorf("output:\n%s", out.String())
	}
}
