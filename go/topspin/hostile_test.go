package topspin_test

// Hostile peers (docs/hardening.md): each test attacks a real server over loopback TCP at
// the frame level (raw bytes made with the wire package's encoder), keeps a well-behaved
// client calling on another connection throughout, and ends with the server's gauges back
// to that client alone.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const mib = 1 << 20

// bigAnswer is the answer of /h.S/Big, shared by every call (no allocation per call).
var bigAnswer = bytes.Repeat([]byte{'b'}, mib)

// bigValue is the answer of /h.S/Value, shared; each call's encoding of it is 1 MiB of its own
// (as kvstore's Get of a 1 MiB value).
var bigValue = strings.Repeat("v", mib)

type hostile struct {
	s       *topspin.Server
	addr    string // host:port
	good    *topspin.ClientConn
	bigRuns atomic.Int64 // /h.S/Big handlers started
	valRuns atomic.Int64 // /h.S/Value handlers started
}

// startHostile serves /h.S/Echo (unary), /h.S/Big (unary, a 1 MiB answer), /h.S/Value (typed
// unary, a 1 MiB string encoded per call), /h.S/Len (unary, its request's MiB in one byte) and
// /h.S/Sink (reads until the client half-closes) on loopback TCP, and dials the well-behaved
// client.
func startHostile(t *testing.T, opts ...topspin.Option) *hostile {
	t.Helper()
	h := &hostile{s: topspin.NewServer(opts...)}
	h.s.Handle("/h.S/Echo", topspin.UnaryRaw(func(_ context.Context, _ topspin.Metadata, req []byte) ([]byte, error) {
		return req, nil
	}), topspin.CodecRaw)
	h.s.Handle("/h.S/Big", topspin.UnaryRaw(func(context.Context, topspin.Metadata, []byte) ([]byte, error) {
		h.bigRuns.Add(1)
		return bigAnswer, nil
	}), topspin.CodecRaw)
	h.s.Handle("/h.S/Value", topspin.Unary(func(context.Context, *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		h.valRuns.Add(1)
		return wrapperspb.String(bigValue), nil
	}), topspin.CodecRaw)
	h.s.Handle("/h.S/Len", topspin.UnaryRaw(func(_ context.Context, _ topspin.Metadata, req []byte) ([]byte, error) {
		return []byte{byte(len(req) >> 20)}, nil
	}), topspin.CodecRaw)
	h.s.Handle("/h.S/Sink", func(ss *topspin.ServerStream) error {
		for {
			if _, err := ss.Recv(); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
		}
	}, topspin.CodecRaw)
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = h.s.Serve(l) }()
	t.Cleanup(h.s.Stop)
	h.addr = l.Addr().String()
	h.good = dial(t, "tcp://"+h.addr)
	h.served(t, "before")
	return h
}

// served checks that the well-behaved client gets an answer.
func (h *hostile) served(t *testing.T, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := h.good.InvokeRaw(ctx, "/h.S/Echo", []byte("ping"), raw)
	if err != nil || string(out) != "ping" {
		t.Fatalf("well-behaved client %s the attack: %q, %v", when, out, err)
	}
}

// probe calls on the well-behaved client every 20 ms until the returned function is
// called, which fails the test if a call failed.
func (h *hostile) probe(t *testing.T) func() {
	t.Helper()
	stop := make(chan struct{}) // a signal: closed, never sent on, so it holds nothing
	var wg sync.WaitGroup
	var calls, failed atomic.Int64
	var firstErr atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 3000; i++ { // 60 s at most
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := h.good.InvokeRaw(ctx, "/h.S/Echo", []byte("p"), raw)
			cancel()
			calls.Add(1)
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			}
		}
	}()
	return func() {
		t.Helper()
		close(stop)
		wg.Wait()
		if failed.Load() > 0 {
			t.Fatalf("%d of %d calls of the well-behaved client failed during the attack: %v", failed.Load(), calls.Load(), firstErr.Load())
		}
	}
}

// settle waits (up to 10 s) for the gauges to satisfy cond.
func (h *hostile) settle(t *testing.T, what string, cond func(topspin.Gauges) bool) topspin.Gauges {
	t.Helper()
	var g topspin.Gauges
	for i := 0; i < 500; i++ {
		if g = h.s.Gauges(); cond(g) {
			return g
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not within 10 s: %+v", what, g)
	return g
}

// after checks that the gauges come back to the well-behaved client alone.
func (h *hostile) after(t *testing.T) {
	t.Helper()
	h.settle(t, "gauges back to the well-behaved client alone", func(g topspin.Gauges) bool {
		return g.Connections == 1 && g.OpenCalls == 0 && g.UnsentBytes == 0 && g.ReservedBytes == 0
	})
	h.served(t, "after")
}

// attacker connects and sends the preface, SETTINGS (defaults) and extra.
func (h *hostile) attacker(t *testing.T, extra []byte) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	send(t, nc, append(hello(), extra...))
	return nc
}

func hello() []byte {
	return wire.Append(append([]byte{}, wire.Preface[:]...), &wire.Frame{Type: wire.TypeSettings})
}

func send(t *testing.T, nc net.Conn, b []byte) {
	t.Helper()
	_ = nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Write(b); err != nil {
		t.Fatalf("attacker could not write: %v", err)
	}
}

// callFrame is a CALL of method (named, not bound to an id).
func callFrame(b []byte, id uint32, method string) []byte {
	return wire.Append(b, &wire.Frame{Type: wire.TypeCall, Flags: wire.FlagNamed, CallID: id,
		MethodName: method, Codec: topspin.CodecRaw, Metadata: topspin.Metadata{}})
}

// closedByServer reads until the server closes the connection (at most within) and
// returns the frames it sent after its preface.
func closedByServer(t *testing.T, nc net.Conn, within time.Duration) []wire.Frame {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(within))
	all, err := io.ReadAll(nc)
	if err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("the server did not close the connection within %v: %v", within, err)
	}
	if len(all) < 8 || !bytes.Equal(all[:8], wire.Preface[:]) {
		t.Fatalf("no preface from the server: %x", all)
	}
	var out []wire.Frame
	for rest := all[8:]; len(rest) > 0; {
		f, n, perr := wire.Decode(rest, 1<<24)
		if perr != nil || n == 0 {
			t.Fatalf("bad frames from the server: %x", all)
		}
		out, rest = append(out, f), rest[n:]
	}
	return out
}

// lastIs checks that the last frame is ERROR code (or GOAWAY, for NoError).
func lastIs(t *testing.T, frames []wire.Frame, typ uint8, code wire.ErrCode, reason string) {
	t.Helper()
	if len(frames) == 0 {
		t.Fatalf("no frame before the close; want type 0x%02x %v", typ, code)
	}
	f := frames[len(frames)-1]
	if f.Type != typ || wire.ErrCode(f.Code) != code || !strings.Contains(f.Message, reason) {
		t.Fatalf("last frame %+v; want type 0x%02x %v %q", f, typ, code, reason)
	}
}

// heapInUse is the heap in use after a collection.
func heapInUse() (inuse, sys uint64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse, m.HeapSys
}

// (a) 50 connections each announce a 16 MiB frame (the largest allowed) and send 2 bytes
// of it: whole frames are reserved only within the memory budget (20 MiB: one frame),
// and the heap grows by what is reserved and a few MiB, not 50 × 16 MiB.
func TestAnnouncedFramesStayWithinTheMemoryBudget(t *testing.T) {
	const n, budget = 50, 20 * mib
	maxFrame := wire.DefaultSettings().MaxFrameSize
	h := startHostile(t, topspin.WithMemoryBudget(wire.NewMemoryBudget(budget)))
	done := h.probe(t)
	before, sysBefore := heapInUse()
	var socks []net.Conn
	for i := 0; i < n; i++ {
		b := callFrame(nil, 1, "/h.S/Sink")
		b = append(wire.AppendHeader(b, maxFrame, wire.TypeMessage, 0, 1), byte(i))
		socks = append(socks, h.attacker(t, b))
	}
	// A second byte each, in a read of its own.
	time.Sleep(100 * time.Millisecond)
	for _, nc := range socks {
		send(t, nc, []byte{1})
	}
	g := h.settle(t, "every attacker's call open", func(g topspin.Gauges) bool {
		return g.Connections == n+1 && g.OpenCalls >= n
	})
	time.Sleep(300 * time.Millisecond)
	g2 := h.s.Gauges()
	after, sysAfter := heapInUse()
	grown := int64(after) - int64(before)
	t.Logf("%d announced frames of %d bytes: reserved %d of %d; heap in use %.1f → %.1f MiB (+%.1f), heap sys %.1f → %.1f MiB",
		n, maxFrame, g2.ReservedBytes, g2.MemoryBudget, float64(before)/mib, float64(after)/mib, float64(grown)/mib,
		float64(sysBefore)/mib, float64(sysAfter)/mib)
	for _, g := range []topspin.Gauges{g, g2} {
		if g.ReservedBytes > budget || g.MemoryBudget != budget {
			t.Fatalf("over the budget: %+v", g)
		}
	}
	if grown > g2.ReservedBytes+16*mib {
		t.Fatalf("heap grew by %d bytes for %d announced frames (%d reserved)", grown, n, g2.ReservedBytes)
	}
	h.served(t, "during")
	done()
	for _, nc := range socks {
		_ = nc.Close()
	}
	h.after(t)
}

// (b) 1000 calls on 4 connections each start a split message announcing 63 MiB and send
// 1 byte of it: nothing is reserved for what was only announced.
func TestAnnouncedSplitMessagesStayWithinTheMemoryBudget(t *testing.T) {
	const conns, calls, budget = 4, 250, 64 * mib
	h := startHostile(t, topspin.WithMemoryBudget(wire.NewMemoryBudget(budget)))
	done := h.probe(t)
	before, _ := heapInUse()
	var socks []net.Conn
	for range conns {
		var b []byte
		for i := uint32(0); i < calls; i++ {
			id := 2*i + 1
			b = callFrame(b, id, "/h.S/Sink")
			b = wire.Append(b, &wire.Frame{Type: wire.TypeMessage, Flags: wire.FlagSplit, CallID: id,
				TotalLen: 63 * mib, Chunk: []byte{7}})
		}
		socks = append(socks, h.attacker(t, b))
	}
	g := h.settle(t, "every call open", func(g topspin.Gauges) bool { return g.OpenCalls >= conns*calls })
	time.Sleep(300 * time.Millisecond)
	after, _ := heapInUse()
	grown := int64(after) - int64(before)
	t.Logf("%d split messages of 63 MiB announced: reserved %d; heap in use %.1f → %.1f MiB",
		conns*calls, g.ReservedBytes, float64(before)/mib, float64(after)/mib)
	if g.ReservedBytes > budget {
		t.Fatalf("over the budget: %+v", g)
	}
	if grown > 64*mib {
		t.Fatalf("heap grew by %d bytes for split messages that never came", grown)
	}
	h.served(t, "during")
	done()
	for _, nc := range socks {
		_ = nc.Close()
	}
	h.after(t)
}

// (b, spent) Split messages that really arrive spend the budget: then new calls end
// RESOURCE_EXHAUSTED naming it, reserved bytes stay within the budget and one chunk per
// connection, and everything is given back once the attackers leave.
func TestASpentMemoryBudgetRefusesNewCalls(t *testing.T) {
	const conns, calls, budget, chunk = 2, 200, 4 * mib, 16 << 10
	h := startHostile(t, topspin.WithMemoryBudget(wire.NewMemoryBudget(budget)))
	var socks []net.Conn
	for range conns {
		var b []byte
		for i := uint32(0); i < calls; i++ {
			id := 2*i + 1
			b = callFrame(b, id, "/h.S/Sink")
			b = wire.Append(b, &wire.Frame{Type: wire.TypeMessage, Flags: wire.FlagSplit, CallID: id,
				TotalLen: 63 * mib, Chunk: make([]byte, chunk)})
		}
		socks = append(socks, h.attacker(t, b))
	}
	g := h.settle(t, "budget spent", func(g topspin.Gauges) bool { return g.ReservedBytes >= budget })
	if g.ReservedBytes > budget+conns*2*chunk {
		t.Fatalf("reserved past the budget and one chunk per connection: %+v", g)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := h.good.InvokeRaw(ctx, "/h.S/Echo", []byte("x"), raw)
	if topspin.CodeOf(err) != topspin.ResourceExhausted || !strings.Contains(err.Error(), "memory budget") {
		t.Fatalf("a new call while the budget is spent: %v", err)
	}
	t.Logf("budget spent: %+v; a new call: %v", g, err)
	for _, nc := range socks {
		_ = nc.Close()
	}
	h.after(t)
}

// (c) Half a frame, then nothing: closed with TIMEOUT after the frame timeout.
func TestHalfAFrameIsClosedAfterTheFrameTimeout(t *testing.T) {
	h := startHostile(t, topspin.WithFrameTimeout(300*time.Millisecond))
	done := h.probe(t)
	b := callFrame(nil, 1, "/h.S/Sink")
	b = append(wire.AppendHeader(b, 100, wire.TypeMessage, 0, 1), make([]byte, 10)...)
	nc := h.attacker(t, b)
	lastIs(t, closedByServer(t, nc, 10*time.Second), wire.TypeError, wire.Timeout, "frame timeout")
	done()
	h.after(t)
}

// (d) Handshakes that never complete (nothing, half a preface, a preface without
// SETTINGS) are closed with TIMEOUT after the handshake timeout.
func TestHandshakesThatNeverCompleteAreClosed(t *testing.T) {
	h := startHostile(t, topspin.WithHandshakeTimeout(300*time.Millisecond))
	done := h.probe(t)
	var socks []net.Conn
	for i := 0; i < 12; i++ {
		nc, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nc.Close() })
		switch i % 3 {
		case 1:
			send(t, nc, wire.Preface[:4])
		case 2:
			send(t, nc, wire.Preface[:])
		}
		socks = append(socks, nc)
	}
	h.served(t, "during")
	for _, nc := range socks {
		lastIs(t, closedByServer(t, nc, 10*time.Second), wire.TypeError, wire.Timeout, "handshake timeout")
	}
	done()
	h.after(t)
}

// (e) A connection without a call for the idle timeout gets GOAWAY NO_ERROR and is
// closed; one with a call open is not; an idle Go client reconnects for its next call.
func TestIdleConnectionsGoAway(t *testing.T) {
	h := startHostile(t, topspin.WithIdleTimeout(300*time.Millisecond))
	busy := h.attacker(t, callFrame(nil, 1, "/h.S/Sink")) // a call open, never finished
	idle := h.attacker(t, nil)
	lastIs(t, closedByServer(t, idle, 10*time.Second), wire.TypeGoAway, wire.NoError, "idle timeout")
	if g := h.s.Gauges(); g.OpenCalls != 1 {
		t.Fatalf("the connection with an open call went too: %+v", g)
	}
	_ = busy.Close()
	// The well-behaved client's connection went idle too, a moment before: a call racing
	// with that GOAWAY is refused unprocessed and sent again, transparently, on a new one.
	h.served(t, "after its connection went idle") // reconnects
	h.after(t)
}

// (e2) Regression: a peer that only sends PINGs still goes idle: the idle time counts from
// the last call, not the last read (grpc-go's MaxConnectionIdle counts the same way), so a
// PING now and then cannot hold a connection, and a max_connections slot, for ever.
func TestAConnectionThatOnlyPingsGoesIdle(t *testing.T) {
	h := startHostile(t, topspin.WithIdleTimeout(500*time.Millisecond))
	chatty := h.attacker(t, nil)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // a PING every 150 ms, at most 100
		for i := range 100 {
			ping := wire.Append(nil, &wire.Frame{Type: wire.TypePing, Data: [8]byte{byte(i)}})
			if _, err := chatty.Write(ping); err != nil {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(150 * time.Millisecond):
			}
		}
	}()
	t0 := time.Now()
	lastIs(t, closedByServer(t, chatty, 10*time.Second), wire.TypeGoAway, wire.NoError, "idle timeout")
	if took := time.Since(t0); took > 5*time.Second {
		t.Fatalf("closed only after %v (idle timeout 500 ms)", took)
	}
	h.served(t, "after the pinging connection went idle") // its own went idle too: reconnects
	h.after(t)
}

// (f) Connections over max_connections are told why and closed; the open ones go on.
func TestConnectionsOverTheLimitAreRefusedWithAReason(t *testing.T) {
	h := startHostile(t, topspin.WithMaxConnections(3))
	a, b := h.attacker(t, nil), h.attacker(t, nil)
	h.settle(t, "three connections", func(g topspin.Gauges) bool { return g.Connections == 3 })
	over := h.attacker(t, callFrame(nil, 1, "/h.S/Echo"))
	lastIs(t, closedByServer(t, over, 10*time.Second), wire.TypeError, wire.InternalError, "max_connections (3) reached")
	cc := dial(t, "tcp://"+h.addr) // the handshake completes, the first call fails
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := cc.InvokeRaw(ctx, "/h.S/Echo", []byte("x"), raw)
	if topspin.CodeOf(err) != topspin.Unavailable || !strings.Contains(err.Error(), "max_connections (3) reached") {
		t.Fatalf("a call over max_connections: %v", err)
	}
	h.served(t, "during")
	_, _ = a.Close(), b.Close()
	h.after(t)
}

// (g) A client pipelines unary calls for 1 MiB answers and never reads: the server's
// unsent bytes stay under the send buffer and one answer, it stops reading the
// connection, and its later calls wait without a handler running.
func TestAClientThatNeverReadsIsHeldToTheSendBuffer(t *testing.T) {
	const batches, perBatch = 10, 100
	h := startHostile(t)
	done := h.probe(t)
	nc := h.attacker(t, nil)
	go func() { // 10 batches of 100 calls, 50 ms apart; the server stops reading
		id := uint32(1)
		for range batches {
			var b []byte
			for range perBatch {
				b = callFrame(b, id, "/h.S/Big")
				b = wire.Append(b, &wire.Frame{Type: wire.TypeMessage, Flags: wire.FlagEndStream, CallID: id, Chunk: []byte("x")})
				id += 2
			}
			_ = nc.SetWriteDeadline(time.Now().Add(2 * time.Second))
			if _, err := nc.Write(b); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	maxSend := topspin.DefaultMaxSendBuffer
	bound := maxSend + mib + 64<<10
	h.settle(t, "unsent bytes piling up", func(g topspin.Gauges) bool { return g.UnsentBytes > maxSend })
	time.Sleep(time.Second) // every batch sent: from now on nothing may move
	peak, first := 0, -1
	var g topspin.Gauges
	for i := 0; i < 100; i++ {
		g = h.s.Gauges()
		if g.UnsentBytes > bound {
			t.Fatalf("unsent over the send buffer and one message: %+v", g)
		}
		if first < 0 {
			first = g.UnsentBytes
		}
		peak = max(peak, g.UnsentBytes)
		time.Sleep(20 * time.Millisecond)
	}
	runs := h.bigRuns.Load()
	t.Logf("never-reading client: unsent %d (peak %d, bound %d), open calls %d, handlers run %d of %d calls sent",
		g.UnsentBytes, peak, bound, g.OpenCalls, runs, batches*perBatch)
	if peak > first+64<<10 { // the well-behaved client's few bytes aside
		t.Fatalf("unsent bytes grew from %d to %d although the client reads nothing", first, peak)
	}
	if g.OpenCalls > 3*perBatch || runs > 3*perBatch {
		t.Fatalf("the server kept taking calls: %d open, %d handlers run", g.OpenCalls, runs)
	}
	h.served(t, "during")
	done()
	_ = nc.Close()
	h.after(t)
}

// Server keep-alive: a peer that never answers PINGs is closed with TIMEOUT after the
// keep-alive timeout; the well-behaved client (its engine answers PINGs) keeps its
// connection.
func TestAPeerThatNeverAnswersPingsIsClosed(t *testing.T) {
	h := startHostile(t, topspin.WithKeepalive(100*time.Millisecond, 300*time.Millisecond))
	done := h.probe(t)
	nc := h.attacker(t, nil)
	frames := closedByServer(t, nc, 10*time.Second)
	lastIs(t, frames, wire.TypeError, wire.Timeout, "keep-alive")
	if frames[0].Type != wire.TypeSettings || frames[1].Type != wire.TypePing {
		t.Fatalf("want SETTINGS, PING, … ERROR; got %+v", frames)
	}
	done()
	h.after(t)
}

// Write timeout: a client that sends calls for 1 MiB answers and never reads fills the
// socket; once it has taken nothing for the write timeout the server closes the connection
// and ends its calls, while the well-behaved client is served throughout. (Without the
// bound, WithWriteTimeout(0), the connection and its calls stay for ever.)
func TestAClientThatNeverReadsIsClosedAfterTheWriteTimeout(t *testing.T) {
	const wt = 300 * time.Millisecond
	h := startHostile(t, topspin.WithWriteTimeout(wt))
	done := h.probe(t)
	var b []byte
	for id := uint32(1); id < 2*40; id += 2 { // 40 MiB of answers: more than loopback buffers
		b = callFrame(b, id, "/h.S/Big")
		b = wire.Append(b, &wire.Frame{Type: wire.TypeMessage, Flags: wire.FlagEndStream, CallID: id, Chunk: []byte("x")})
	}
	b = callFrame(b, 81, "/h.S/Sink") // a call left open: its handler waits for requests
	nc := h.attacker(t, b)
	g := h.settle(t, "the socket full", func(g topspin.Gauges) bool { return g.UnsentBytes > 0 && g.Connections == 2 })
	start := time.Now()
	h.settle(t, "the never-reading connection closed", func(g topspin.Gauges) bool { return g.Connections == 1 })
	took := time.Since(start)
	t.Logf("never-reading client: %+v when full; closed %v later (write timeout %v)", g, took.Round(time.Millisecond), wt)
	if took > 4*wt+time.Second {
		t.Errorf("closed %v after the socket filled, write timeout %v", took, wt)
	}
	done()
	_ = nc.Close()
	h.after(t)
}
