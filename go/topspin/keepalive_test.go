package topspin_test

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
)

// proxy forwards TCP connections to target, counting connections and bytes each way; once
// frozen it forwards nothing more (the sockets stay open: a silent, dead path).
type proxy struct {
	addr     string
	conns    atomic.Int64
	up, down atomic.Int64 // bytes client → server, server → client
	frozen   atomic.Bool
	stop     chan struct{}
	mu       sync.Mutex
	open     []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: "tcp://" + l.Addr().String(), stop: make(chan struct{})}
	t.Cleanup(func() {
		close(p.stop)
		_ = l.Close()
		p.mu.Lock()
		for _, c := range p.open {
			_ = c.Close()
		}
		p.mu.Unlock()
	})
	to := strings.TrimPrefix(target, "tcp://")
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.conns.Add(1)
			p.mu.Lock()
			p.open = append(p.open, c, s)
			p.mu.Unlock()
			go p.pipe(s, c, &p.up)
			go p.pipe(c, s, &p.down)
		}
	}()
	return p
}

func (p *proxy) pipe(dst, src net.Conn, n *atomic.Int64) {
	buf := make([]byte, 32<<10)
	for {
		k, err := src.Read(buf)
		if p.frozen.Load() {
			<-p.stop
			return
		}
		n.Add(int64(k))
		if k > 0 {
			if _, err := dst.Write(buf[:k]); err != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

// An idle connection with keep-alive exchanges PINGs (bytes flow both ways while no call
// runs), stays within the server's PING rate limit even when asked for a 1 ms interval
// (raised to 100 ms: the server does not close it), and keeps serving on one connection.
func TestKeepaliveIdle(t *testing.T) {
	_, target := testServer(t, "tcp")
	p := newProxy(t, target)
	cc := dial(t, p.addr, topspin.WithKeepalive(time.Millisecond, 5*time.Second))
	if _, err := cc.InvokeRaw(ctx10(t), "/t.S/Echo", []byte("x"), raw); err != nil {
		t.Fatal(err)
	}
	up, down := p.up.Load(), p.down.Load()
	time.Sleep(3 * time.Second) // 30 intervals of 100 ms: past the server's burst of 20 if unlimited
	if p.up.Load() == up || p.down.Load() == down {
		t.Fatalf("no PING exchanged while idle (up %d→%d, down %d→%d)", up, p.up.Load(), down, p.down.Load())
	}
	// 3 s at about 1 PING (20 bytes) per 100 ms: ~30 PINGs; generous bounds either way.
	if sent := p.up.Load() - up; sent > 40*20 || sent < 5*20 {
		t.Fatalf("%d bytes of PINGs in 3 s: not about one per 100 ms", sent)
	}
	if _, err := cc.InvokeRaw(ctx10(t), "/t.S/Echo", []byte("y"), raw); err != nil {
		t.Fatal(err)
	}
	if n := p.conns.Load(); n != 1 {
		t.Fatalf("%d connections: the server closed the pinging one", n)
	}
}

// When the path goes silent, the client closes the connection within interval + timeout:
// the call in flight fails UNAVAILABLE naming keep-alive, and the next call reconnects.
func TestKeepaliveTimeout(t *testing.T) {
	_, target := testServer(t, "tcp")
	p := newProxy(t, target)
	cc := dial(t, p.addr, topspin.WithKeepalive(100*time.Millisecond, 300*time.Millisecond))
	cs, err := cc.NewStream(ctx10(t), "/t.S/Wait", raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.Send([]byte("x")); err != nil {
		t.Fatal(err)
	}
	p.frozen.Store(true)
	start := time.Now()
	_, err = cs.Recv()
	if topspin.CodeOf(err) != topspin.Unavailable || !strings.Contains(err.Error(), "keepalive") {
		t.Fatalf("want UNAVAILABLE naming keepalive, got %v", err)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("dead connection noticed after %v", d)
	}
	p.frozen.Store(false)
	if _, err := cc.InvokeRaw(ctx10(t), "/t.S/Echo", []byte("again"), raw); err != nil {
		t.Fatalf("after reconnecting: %v", err)
	}
}
