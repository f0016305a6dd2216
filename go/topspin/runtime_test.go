package topspin_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
	"github.com/topspin-rpc/topspin/go/wire"
)

// testServer registers one method of each kind (raw codec) and serves on target.
func testServer(t *testing.T, network string, opts ...topspin.Option) (*topspin.Server, string) {
	t.Helper()
	s := topspin.NewServer(opts...)
	s.Handle("/t.S/Echo", topspin.UnaryRaw(func(ctx context.Context, md topspin.Metadata, req []byte) ([]byte, error) {
		ss := topspin.ServerStreamFrom(ctx)
		if v, ok := md.Get("fail"); ok {
			code, _ := strconv.Atoi(v)
			ss.SetTrailer(topspin.MD("why", "asked"))
			return nil, topspin.Errorf(topspin.Code(code), "failing as asked")
		}
		if v, ok := md.Get("user"); ok {
			ss.SetHeader(topspin.MD("hello", v))
			ss.SetTrailer(topspin.MD("bye", v))
		}
		return req, nil
	}), topspin.CodecRaw)
	s.Handle("/t.S/Count", func(ss *topspin.ServerStream) error { // server streaming
		req, err := ss.Recv()
		if err != nil {
			return err
		}
		n, _ := strconv.Atoi(string(req))
		for i := 0; i < n; i++ {
			if err := ss.Send([]byte(strconv.Itoa(i))); err != nil {
				return err
			}
		}
		return nil
	}, topspin.CodecRaw)
	s.Handle("/t.S/Sum", func(ss *topspin.ServerStream) error { // client streaming
		sum := 0
		for {
			m, err := ss.Recv()
			if err == io.EOF {
				return ss.Send([]byte(strconv.Itoa(sum)))
			}
			if err != nil {
				return err
			}
			v, _ := strconv.Atoi(string(m))
			sum += v
		}
	}, topspin.CodecRaw)
	s.Handle("/t.S/Bidi", func(ss *topspin.ServerStream) error {
		for {
			m, err := ss.Recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if err := ss.Send(append([]byte("re:"), m...)); err != nil {
				return err
			}
		}
	}, topspin.CodecRaw)
	s.Handle("/t.S/Wait", func(ss *topspin.ServerStream) error {
		<-ss.Context().Done()
		return ss.Context().Err()
	}, topspin.CodecRaw)
	var l net.Listener
	var err error
	var target string
	if network == "unix" {
		path := filepath.Join(t.TempDir(), "s.sock")
		target = "unix://" + path
		l, err = topspin.Listen(target)
	} else if network == "tls" {
		l, err = topspin.Listen("tls://127.0.0.1:0", opts...)
		if err == nil {
			target = "tls://" + l.Addr().String()
		}
	} else {
		l, err = topspin.Listen("tcp://127.0.0.1:0")
		if err == nil {
			target = "tcp://" + l.Addr().String()
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return s, target
}

func dial(t *testing.T, target string, opts ...topspin.Option) *topspin.ClientConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc, err := topspin.Dial(ctx, target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func ctx10(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var raw = topspin.WithCodec(topspin.CodecRaw)

func TestEveryCallKind(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			_, target := testServer(t, network)
			cc := dial(t, target)
			ctx := ctx10(t)

			// unary, with metadata both ways
			var hdr, trl topspin.Metadata
			mctx := topspin.WithOutgoingMetadata(ctx, topspin.MD("user", "ann"))
			out, err := cc.InvokeRaw(mctx, "/t.S/Echo", []byte("ping"), raw, topspin.Header(&hdr), topspin.Trailer(&trl))
			if err != nil || string(out) != "ping" {
				t.Fatalf("unary: %q %v", out, err)
			}
			if v, _ := hdr.Get("hello"); v != "ann" {
				t.Fatalf("header %v", hdr)
			}
			if v, _ := trl.Get("bye"); v != "ann" {
				t.Fatalf("trailer %v", trl)
			}

			// server streaming
			cs, err := cc.NewStream(ctx, "/t.S/Count", raw)
			if err != nil {
				t.Fatal(err)
			}
			if err := cs.Send([]byte("5")); err != nil {
				t.Fatal(err)
			}
			_ = cs.CloseSend()
			var got []string
			for {
				m, err := cs.Recv()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, string(m))
			}
			if fmt.Sprint(got) != "[0 1 2 3 4]" {
				t.Fatalf("server streaming: %v", got)
			}

			// client streaming
			cs, err = cc.NewStream(ctx, "/t.S/Sum", raw)
			if err != nil {
				t.Fatal(err)
			}
			for i := 1; i <= 10; i++ {
				if err := cs.Send([]byte(strconv.Itoa(i))); err != nil {
					t.Fatal(err)
				}
			}
			_ = cs.CloseSend()
			m, err := cs.Recv()
			if err != nil || string(m) != "55" {
				t.Fatalf("client streaming: %q %v", m, err)
			}
			if _, err := cs.Recv(); err != io.EOF {
				t.Fatalf("want EOF, got %v", err)
			}

			// bidi
			cs, err = cc.NewStream(ctx, "/t.S/Bidi", raw)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				if err := cs.Send([]byte{'a' + byte(i)}); err != nil {
					t.Fatal(err)
				}
				m, err := cs.Recv()
				if err != nil || string(m) != "re:"+string(rune('a'+i)) {
					t.Fatalf("bidi: %q %v", m, err)
				}
			}
			_ = cs.CloseSend()
			if _, err := cs.Recv(); err != io.EOF {
				t.Fatalf("want EOF, got %v", err)
			}
		})
	}
}

func TestStatusCodesAndTrailers(t *testing.T) {
	_, target := testServer(t, "tcp")
	cc := dial(t, target)
	for code := topspin.Code(1); code <= 16; code++ {
		var trl topspin.Metadata
		ctx := topspin.WithOutgoingMetadata(ctx10(t), topspin.MD("fail", strconv.Itoa(int(code))))
		_, err := cc.InvokeRaw(ctx, "/t.S/Echo", []byte("x"), raw, topspin.Trailer(&trl))
		var st *topspin.Status
		if !errors.As(err, &st) || st.Code != code || st.Message != "failing as asked" {
			t.Fatalf("code %v: got %v", code, err)
		}
		if v, _ := trl.Get("why"); v != "asked" {
			t.Fatalf("trailers %v", trl)
		}
	}
	_, err := cc.InvokeRaw(ctx10(t), "/t.S/Nope", nil, raw)
	if topspin.CodeOf(err) != topspin.Unimplemented {
		t.Fatalf("unknown method: %v", err)
	}
	_, err = cc.InvokeRaw(ctx10(t), "/t.S/Echo", nil) // protobuf codec: not accepted
	if topspin.CodeOf(err) != topspin.Unimplemented {
		t.Fatalf("wrong codec: %v", err)
	}
}

func TestDeadlineAndCancel(t *testing.T) {
	_, target := testServer(t, "tcp")
	cc := dial(t, target)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := cc.InvokeRaw(ctx, "/t.S/Wait", []byte("x"), raw)
	if topspin.CodeOf(err) != topspin.DeadlineExceeded {
		t.Fatalf("deadline: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("deadline took %v", time.Since(start))
	}
	// Cancel a stream: the server's handler sees its context end.
	ctx2, cancel2 := context.WithCancel(context.Background())
	cs, err := cc.NewStream(ctx2, "/t.S/Wait", raw)
	if err != nil {
		t.Fatal(err)
	}
	cancel2()
	if _, err := cs.Recv(); topspin.CodeOf(err) != topspin.Canceled {
		t.Fatalf("cancel: %v", err)
	}
	// The connection still works.
	if out, err := cc.InvokeRaw(ctx10(t), "/t.S/Echo", []byte("ok"), raw); err != nil || string(out) != "ok" {
		t.Fatalf("after cancel: %q %v", out, err)
	}
}

func TestLargeMessagesAndLimits(t *testing.T) {
	_, target := testServer(t, "tcp", topspin.WithMaxMessageSize(4<<20),
		topspin.WithSettings(wire.Settings{MaxFrameSize: 16384, MaxConcurrentCalls: 2,
			InitialCallWindow: 65536, MaxMessageSize: 4 << 20, MaxMetadataSize: 16384}))
	cc := dial(t, target, topspin.WithSettings(wire.Settings{MaxFrameSize: 16384, MaxConcurrentCalls: 1024,
		InitialCallWindow: 32768, MaxMessageSize: 4 << 20, MaxMetadataSize: 16384}))
	big := bytes.Repeat([]byte("0123456789abcdef"), 2<<20/16) // 2 MiB: split into 16 KiB frames
	out, err := cc.InvokeRaw(ctx10(t), "/t.S/Echo", big, raw)
	if err != nil || !bytes.Equal(out, big) {
		t.Fatalf("2 MiB echo: %d bytes, %v", len(out), err)
	}
	_, err = cc.InvokeRaw(ctx10(t), "/t.S/Echo", make([]byte, 5<<20), raw)
	if topspin.CodeOf(err) != topspin.ResourceExhausted {
		t.Fatalf("over the limit: %v", err)
	}
	// 20 concurrent calls with MAX_CONCURRENT_CALLS 2: the client queues them.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			msg := []byte(strconv.Itoa(i))
			out, err := cc.InvokeRaw(ctx10(t), "/t.S/Echo", msg, raw)
			if err == nil && !bytes.Equal(out, msg) {
				err = fmt.Errorf("got %q", out)
			}
			errs <- err
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestReconnectAndGracefulStop(t *testing.T) {
	s, target := testServer(t, "tcp")
	cc := dial(t, target, topspin.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	// A call in flight when GracefulStop starts finishes.
	cs, err := cc.NewStream(ctx10(t), "/t.S/Bidi", raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.Send([]byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Recv(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{}) // a signal: closed, never sent on, so it holds nothing
	go func() { s.GracefulStop(); close(stopped) }()
	time.Sleep(50 * time.Millisecond)
	if err := cs.Send([]byte("2")); err != nil {
		t.Fatal(err)
	}
	if m, err := cs.Recv(); err != nil || string(m) != "re:2" {
		t.Fatalf("in flight after GOAWAY: %q %v", m, err)
	}
	_ = cs.CloseSend()
	if _, err := cs.Recv(); err != io.EOF {
		t.Fatal(err)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("GracefulStop did not return")
	}
	// No server: calls fail with UNAVAILABLE.
	_, err = cc.InvokeRaw(ctx10(t), "/t.S/Echo", []byte("x"), raw)
	if topspin.CodeOf(err) != topspin.Unavailable {
		t.Fatalf("no server: %v", err)
	}
	// A new server on the same address: the client reconnects.
	l, err := topspin.Listen(target)
	if err != nil {
		t.Skipf("address not reusable: %v", err)
	}
	s2 := topspin.NewServer()
	s2.Handle("/t.S/Echo", topspin.UnaryRaw(func(_ context.Context, _ topspin.Metadata, req []byte) ([]byte, error) {
		return req, nil
	}), topspin.CodecRaw)
	go func() { _ = s2.Serve(l) }()
	defer s2.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := cc.InvokeRaw(ctx10(t), "/t.S/Echo", []byte("back"), raw)
		if err == nil && string(out) == "back" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reconnect: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestBadInputClosesWithError(t *testing.T) {
	_, target := testServer(t, "tcp")
	_, addr, _ := topspin.ParseTarget(target)
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_, _ = nc.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	all, _ := io.ReadAll(nc) // the server closes the connection
	// preface, SETTINGS, then ERROR BAD_PREFACE
	if len(all) < 8 || !bytes.Equal(all[:8], wire.Preface[:]) {
		t.Fatalf("no preface: %x", all)
	}
	rest := all[8:]
	var last wire.Frame
	for len(rest) > 0 {
		f, n, perr := wire.Decode(rest, 1<<24)
		if perr != nil || n == 0 {
			t.Fatalf("bad frames from the server: %x", all)
		}
		last, rest = f, rest[n:]
	}
	if last.Type != wire.TypeError || wire.ErrCode(last.Code) != wire.BadPreface {
		t.Fatalf("last frame %+v", last)
	}
}

func TestHandshakeTimeout(t *testing.T) {
	_, target := testServer(t, "tcp", topspin.WithHandshakeTimeout(100*time.Millisecond))
	_, addr, _ := topspin.ParseTarget(target)
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	all, err := io.ReadAll(nc)
	if err != nil {
		t.Fatalf("server did not close: %v", err)
	}
	if !bytes.Contains(all, []byte{0x0c, 0, 0, 0, 0, 0, 0, 0, byte(wire.Timeout), 0}) {
		t.Fatalf("no ERROR TIMEOUT in %x", all)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Regression: Header() after Recv had taken a message without waiting (its wake-up note
// still set) and before any HEADERS spun on that note instead of waiting.
func TestHeaderWaitsWithoutSpinning(t *testing.T) {
	_, target := testServer(t, "tcp")
	cc := dial(t, target)
	cs, err := cc.NewStream(ctx10(t), "/t.S/Bidi", raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.Send([]byte("a")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the answer arrives before Recv waits
	if _, err := cs.Recv(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}) // a signal: closed, never sent on, so it holds nothing
	go func() {
		_, _ = cs.Header() // the server sends no HEADERS: waits for the end
		close(done)
	}()
	start := cpuTime()
	time.Sleep(300 * time.Millisecond)
	used := cpuTime() - start
	_ = cs.CloseSend()
	<-done
	if used > 150*time.Millisecond {
		t.Fatalf("Header() burned %v of CPU in 300 ms while waiting", used)
	}
}

// Regression: Send on a stream whose handler already returned reported a *Status with
// code OK as its error.
func TestSendAfterEndFails(t *testing.T) {
	s := topspin.NewServer()
	got := make(chan error, 1)
	s.Handle("/t.S/Leak", func(ss *topspin.ServerStream) error {
		go func() {
			<-ss.Context().Done() // the handler has returned
			got <- ss.Send([]byte("late"))
		}()
		return nil
	}, topspin.CodecRaw)
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	defer s.Stop()
	cc := dial(t, "tcp://"+l.Addr().String())
	cs, err := cc.NewStream(ctx10(t), "/t.S/Leak", raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Recv(); err != io.EOF {
		t.Fatalf("call: %v", err)
	}
	err = <-got
	if err == nil || topspin.CodeOf(err) == topspin.OK {
		t.Fatalf("Send after the end: %v (code %v)", err, topspin.CodeOf(err))
	}
}

// Regression: a client that sends calls and never reads made the server queue every
// call's window of output (here 100 calls × 1 MiB); now senders wait once a connection
// has 4 MiB queued.
func TestServerOutputBoundedWhenClientDoesNotRead(t *testing.T) {
	s := topspin.NewServer()
	var sent atomic.Int64
	chunk := make([]byte, 64<<10)
	s.Handle("/t.S/Flood", func(ss *topspin.ServerStream) error {
		for {
			if err := ss.Send(chunk); err != nil {
				return err
			}
			sent.Add(1)
		}
	}, topspin.CodecRaw)
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	defer s.Stop()
	nc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	out := append([]byte{}, wire.Preface[:]...)
	out = wire.Append(out, &wire.Frame{Type: wire.TypeSettings})
	for id := uint32(1); id <= 100; id++ {
		out = wire.Append(out, &wire.Frame{Type: wire.TypeCall, Flags: wire.FlagNamed, CallID: id,
			MethodName: "/t.S/Flood", Codec: topspin.CodecRaw, Metadata: topspin.Metadata{}})
	}
	if _, err := nc.Write(out); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the client reads nothing
	if n := sent.Load(); n > 800 {
		t.Fatalf("the server queued %d messages of 64 KiB for a client that reads nothing", n)
	}
}
