//go:build unix

package topspin_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
)

// serveUnix serves /t.S/Echo on l and returns a function that checks a call over path.
func serveUnix(t *testing.T, l net.Listener) func(path string) {
	s := topspin.NewServer()
	s.Handle("/t.S/Echo", topspin.UnaryRaw(func(_ context.Context, _ topspin.Metadata, req []byte) ([]byte, error) {
		return req, nil
	}), topspin.CodecRaw)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return func(path string) {
		t.Helper()
		cc := dial(t, "unix://"+path)
		if out, err := cc.InvokeRaw(ctx10(t), "/t.S/Echo", []byte("hi"), raw); err != nil || string(out) != "hi" {
			t.Fatalf("call over %s: %q, %v", path, out, err)
		}
	}
}

// (h) A second server binding the path of a live one fails and leaves it alone; a stale
// socket file is replaced; the file gets the socket mode and goes when the listener closes.
func TestUnixSocketPathsAreBoundSafely(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := topspin.Listen("unix://" + path)
	if err != nil {
		t.Fatal(err)
	}
	call := serveUnix(t, l)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket file: %v, %v; want mode 0660", fi, err)
	}
	_, err = topspin.Listen("unix://" + path)
	var inUse *topspin.AddrInUseError
	if !errors.As(err, &inUse) || !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("binding a live server's path: %v", err)
	}
	call(path) // the live server still answers on its file
	if _, err := os.Stat(path + ".lock"); !os.IsNotExist(err) {
		t.Fatalf("lock file left behind: %v", err)
	}
	_ = l.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("socket file left after Close: %v", err)
	}

	// A stale file: a socket nothing answers on.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	_ = stale.Close()
	l2, err := topspin.Listen("unix://"+path, topspin.WithUnixSocketMode(0o600))
	if err != nil {
		t.Fatalf("a stale socket file was not replaced: %v", err)
	}
	serveUnix(t, l2)(path)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket file: %v, %v; want mode 0600", fi, err)
	}

	// Another server's file at the path (ours was removed behind our back): not removed by
	// our Close.
	_ = os.Remove(path)
	l3, err := topspin.Listen("unix://" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer l3.Close()
	_ = l2.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("closing a listener removed another server's socket file: %v", err)
	}
}

// "unix:@name" (the form the Rust, Python and TypeScript runtimes and protocol.md use) is a
// Linux abstract socket, for Listen and Dial alike.
func TestAbstractUnixTargets(t *testing.T) {
	network, addr, err := topspin.ParseTarget("unix:@topspin-go-test")
	if err != nil || network != "unix" || addr != "@topspin-go-test" {
		t.Fatalf("ParseTarget: %q %q %v", network, addr, err)
	}
	if runtime.GOOS != "linux" {
		t.Skip("abstract sockets are Linux's")
	}
	name := fmt.Sprintf("unix:@topspin-go-test-%d", os.Getpid())
	l, err := topspin.Listen(name)
	if err != nil {
		t.Fatalf("Listen(%s): %v", name, err)
	}
	srv := topspin.NewServer()
	srv.Handle("/t.S/Echo", topspin.UnaryRaw(func(_ context.Context, _ topspin.Metadata, req []byte) ([]byte, error) {
		return req, nil
	}), topspin.CodecRaw)
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc, err := topspin.Dial(ctx, name)
	if err != nil {
		t.Fatalf("Dial(%s): %v", name, err)
	}
	defer func() { _ = cc.Close() }()
	out, err := cc.InvokeRaw(ctx, "/t.S/Echo", []byte("hi"), topspin.WithCodec(topspin.CodecRaw))
	if err != nil || string(out) != "hi" {
		t.Fatalf("echo over %s: %q %v", name, out, err)
	}
}
