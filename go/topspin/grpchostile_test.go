package topspin_test

// Hostile gRPC clients (docs/hardening.md, "The other faces"): each attacks the gRPC face
// of a real server over loopback TCP while a well-behaved native client calls throughout,
// and ends with the gauges back to that client alone.

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
	"google.golang.org/grpc"
)

// stopsReading is a client's socket that reads nothing once stop is set (its Read blocks
// until the socket is closed).
type stopsReading struct {
	net.Conn
	stop    atomic.Bool
	closed  chan struct{} // a signal: closed, never sent on
	onClose sync.Once
}

func (c *stopsReading) Read(p []byte) (int, error) {
	if c.stop.Load() {
		<-c.closed
		return 0, net.ErrClosed
	}
	return c.Conn.Read(p)
}

func (c *stopsReading) Close() error {
	c.onClose.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// A grpc-go client with wide-open windows asks for 40 answers of 1 MiB and then reads
// nothing: once its socket has taken none of the server's bytes for the write timeout, the
// server closes the connection and ends its calls (before: grpc-go's writer waited on the
// socket for ever, the connection and its calls stayed).
func TestAGRPCClientThatStopsReadingIsCutAtTheWriteTimeout(t *testing.T) {
	const wt = 300 * time.Millisecond
	h := startHostile(t, topspin.WithWriteTimeout(wt))
	done := h.probe(t)
	var sock *stopsReading
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		nc, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		_ = nc.(*net.TCPConn).SetReadBuffer(64 << 10)
		sock = &stopsReading{Conn: nc, closed: make(chan struct{})}
		return sock, nil
	}
	cc := grpcClient(t, "tcp", h.addr, grpc.WithContextDialer(dialer),
		grpc.WithInitialWindowSize(1<<30), grpc.WithInitialConnWindowSize(1<<30))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := unary(ctx, cc, "/h.S/Echo", []byte("x")); err != nil {
		t.Fatal(err)
	}
	sock.stop.Store(true)
	var calls sync.WaitGroup
	for range 40 { // 40 MiB of answers: more than loopback buffers
		calls.Add(1)
		go func() { defer calls.Done(); _, _ = unary(ctx, cc, "/h.S/Big", []byte("x")) }()
	}
	g := h.settle(t, "the attacker's calls under way", func(g topspin.Gauges) bool {
		return g.Connections == 2 && h.bigRuns.Load() > 0
	})
	start := time.Now()
	h.settle(t, "the never-reading gRPC connection closed", func(g topspin.Gauges) bool {
		return g.Connections == 1 && g.OpenCalls == 0
	})
	took := time.Since(start)
	t.Logf("never-reading gRPC client: %+v with its calls; closed %v later (write timeout %v)", g, took.Round(time.Millisecond), wt)
	if took > 4*wt+time.Second {
		t.Errorf("closed %v after its calls started, write timeout %v", took, wt)
	}
	done()
	_ = sock.Close()
	calls.Wait()
	h.after(t)
}
