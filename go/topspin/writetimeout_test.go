package topspin_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
)

// A client whose server stops reading: once the server has taken none of its bytes for
// the write timeout, the connection closes and the calls under way fail UNAVAILABLE naming
// it (calls not yet sent try to reconnect, refused here, after the backoff: they fail
// UNAVAILABLE or reach their deadline).
func TestClientWriteTimeout(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() { // a server that says hello and never reads
		nc, err := l.Accept()
		_ = l.Close() // a reconnection is refused at once
		if err != nil {
			return
		}
		_ = nc.(*net.TCPConn).SetReadBuffer(64 << 10)
		_ = nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = nc.Write(hello())
		accepted <- nc
	}()
	const wt = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc, err := topspin.Dial(ctx, "tcp://"+l.Addr().String(), topspin.WithWriteTimeout(wt))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	nc := <-accepted
	defer nc.Close()

	req := make([]byte, 1<<20)
	var wg sync.WaitGroup
	type result struct {
		err error
		at  time.Duration
	}
	errs := make(chan result, 32)
	start := time.Now()
	for range 32 { // 32 MiB of requests (1 MiB each, within a call's window): more than loopback buffers
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := cc.InvokeRaw(ctx, "/h.S/Echo", req, raw)
			errs <- result{err, time.Since(start)}
		}()
	}
	wg.Wait()
	close(errs)
	took := time.Since(start)
	named := 0
	var last time.Duration
	for r := range errs {
		err := r.err
		if err == nil {
			t.Fatal("a call succeeded although the server reads nothing")
		}
		if strings.Contains(err.Error(), "write timeout") {
			if topspin.CodeOf(err) != topspin.Unavailable {
				t.Errorf("call: %v, want UNAVAILABLE", err)
			}
			named++
			last = max(last, r.at)
		}
	}
	if named == 0 {
		t.Error("no call's error names the write timeout")
	}
	t.Logf("%d calls failed naming the write timeout (%v), the last %v after the start; all over after %v",
		named, wt, last.Round(time.Millisecond), took.Round(time.Millisecond))
	if last > 3*time.Second {
		t.Errorf("the write timeout (%v) ended the calls only %v after they started", wt, last)
	}
}
