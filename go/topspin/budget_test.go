package topspin_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// holdServer serves /t.S/Hold, whose handler keeps its request until release is closed
// (telling held of each request it took), and /t.S/Echo; on budget b.
func holdServer(t *testing.T, b *wire.MemoryBudget, held chan<- int, release <-chan struct{}, opts ...topspin.Option) string {
	t.Helper()
	s := topspin.NewServer(append([]topspin.Option{topspin.WithMemoryBudget(b)}, opts...)...)
	s.Handle("/t.S/Hold", topspin.UnaryRaw(func(ctx context.Context, _ topspin.Metadata, req []byte) ([]byte, error) {
		held <- len(req)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return []byte("done"), nil
	}), topspin.CodecRaw)
	s.Handle("/t.S/Echo", topspin.UnaryRaw(func(_ context.Context, _ topspin.Metadata, req []byte) ([]byte, error) {
		return req, nil
	}), topspin.CodecRaw)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

// waitUsed waits (at most 10 s) until ok(b.Used()).
func waitUsed(t *testing.T, b *wire.MemoryBudget, what string, ok func(int64) bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !ok(b.Used()); {
		if time.Now().After(end) {
			t.Fatalf("%s: budget used %d of %d", what, b.Used(), b.Limit())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A decompressed request is charged to the server's memory budget while its handler holds
// it; one that finds no room ends RESOURCE_EXHAUSTED (a zstd bomb cannot take more memory
// than the budget), a good client is served meanwhile, and the charge is given back once
// the handlers return. Native face and gRPC face.
func TestDecompressedRequestsChargedToBudget(t *testing.T) {
	const size = 6 << 20
	bomb, err := wire.Compress(wire.EncodingZstd, make([]byte, size))
	if err != nil || len(bomb) > 4096 {
		t.Fatalf("bomb: %d bytes, %v", len(bomb), err)
	}
	t.Run("native", func(t *testing.T) {
		chargedBombs(t, size, func(t *testing.T, addr string) func() error {
			cc := dial(t, "tcp://"+addr)
			ctx := topspin.WithOutgoingMetadata(ctx10(t), topspin.MD(wire.KeyEncoding, wire.EncodingZstd))
			return func() error {
				_, err := cc.InvokeRaw(ctx, "/t.S/Hold", bomb, raw)
				return err
			}
		})
	})
	t.Run("grpc", func(t *testing.T) {
		chargedBombs(t, size, func(t *testing.T, addr string) func() error {
			cc := grpcClient(t, "tcp", addr)
			ctx, msg := ctx10(t), make([]byte, size)
			return func() error {
				_, err := unary(ctx, cc, "/t.S/Hold", msg, grpc.UseCompressor("zstd"))
				return fromGRPC(err)
			}
		})
	})
}

// fromGRPC is a grpc-go error as a *topspin.Status (nil stays nil).
func fromGRPC(err error) error {
	if err == nil {
		return nil
	}
	st, _ := status.FromError(err)
	return &topspin.Status{Code: topspin.Code(st.Code()), Message: st.Message()}
}

// chargedBombs runs TestDecompressedRequestsChargedToBudget with the bombs newCall sends.
func chargedBombs(t *testing.T, size int, newCall func(t *testing.T, addr string) func() error) {
	b := wire.NewMemoryBudget(32 << 20)
	held, release := make(chan int, 16), make(chan struct{})
	addr := holdServer(t, b, held, release, topspin.WithMaxMessageSize(16<<20))
	bomb := newCall(t, addr)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	call := func() {
		defer wg.Done()
		errs <- bomb()
	}
	defer func() { // nothing left waiting on a failure
		select {
		case <-release:
		default:
			close(release)
		}
		wg.Wait()
	}()
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go call()
		select {
		case n := <-held:
			if n != size {
				t.Fatalf("handler got %d bytes", n)
			}
		case err := <-errs:
			t.Fatalf("call %d: %v", i, err)
		}
	}
	waitUsed(t, b, "two 6 MiB requests held", func(u int64) bool { return u >= 2*int64(size) })
	// More bombs than the budget holds: those that find no room are refused.
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go call()
	}
	refused := 0
	for end := time.Now().Add(10 * time.Second); refused+len(held) < 6; {
		select {
		case err := <-errs:
			// Refused while decompressing (wire.NoRoomReason), or before, when a call finds
			// the budget already spent: both are the budget's refusal.
			if st := topspin.StatusOf(err); st == nil || st.Code != topspin.ResourceExhausted || !strings.Contains(st.Message, "memory budget") {
				t.Fatalf("a bomb past the budget: %v", err)
			}
			refused++
		case <-time.After(5 * time.Millisecond):
			if time.Now().After(end) {
				t.Fatalf("%d refused, %d held", refused, len(held))
			}
		}
	}
	if refused == 0 || b.Used() > b.Limit() {
		t.Fatalf("%d refused, budget used %d of %d", refused, b.Used(), b.Limit())
	}
	// A good client is served meanwhile.
	good := dial(t, "tcp://"+addr)
	if out, err := good.InvokeRaw(ctx10(t), "/t.S/Echo", []byte("hello"), raw); err != nil || string(out) != "hello" {
		t.Fatalf("good client: %q, %v", out, err)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && topspin.CodeOf(err) != topspin.ResourceExhausted {
			t.Fatalf("held call: %v", err)
		}
	}
	waitUsed(t, b, "after the handlers returned", func(u int64) bool { return u == 0 })
}

// A peer that starts a split message and goes quiet is cut after the frame timeout with
// ERROR TIMEOUT, and what its message held goes back to the budget; a good client is
// served meanwhile.
func TestQuietSplitMessageCut(t *testing.T) {
	b := wire.NewMemoryBudget(64 << 20)
	held, release := make(chan int, 1), make(chan struct{})
	defer close(release)
	addr := holdServer(t, b, held, release, topspin.WithFrameTimeout(500*time.Millisecond))
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	in := append(append([]byte{}, wire.Preface[:]...), wire.Append(nil, &wire.Frame{Type: wire.TypeSettings})...)
	in = wire.Append(in, &wire.Frame{Type: wire.TypeCall, Flags: wire.FlagNamed, CallID: 1, MethodName: "/t.S/Echo", Codec: topspin.CodecRaw, Metadata: wire.Metadata{}})
	in = wire.Append(in, &wire.Frame{Type: wire.TypeMessage, Flags: wire.FlagSplit, CallID: 1, TotalLen: 8 << 20, Chunk: make([]byte, 64<<10)})
	if _, err := nc.Write(in); err != nil {
		t.Fatal(err)
	}
	waitUsed(t, b, "the split message's first chunk", func(u int64) bool { return u > 0 })
	start := time.Now()
	good := dial(t, "tcp://"+addr)
	if out, err := good.InvokeRaw(ctx10(t), "/t.S/Echo", []byte("hello"), raw); err != nil || string(out) != "hello" {
		t.Fatalf("good client: %q, %v", out, err)
	}
	// The server says ERROR TIMEOUT and closes (read everything until then, bounded).
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []byte
	buf := make([]byte, 4096)
	for len(got) < 1<<20 {
		n, err := nc.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
	}
	if i := len(wire.Preface); len(got) < i {
		t.Fatalf("got %d bytes", len(got))
	}
	rest, timedOut := got[len(wire.Preface):], false
	for len(rest) > 0 {
		f, n, err := wire.Decode(rest, 16<<20)
		if err != nil || n == 0 {
			break
		}
		timedOut = timedOut || f.Type == wire.TypeError && wire.ErrCode(f.Code) == wire.Timeout
		rest = rest[n:]
	}
	if !timedOut {
		t.Fatalf("no ERROR TIMEOUT after %v", time.Since(start))
	}
	waitUsed(t, b, "after the cut", func(u int64) bool { return u == 0 })
}

// (attack 3) One greedy connection uploading split messages that announce far more than
// the budget holds at most its share of it (1/8) plus the one message that goes on: the
// budget is never spent, the well-behaved client is served throughout, and everything is
// given back once the attacker leaves. Without the share it spends the whole budget and
// the good client's calls are refused.
func TestOneGreedyConnectionHoldsAtMostItsShare(t *testing.T) {
	const budget, total, chunk, calls, window = 32 << 20, 16 << 20, 32 << 10, 20, 64 << 10
	set := wire.DefaultSettings()
	set.InitialCallWindow = window
	h := startHostile(t, topspin.WithMemoryBudget(wire.NewMemoryBudget(budget)), topspin.WithSettings(set))
	done := h.probe(t)
	var b []byte
	credit, sent := map[uint32]int64{}, map[uint32]int{}
	for i := uint32(0); i < calls; i++ {
		id := 2*i + 1
		b = callFrame(b, id, "/h.S/Sink")
		b = wire.Append(b, &wire.Frame{Type: wire.TypeMessage, Flags: wire.FlagSplit, CallID: id, TotalLen: total, Chunk: make([]byte, chunk)})
		credit[id], sent[id] = window-(wire.HeaderLen+4+chunk), chunk
	}
	nc := h.attacker(t, b)
	var in []byte
	buf := make([]byte, 64<<10)
	preface := false
	quiet := 0
	for round := 0; round < 5000 && quiet < 15; round++ {
		// Take the server's CREDIT frames.
		_ = nc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		n, err := nc.Read(buf)
		in = append(in, buf[:n]...)
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("attacker read: %v", err)
		}
		if !preface && len(in) >= len(wire.Preface) {
			in, preface = in[len(wire.Preface):], true
		}
		for preface {
			f, m, err := wire.Decode(in, 16<<20)
			if err != nil {
				t.Fatal(err)
			}
			if m == 0 {
				break
			}
			if f.Type == wire.TypeCredit {
				credit[f.CallID] += int64(f.Increment)
			}
			in = in[m:]
		}
		// Send a chunk on every call that has credit.
		var out []byte
		for id, cr := range credit {
			if cr > 0 && sent[id] < total {
				m := min(chunk, total-sent[id])
				out = wire.Append(out, &wire.Frame{Type: wire.TypeContinuation, CallID: id, Chunk: make([]byte, m)})
				credit[id] -= int64(wire.HeaderLen + m)
				sent[id] += m
			}
		}
		if len(out) == 0 {
			quiet++
			continue
		}
		quiet = 0
		send(t, nc, out)
	}
	g := h.s.Gauges()
	t.Logf("one connection, %d splits of %d MiB announced: reserved %d of %d", calls, total>>20, g.ReservedBytes, g.MemoryBudget)
	share := int64(budget / wire.ShareOfBudget)
	if most := share + total + calls*2*(window+chunk); g.ReservedBytes > most || g.ReservedBytes >= budget {
		t.Fatalf("one connection holds %d bytes (share %d, at most %d, budget %d)", g.ReservedBytes, share, most, budget)
	}
	h.served(t, "during")
	done()
	_ = nc.Close()
	h.after(t)
}
