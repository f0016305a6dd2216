package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/tools/internal/matrix"
	"github.com/topspin-rpc/topspin/go/tools/internal/matrixpb"
	"github.com/topspin-rpc/topspin/go/topspin"
)

// bins holds the programs, built once for the package's tests.
var bins struct {
	once           sync.Once
	dir            string
	server, client string
	err            error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bins.dir != "" {
		_ = os.RemoveAll(bins.dir)
	}
	os.Exit(code)
}

// programs builds ./cmd/matrix-server and ./cmd/matrix-client from go/tools as the matrix runner
// does (go build -o DIR/go-matrix-server ./cmd/matrix-server) and returns them.
func programs(t *testing.T) (server, client string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the programs")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool on PATH to build the matrix programs")
	}
	bins.once.Do(func() {
		if bins.dir, bins.err = os.MkdirTemp("", "matrix-bin"); bins.err != nil {
			return
		}
		for _, name := range []string{"matrix-server", "matrix-client"} {
			cmd := exec.Command(goTool, "build", "-o", filepath.Join(bins.dir, "go-"+name), "./cmd/"+name)
			cmd.Dir = filepath.Join("..", "..")
			if out, err := cmd.CombinedOutput(); err != nil {
				bins.err = fmt.Errorf("go build ./cmd/%s: %v\n%s", name, err, out)
				return
			}
		}
		bins.server, bins.client = filepath.Join(bins.dir, "go-matrix-server"), filepath.Join(bins.dir, "go-matrix-client")
	})
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	return bins.server, bins.client
}

// startServer runs the server on addrs and returns the process and its "listening" addresses.
func startServer(t *testing.T, bin string, addrs ...string) (*exec.Cmd, []string) {
	t.Helper()
	var args []string
	for _, a := range addrs {
		args = append(args, "--listen", a)
	}
	srv := exec.Command(bin, args...)
	srv.Stderr = os.Stderr
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var got []string
	for range addrs {
		select {
		case line, ok := <-lines:
			addr, found := strings.CutPrefix(line, "listening ")
			if !ok || !found {
				t.Fatalf("server printed %q (open %v), want \"listening ADDR\"", line, ok)
			}
			got = append(got, addr)
		case <-time.After(10 * time.Second):
			t.Fatal("no \"listening\" line within 10 s")
		}
	}
	return srv, got
}

// The programs the runner builds, as processes: the server on TCP and a Unix socket, the
// client against each (every check ok, exit 0), then SIGTERM with a held call open: the
// server exits 0 within 2 s.
func TestMatrixProgramsOverTCPAndUnix(t *testing.T) {
	serverBin, clientBin := programs(t)
	sockDir, err := os.MkdirTemp("", "mx") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	unixAddr := "unix://" + filepath.Join(sockDir, "m.sock")
	srv, addrs := startServer(t, serverBin, "tcp://127.0.0.1:0", unixAddr)
	if !strings.HasPrefix(addrs[0], "tcp://127.0.0.1:") || strings.HasSuffix(addrs[0], ":0") || addrs[1] != unixAddr {
		t.Fatalf("listening on %q, want a resolved tcp:// address and %q", addrs, unixAddr)
	}
	var want strings.Builder
	for _, name := range matrix.CheckNames() {
		want.WriteString("ok " + name + "\n")
	}
	for _, addr := range addrs {
		out, err := exec.Command(clientBin, "--target", addr).Output()
		if err != nil || string(out) != want.String() {
			t.Errorf("client --target %s: %v\n%s", addr, err, out)
		}
	}
	holdThenTerm(t, srv, addrs[0])
}

// holdThenTerm opens a held server stream, sends SIGTERM and wants exit 0 within 2 s.
func holdThenTerm(t *testing.T, srv *exec.Cmd, target string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc, err := topspin.Dial(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	mc := matrixpb.NewMatrixClient(cc)
	if _, err := mc.ServerStream(ctx, &matrixpb.StreamReq{Hold: true, Tag: "held"}); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.Unary(ctx, &matrixpb.Msg{}); err != nil { // the held call has reached the server
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	start := time.Now()
	if err := srv.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go func() { exited <- srv.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("server exit after SIGTERM: %v", err)
		}
		t.Logf("server exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	case <-time.After(2 * time.Second):
		t.Error("server still running 2 s after SIGTERM")
	}
}

// Usage errors: no --target (client), an address the Go runtime cannot serve (server).
func TestMatrixProgramsRefuseBadArguments(t *testing.T) {
	serverBin, clientBin := programs(t)
	var stderr bytes.Buffer
	cmd := exec.Command(clientBin)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), "--target") {
		t.Errorf("client without --target: %v, %q", err, stderr.String())
	}
	stderr.Reset()
	cmd = exec.Command(serverBin, "--listen", "ws://127.0.0.1:0/")
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), "ws://") {
		t.Errorf("server on ws://: %v, %q", err, stderr.String())
	}
}
