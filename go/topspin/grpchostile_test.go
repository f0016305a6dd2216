package topspin_test

// Hostile gRPC clients (docs/hardening.md, "The other faces"): each attacks the gRPC face
// of a real server over loopback TCP while a well-behaved native client calls throughout,
// and ends with the gauges back to that client alone.

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
	"github.com/topspin-rpc/topspin/go/wire"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcgzip "google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
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

// h2Attacker opens an HTTP/2 connection to addr (preface, empty SETTINGS) and, once the
// server's connection window is open (200 ms), a stream to /h.S/Sink for each of sizes,
// whose request message announces announced bytes and sends sizes[i] of them.
func h2Attacker(t *testing.T, addr string, announced int, sizes ...int) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	fr := http2.NewFramer(nc, nc)
	if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil || fr.WriteSettings() != nil {
		t.Fatalf("preface: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	for i, n := range sizes {
		id := uint32(2*i + 1)
		msg := append([]byte{0, byte(announced >> 24), byte(announced >> 16), byte(announced >> 8), byte(announced)}, make([]byte, n)...)
		err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: sinkHeaders(), EndHeaders: true})
		for len(msg) > 0 && err == nil {
			k := min(len(msg), 16384)
			err, msg = fr.WriteData(id, false, msg[:k]), msg[k:]
		}
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
			// The server cut the connection while the attack was still being written: the
			// caller's cutWithin sees it at once (a test that times the cut finds it early).
			t.Logf("stream %d: the server cut the connection while it was written: %v", id, err)
			return nc
		}
		if err != nil {
			t.Fatalf("stream %d: %v", id, err)
		}
	}
	return nc
}

// sinkHeaders is the header block of a call to /h.S/Sink.
func sinkHeaders() []byte {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/h.S/Sink"},
		{":authority", "x"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	return hb.Bytes()
}

// cutWithin waits until the server closed nc (its reads end) and returns how long that took.
func cutWithin(t *testing.T, nc net.Conn, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	_ = nc.SetReadDeadline(start.Add(within))
	_, err := io.Copy(io.Discard, nc)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the server did not close the connection within %v", within)
	}
	return time.Since(start)
}

// Four streams each send 60,000 bytes of a message announced at 1 MiB, on one connection,
// with a 1 MiB budget (a connection's share: 128 KiB): their incomplete messages are charged
// to it, and past the share and the largest message the connection is cut, its charge
// given back; a good client is served throughout (before: grpc-go held them uncharged, and
// would have let each stream send its whole message, the connection never cut).
func TestGRPCIncompleteMessagesPastTheShareAreCut(t *testing.T) {
	h := startHostile(t, topspin.WithMemoryBudget(wire.NewMemoryBudget(mib)))
	done := h.probe(t)
	nc := h2Attacker(t, h.addr, mib, 60_000, 60_000, 60_000, 60_000)
	took := cutWithin(t, nc, 5*time.Second)
	t.Logf("cut %v after the last stream's bytes", took.Round(time.Millisecond))
	done()
	h.after(t)
}

// A stream sends 100,000 bytes of a message announced at 1 MiB and goes quiet, its window
// open: the connection is cut at the frame timeout, its charge given back (before: held
// for as long as the client kept the socket open).
func TestGRPCAStalledRequestMessageIsCutAtTheFrameTimeout(t *testing.T) {
	const ft = 300 * time.Millisecond
	h := startHostile(t, topspin.WithFrameTimeout(ft))
	done := h.probe(t)
	nc := h2Attacker(t, h.addr, mib, 100_000)
	h.settle(t, "the message under way charged", func(g topspin.Gauges) bool { return g.ReservedBytes >= 100_000 })
	took := cutWithin(t, nc, 5*time.Second)
	t.Logf("cut %v after the stream went quiet (frame timeout %v)", took.Round(time.Millisecond), ft)
	if took < ft/2 || took > 2*ft+time.Second {
		t.Errorf("cut %v after the stream went quiet, frame timeout %v", took, ft)
	}
	done()
	h.after(t)
}

// A frame that starts and stalls halfway, whatever its type, or half a frame header: the
// connection is cut at the frame timeout, as on the Rust face (before: only request
// messages were timed, and these were held for as long as the client kept the socket open).
// A DATA frame whose header alone came is timed too: the client had the window for all of
// it before it began (RFC 9113 §6.9), so the stall is its own.
func TestGRPCAFrameStalledHalfwayIsCutAtTheFrameTimeout(t *testing.T) {
	const ft = 300 * time.Millisecond
	h := startHostile(t, topspin.WithFrameTimeout(ft))
	done := h.probe(t)
	header := func(length int, typ http2.FrameType, flags http2.Flags, stream uint32) []byte {
		return []byte{byte(length >> 16), byte(length >> 8), byte(length), byte(typ), byte(flags),
			byte(stream >> 24), byte(stream >> 16), byte(stream >> 8), byte(stream)}
	}
	hb := sinkHeaders()
	opened := append(header(len(hb), http2.FrameHeaders, http2.FlagHeadersEndHeaders, 1), hb...)
	for _, c := range []struct {
		name  string
		bytes []byte
	}{
		{"half a frame header", header(100, http2.FramePing, 0, 0)[:4]},
		{"a HEADERS frame, 10 bytes of 100", append(header(100, http2.FrameHeaders, http2.FlagHeadersEndHeaders, 1), hb[:10]...)},
		{"a SETTINGS frame, 6 bytes of 12", append(header(12, http2.FrameSettings, 0, 0), 0, 4, 0, 1, 0, 0)},
		{"an unknown frame, 3 bytes of 1000", append(header(1000, 0xfa, 0, 0), 1, 2, 3)},
		{"a DATA frame's header alone", append(opened, header(100, http2.FrameData, 0, 1)...)},
	} {
		t.Run(c.name, func(t *testing.T) {
			nc := h2Attacker(t, h.addr, 0)
			if _, err := nc.Write(c.bytes); err != nil {
				t.Fatal(err)
			}
			took := cutWithin(t, nc, 3*time.Second)
			t.Logf("cut %v after it stalled (frame timeout %v)", took.Round(time.Millisecond), ft)
			if took < ft/2 || took > ft+time.Second {
				t.Errorf("cut %v after it stalled, frame timeout %v", took, ft)
			}
		})
	}
	done()
	h.after(t)
}

// Request metadata over MaxMetadataSize is refused RESOURCE_EXHAUSTED naming the setting on
// the gRPC face too (before: only the header list was bounded, at no less than 8 KiB, and a
// 200-byte value passed a 64-byte limit); the connection goes on.
func TestGRPCMetadataOverTheLimitIsRefused(t *testing.T) {
	set := wire.DefaultSettings()
	set.MaxMetadataSize = 64
	_, addr := faceServer(t, "tcp", topspin.WithSettings(set))
	cc := grpcClient(t, "tcp", addr)
	ctx := metadata.AppendToOutgoingContext(ctx10(t), "big", strings.Repeat("v", 200))
	_, err := unary(ctx, cc, "/f.S/Echo", []byte("x"))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max_metadata_size") {
		t.Fatalf("metadata over the limit: %v", err)
	}
	if out, err := unary(ctx10(t), cc, "/f.S/Echo", []byte("ok")); err != nil || string(out) != "ok" {
		t.Fatalf("after: %q, %v", out, err)
	}
}

// bombGzip is a gRPC client's gzip compressor that sends its bomb whatever the message
// (grpc-go compressing 60 MiB itself would put them on the heap the test measures).
type bombGzip struct{ bomb []byte }

func (c bombGzip) Do(w io.Writer, _ []byte) error {
	_, err := w.Write(c.bomb)
	return err
}

func (bombGzip) Type() string { return grpcgzip.Name }

// Eight gzip bombs at once (61 KB each, 60 MiB inflated), twice, against a 128 MiB budget:
// each is charged to the budget as it inflates, those that find no room are refused
// RESOURCE_EXHAUSTED, and the heap stays within the budget + 96 MiB of what it was (measured
// +123 to +164 MiB: what the budget counts, plus up to 16 MiB of inflate pieces kept for
// reuse, uncharged, and pieces of refused bombs the collector has not taken yet under the
// soft Go memory limit; the bodies are 61 KB each); a good client is served and
// a gzip call that fits still succeeds (before: grpc-go inflated each bomb, uncharged, into
// its pool's buffers and the bridge copied it whole: the heap grew by 500 MiB and more).
func TestGRPCGzipBombsAreChargedAsTheyInflate(t *testing.T) {
	if os.Getenv("GOMEMLIMIT") != "" {
		t.Skip("GOMEMLIMIT is set: the process has its own limit")
	}
	const size, budget = 60 * mib, 128 * mib
	h := startHostile(t, topspin.WithMemoryBudget(wire.NewMemoryBudget(budget)), topspin.WithMaxMessageSize(64*mib))
	var zb bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&zb, gzip.BestCompression)
	if _, err := zw.Write(make([]byte, size)); err != nil || zw.Close() != nil || zb.Len() > 100_000 {
		t.Fatalf("bomb: %d bytes, %v", zb.Len(), err)
	}
	//lint:ignore SA1019 a per-connection compressor: the test's bomb, not a process-wide one
	cc := grpcClient(t, "tcp", h.addr, grpc.WithCompressor(bombGzip{zb.Bytes()}))
	done := h.probeSpent(t)
	runtime.GC()
	base := heapObjects()
	peakHeap := sampleHeap(30 * time.Second)
	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				out, err := unary(ctx, cc, "/h.S/Len", []byte("x"))
				cancel()
				switch {
				case err == nil && len(out) == 1 && out[0] == size>>20:
					ok.Add(1)
				// Refused while it inflates (wire.NoRoomReason), or before it is read when the
				// budget is already spent: both are the budget's refusal.
				case status.Code(err) == codes.ResourceExhausted && strings.Contains(err.Error(), "memory budget"):
					refused.Add(1)
				default:
					t.Errorf("bomb: %v, %v", out, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	done()
	grew := peakHeap() - base
	t.Logf("%d bombs answered, %d refused; heap %d MiB before, peak +%d MiB (budget %d MiB)",
		ok.Load(), refused.Load(), base>>20, grew>>20, budget>>20)
	if refused.Load() == 0 {
		t.Errorf("no bomb refused: %d answered", ok.Load())
	}
	if grew > budget+96*mib {
		t.Errorf("the heap grew by %d MiB with a %d MiB budget", grew>>20, budget>>20)
	}
	good := grpcClient(t, "tcp", h.addr)
	msg := bytes.Repeat([]byte("good "), 40_000)
	if out, err := unary(ctx10(t), good, "/h.S/Echo", msg, grpc.UseCompressor(grpcgzip.Name)); err != nil || !bytes.Equal(out, msg) {
		t.Fatalf("a good gzip call: %d bytes, %v", len(out), err)
	}
	_, _ = cc.Close(), good.Close()
	h.after(t)
}
