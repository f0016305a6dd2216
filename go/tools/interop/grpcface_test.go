package interop_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/examples/kvstore"
	"github.com/topspin-rpc/topspin/go/examples/kvstore/kvpb"
	"github.com/topspin-rpc/topspin/go/reflection"
	"github.com/topspin-rpc/topspin/go/topspin"
)

// startGoFull serves the Go kvstore with health and reflection, as cmd/kvstore-go-server
// does, on a TCP port; it returns the server's health table and its host:port.
func startGoFull(t *testing.T) (*topspin.Health, string) {
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := topspin.NewServer()
	kvpb.RegisterStoreServer(s, kvstore.NewStore())
	h := s.EnableHealth()
	h.SetServingStatus("kv.v1.Store", topspin.HealthServing)
	reflection.Register(s)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return h, l.Addr().String()
}

// run runs bin with args (20 s at most): stdout, stderr and the exit status.
func run(t *testing.T, bin string, args ...string) (string, string, int) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(c, bin, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	case err != nil:
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return stdout.String(), stderr.String(), 0
}

func contains(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Fatalf("%s: output lacks %q:\n%s", what, w, out)
		}
	}
}

// The Rust topspin CLI against the Go server, through the Go server's native reflection
// (no .proto files): list, describe (with the .proto's comments), a call, and health (the server, a service, an unknown
// one, a service turned NOT_SERVING).
func TestRustCLIReflectionAndHealthGoServer(t *testing.T) {
	bin := binary(t, "TOPSPIN_CLI")
	h, addr := startGoFull(t)
	target := "tcp://" + addr
	out, e, code := run(t, bin, "list", target)
	if code != 0 {
		t.Fatalf("list: %d %s", code, e)
	}
	contains(t, "list", out, "kv.v1.Store\n  Get(kv.v1.GetRequest) returns (kv.v1.Entry)\n",
		"  Watch(kv.v1.WatchRequest) returns (stream kv.v1.Event)\n",
		"  GetMany(stream kv.v1.GetRequest) returns (stream kv.v1.Entry)\n",
		"grpc.health.v1.Health\n  Check(grpc.health.v1.HealthCheckRequest) returns (grpc.health.v1.HealthCheckResponse)\n",
		"topspin.reflection.v1.Reflection\n")
	out, e, code = run(t, bin, "describe", target, "kv.v1.Store")
	if code != 0 {
		t.Fatalf("describe: %d %s", code, e)
	}
	contains(t, "describe", out, "// Stores string values under string keys.", "service Store {\n",
		"  rpc Apply(stream kv.v1.Mutation) returns (kv.v1.ApplySummary);\n")
	out, e, code = run(t, bin, "describe", target, "kv.v1.PutRequest")
	if code != 0 {
		t.Fatalf("describe message: %d %s", code, e)
	}
	contains(t, "describe kv.v1.PutRequest", out, "optional uint64 expected_version = 3;")
	out, e, code = run(t, bin, "call", target, "kv.v1.Store/Put", "-d", `{"key": "a", "value": "1"}`)
	if code != 0 {
		t.Fatalf("call: %d %s", code, e)
	}
	contains(t, "call Put", out, `"version": "1"`)
	out, e, code = run(t, bin, "call", target, "kv.v1.Store/GetMany", "-d", `{"key": "a"} {"key": "a"}`)
	if code != 0 || strings.Count(out, `"value":"1"`) != 2 {
		t.Fatalf("call GetMany: %d %q %s", code, out, e)
	}

	for _, svc := range []string{"", "kv.v1.Store"} {
		out, e, code = run(t, bin, "health", target, svc)
		if code != 0 || strings.TrimSpace(out) != "SERVING" {
			t.Fatalf("health %q: %d %q %s", svc, code, out, e)
		}
	}
	if out, e, code = run(t, bin, "health", target, "no.Such"); code != 2 {
		t.Fatalf("health of an unknown service: %d %q %s", code, out, e)
	}
	h.SetServingStatus("kv.v1.Store", topspin.HealthNotServing)
	if out, e, code = run(t, bin, "health", target, "kv.v1.Store"); code != 1 || strings.TrimSpace(out) != "NOT_SERVING" {
		t.Fatalf("health of a service not serving: %d %q %s", code, out, e)
	}
}

// grpcurl finds grpcurl: on PATH, or where scripts/setup-grpc.sh installs it. Without it the
// test is skipped, unless TOPSPIN_INTEROP=1.
func grpcurl(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	p := filepath.Join("..", "..", "..", "target", "grpc-tools", "grpcurl")
	if _, err := os.Stat(p); err == nil {
		abs, _ := filepath.Abs(p)
		return abs
	}
	if os.Getenv("TOPSPIN_INTEROP") == "1" {
		t.Fatal("grpcurl is not on PATH nor in target/grpc-tools (scripts/setup-grpc.sh installs it)")
	}
	t.Skip("grpcurl not found (scripts/setup-grpc.sh installs it)")
	return ""
}

// grpcurl against the Go server's gRPC face, through gRPC server reflection: list,
// describe, unary and bidi calls, health.
func TestGrpcurlGoServer(t *testing.T) {
	bin := grpcurl(t)
	_, addr := startGoFull(t)
	out, e, code := run(t, bin, "-plaintext", addr, "list")
	if code != 0 {
		t.Fatalf("list: %d %s", code, e)
	}
	want := "grpc.health.v1.Health\ngrpc.reflection.v1.ServerReflection\ngrpc.reflection.v1alpha.ServerReflection\nkv.v1.Store\ntopspin.reflection.v1.Reflection\n"
	if out != want {
		t.Fatalf("list: %q, want %q", out, want)
	}
	out, e, code = run(t, bin, "-plaintext", addr, "describe", "kv.v1.Store")
	if code != 0 {
		t.Fatalf("describe: %d %s", code, e)
	}
	contains(t, "describe", out, "kv.v1.Store is a service:", "// Stores string values under string keys.",
		"rpc Apply ( stream .kv.v1.Mutation ) returns ( .kv.v1.ApplySummary );")
	out, e, code = run(t, bin, "-plaintext", "-d", `{"key": "a", "value": "1"}`, addr, "kv.v1.Store/Put")
	if code != 0 {
		t.Fatalf("put: %d %s", code, e)
	}
	contains(t, "put", out, `"version": "1"`)
	out, e, code = run(t, bin, "-plaintext", "-d", `{"key": "a"} {"key": "a"}`, addr, "kv.v1.Store/GetMany")
	if code != 0 || strings.Count(out, `"value": "1"`) != 2 {
		t.Fatalf("get-many: %d %q %s", code, out, e)
	}
	out, e, code = run(t, bin, "-plaintext", "-d", `{"key": "nope"}`, addr, "kv.v1.Store/Get")
	if code == 0 || !strings.Contains(e, "NotFound") {
		t.Fatalf("get of an absent key: %d %q %s", code, out, e)
	}
	out, e, code = run(t, bin, "-plaintext", "-d", `{"service": "kv.v1.Store"}`, addr, "grpc.health.v1.Health/Check")
	if code != 0 {
		t.Fatalf("health: %d %s", code, e)
	}
	contains(t, "health", out, `"status": "SERVING"`)
}
