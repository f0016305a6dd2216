// Package interop runs the Go runtime against the Rust implementation: the Go client
// against the Rust kvstore-server, and the Rust clients (the topspin CLI and
// kvstore-client) against the Go server, over TCP and Unix sockets, every call kind.
//
// The Rust binaries are found through KVSTORE_SERVER, KVSTORE_CLIENT and TOPSPIN_CLI
// (scripts/test-go.sh builds and sets them). Without them the tests are skipped, unless
// TOPSPIN_INTEROP=1, where a missing binary is a failure.
package interop_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/examples/kvstore"
	"github.com/topspin-rpc/topspin/go/examples/kvstore/kvpb"
	"github.com/topspin-rpc/topspin/go/internal/testcert"
	"github.com/topspin-rpc/topspin/go/topspin"
	"google.golang.org/protobuf/proto"
)

func binary(t *testing.T, env string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		if os.Getenv("TOPSPIN_INTEROP") == "1" {
			t.Fatalf("%s is not set", env)
		}
		t.Skipf("%s not set (scripts/test-go.sh sets it)", env)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s: %v", env, err)
	}
	return p
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func targets(t *testing.T) map[string]string {
	return map[string]string{"tcp": "", "unix": "unix://" + filepath.Join(t.TempDir(), "kv.sock")}
}

// startRust runs the Rust kvstore-server on addr and returns the address it listens on.
func startRust(t *testing.T, addr string) string {
	bin := binary(t, "KVSTORE_SERVER")
	if addr == "" {
		addr = "tcp://127.0.0.1:0"
	}
	cmd := exec.Command(bin, addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			if strings.HasPrefix(s.Text(), "listening on ") {
				line <- strings.TrimPrefix(s.Text(), "listening on ")
			}
		}
	}()
	select {
	case l := <-line:
		if strings.HasPrefix(addr, "unix://") {
			return addr
		}
		if !strings.Contains(l, "://") {
			l = "tcp://" + l
		}
		return l
	case <-time.After(20 * time.Second):
		t.Fatal("kvstore-server did not start")
	}
	return ""
}

func TestGoClientRustServer(t *testing.T) {
	for network, addr := range targets(t) {
		t.Run(network, func(t *testing.T) {
			target := startRust(t, addr)
			cc, err := topspin.Dial(ctx(t), target)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			kv := kvpb.NewStoreClient(cc)
			c := ctx(t)

			// Watch first (server streaming), so that it sees the writes below.
			watch, err := kv.Watch(c, &kvpb.WatchRequest{Prefix: "k"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := watch.Header(); err != nil {
				t.Fatal(err)
			}
			// Unary.
			put, err := kv.Put(c, &kvpb.PutRequest{Key: "k1", Value: "v1"})
			if err != nil || put.Version != 1 {
				t.Fatalf("put: %v %v", put, err)
			}
			e, err := kv.Get(c, &kvpb.GetRequest{Key: "k1"})
			if err != nil || e.Value != "v1" || e.Version != 1 {
				t.Fatalf("get: %v %v", e, err)
			}
			if _, err := kv.Get(c, &kvpb.GetRequest{Key: "nope"}); topspin.CodeOf(err) != topspin.NotFound {
				t.Fatalf("get absent: %v", err)
			}
			if _, err := kv.Put(c, &kvpb.PutRequest{Key: "k1", Value: "x", ExpectedVersion: proto.Uint64(7)}); topspin.CodeOf(err) != topspin.FailedPrecondition {
				t.Fatalf("cas: %v", err)
			}
			// Client streaming.
			apply, err := kv.Apply(c)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range []*kvpb.Mutation{
				{Op: &kvpb.Mutation_Put{Put: &kvpb.PutRequest{Key: "k2", Value: "v2"}}},
				{Op: &kvpb.Mutation_Delete{Delete: &kvpb.DeleteRequest{Key: "k1"}}},
			} {
				if err := apply.Send(m); err != nil {
					t.Fatal(err)
				}
			}
			sum, err := apply.CloseAndRecv()
			if err != nil || sum.Puts != 1 || sum.Deletes != 1 {
				t.Fatalf("apply: %v %v", sum, err)
			}
			// Bidirectional.
			many, err := kv.GetMany(c)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				if err := many.Send(&kvpb.GetRequest{Key: "k2"}); err != nil {
					t.Fatal(err)
				}
				e, err := many.Recv()
				if err != nil || e.Value != "v2" {
					t.Fatalf("get-many: %v %v", e, err)
				}
			}
			_ = many.CloseSend()
			if _, err := many.Recv(); err != io.EOF {
				t.Fatalf("get-many end: %v", err)
			}
			del, err := kv.Delete(c, &kvpb.DeleteRequest{Key: "k2"})
			if err != nil || !del.Existed {
				t.Fatalf("delete: %v %v", del, err)
			}
			// The watch saw: put k1, put k2, delete k1, delete k2.
			want := []string{"put:k1", "put:k2", "deleted:k1", "deleted:k2"}
			for _, w := range want {
				ev, err := watch.Recv()
				if err != nil {
					t.Fatalf("watch: %v", err)
				}
				got := "deleted:" + ev.GetDeleted()
				if p := ev.GetPut(); p != nil {
					got = "put:" + p.Key
				}
				if got != w {
					t.Fatalf("watch: %s, want %s", got, w)
				}
			}
			watch.CancelCall()
			// Deadlines reach the Rust server: a Watch with a short deadline ends with
			// DEADLINE_EXCEEDED.
			dc, cancel := context.WithTimeout(c, 200*time.Millisecond)
			defer cancel()
			w2, err := kv.Watch(dc, &kvpb.WatchRequest{})
			if err == nil {
				_, err = w2.Recv()
			}
			if topspin.CodeOf(err) != topspin.DeadlineExceeded {
				t.Fatalf("deadline: %v", err)
			}
		})
	}
}

// startGo serves the Go kvstore on addr ("" = a TCP port) and returns the address.
func startGo(t *testing.T, addr string, opts ...topspin.Option) string {
	if addr == "" {
		addr = "tcp://127.0.0.1:0"
	}
	l, err := topspin.Listen(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	s := topspin.NewServer()
	kvpb.RegisterStoreServer(s, kvstore.NewStore())
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	if tcp, ok := l.Addr().(*net.TCPAddr); ok {
		if strings.HasPrefix(addr, "tls://") {
			return "tls://" + tcp.String()
		}
		return "tcp://" + tcp.String()
	}
	return addr
}

func protoDir() string {
	if d := os.Getenv("KV_PROTO_DIR"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "..", "examples", "kvstore", "proto")
}

// cli runs the topspin CLI: topspin call [extra...] TARGET METHOD --proto … -d DATA.
func cli(t *testing.T, target, method, data string, extra ...string) (string, string, bool) {
	bin := binary(t, "TOPSPIN_CLI")
	dir := protoDir()
	args := append([]string{"call"}, extra...)
	args = append(args, target, method, "--proto", filepath.Join(dir, "kv", "v1", "kv.proto"), "-I", dir, "-d", data)
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(c, bin, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err == nil
}

func TestRustClientGoServer(t *testing.T) {
	for network, addr := range targets(t) {
		t.Run(network, func(t *testing.T) {
			target := startGo(t, addr)
			check := func(ok bool, out, errOut string, want ...string) {
				t.Helper()
				if !ok {
					t.Fatalf("failed: %s %s", out, errOut)
				}
				for _, w := range want {
					if !strings.Contains(out, w) {
						t.Fatalf("output %q lacks %q", out, w)
					}
				}
			}
			out, e, ok := cli(t, target, "kv.v1.Store/Put", `{"key":"a","value":"1"}`)
			check(ok, out, e, `"version": "1"`)
			out, e, ok = cli(t, target, "kv.v1.Store/Get", `{"key":"a"}`)
			check(ok, out, e, `"value": "1"`)
			out, e, ok = cli(t, target, "kv.v1.Store/Get", `{"key":"zz"}`)
			if ok || !strings.Contains(e, "NOT_FOUND") {
				t.Fatalf("get absent: %q %q", out, e)
			}
			out, e, ok = cli(t, target, "kv.v1.Store/Apply", `{"put":{"key":"b","value":"2"}} {"delete":{"key":"a"}}`)
			check(ok, out, e, `"puts": 1`, `"deletes": 1`)
			out, e, ok = cli(t, target, "kv.v1.Store/GetMany", `{"key":"b"} {"key":"b"}`)
			check(ok, out, e)
			if strings.Count(out, `"value":"2"`) != 2 {
				t.Fatalf("get-many: %q", out)
			}
			out, e, ok = cli(t, target, "kv.v1.Store/Watch", `{"include_existing":true}`, "--timeout", "500ms")
			if ok || !strings.Contains(out, `"key":"b"`) || !strings.Contains(e, "DEADLINE_EXCEEDED") {
				t.Fatalf("watch: %q %q", out, e)
			}
			out, e, ok = cli(t, target, "kv.v1.Store/Delete", `{"key":"b"}`, "-H", "user: ann")
			check(ok, out, e, `"existed": true`)

			// kvstore-client, the generated Rust client.
			bin := binary(t, "KVSTORE_CLIENT")
			run := func(args ...string) string {
				c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				b, err := exec.CommandContext(c, bin, append([]string{target}, args...)...).CombinedOutput()
				if err != nil {
					t.Fatalf("kvstore-client %v: %v: %s", args, err, b)
				}
				return string(b)
			}
			run("put", "x", "1")
			if out := run("get", "x"); !strings.Contains(out, "1") {
				t.Fatalf("kvstore-client get: %q", out)
			}
			run("apply", "y=2", "z=3")
			if out := run("get-many", "y", "z"); !strings.Contains(out, "y = 2") || !strings.Contains(out, "z = 3") {
				t.Fatalf("kvstore-client get-many: %q", out)
			}
		})
	}
}

// The Rust CLI calls the Go server over TLS (ALPN topspin/1), trusting only the test CA;
// without that CA it fails naming the certificate problem.
func TestRustClientGoServerTLS(t *testing.T) {
	ca, err := testcert.NewCA("interop CA")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Server()
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	target := startGo(t, "tls://127.0.0.1:0", topspin.WithTLS(&tls.Config{Certificates: []tls.Certificate{cert}}))
	out, e, ok := cli(t, target, "kv.v1.Store/Put", `{"key":"k","value":"tls"}`, "--ca", caFile)
	if !ok || !strings.Contains(out, `"version": "1"`) {
		t.Fatalf("put over TLS: %q %q", out, e)
	}
	out, e, ok = cli(t, target, "kv.v1.Store/Get", `{"key":"k"}`, "--ca", caFile)
	if !ok || !strings.Contains(out, `"value": "tls"`) {
		t.Fatalf("get over TLS: %q %q", out, e)
	}
	out, e, ok = cli(t, target, "kv.v1.Store/Get", `{"key":"k"}`)
	if ok || !strings.Contains(strings.ToLower(e), "certificate") {
		t.Fatalf("without the CA the call should fail naming the certificate: %q %q", out, e)
	}
}

// The Go client compresses its messages (zstd, gzip) for the Rust kvstore-server, which
// decodes them: unary, client streaming and bidi calls with values big enough to compress.
func TestGoClientRustServerCompression(t *testing.T) {
	target := startRust(t, "")
	big := strings.Repeat("compress me please ", 500) // 9 500 bytes
	for _, enc := range []string{"zstd", "gzip"} {
		t.Run(enc, func(t *testing.T) {
			cc, err := topspin.Dial(ctx(t), target, topspin.WithCompression(enc))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			kv := kvpb.NewStoreClient(cc)
			c := ctx(t)
			key := "z-" + enc
			if _, err := kv.Put(c, &kvpb.PutRequest{Key: key, Value: big}); err != nil {
				t.Fatalf("put: %v", err)
			}
			e, err := kv.Get(c, &kvpb.GetRequest{Key: key})
			if err != nil || e.Value != big {
				t.Fatalf("get: %v", err)
			}
			// Per call: the other encoding.
			other := map[string]string{"zstd": "gzip", "gzip": "zstd"}[enc]
			if _, err := kv.Put(c, &kvpb.PutRequest{Key: key + "2", Value: big + "2"}, topspin.CallCompression(other)); err != nil {
				t.Fatalf("put with %s: %v", other, err)
			}
			apply, err := kv.Apply(c)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				if err := apply.Send(&kvpb.Mutation{Op: &kvpb.Mutation_Put{Put: &kvpb.PutRequest{Key: key + "-a", Value: big}}}); err != nil {
					t.Fatal(err)
				}
			}
			if sum, err := apply.CloseAndRecv(); err != nil || sum.Puts != 3 {
				t.Fatalf("apply: %v %v", sum, err)
			}
			many, err := kv.GetMany(c)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{key, key + "2", key + "-a"} {
				if err := many.Send(&kvpb.GetRequest{Key: k}); err != nil {
					t.Fatal(err)
				}
				e, err := many.Recv()
				if err != nil || !strings.HasPrefix(e.Value, big) {
					t.Fatalf("get-many %s: %v", k, err)
				}
			}
			_ = many.CloseSend()
			if _, err := many.Recv(); err != io.EOF {
				t.Fatalf("get-many end: %v", err)
			}
		})
	}
}

// A Go client with keep-alive at the shortest interval stays within the Rust server's PING
// rate limit: a watch opened before 1.5 s of idle pinging still gets the next change.
func TestGoClientRustServerKeepalive(t *testing.T) {
	target := startRust(t, "")
	cc, err := topspin.Dial(ctx(t), target, topspin.WithKeepalive(topspin.MinKeepaliveInterval, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	kv := kvpb.NewStoreClient(cc)
	c := ctx(t)
	watch, err := kv.Watch(c, &kvpb.WatchRequest{Prefix: "ka"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Header(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // ~15 PINGs
	if _, err := kv.Put(c, &kvpb.PutRequest{Key: "ka", Value: "1"}); err != nil {
		t.Fatal(err)
	}
	ev, err := watch.Recv()
	if err != nil || ev.GetPut().GetKey() != "ka" {
		t.Fatalf("watch after idle pinging: %v %v", ev, err)
	}
}
