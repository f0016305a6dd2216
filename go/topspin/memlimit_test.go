package topspin_test

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
	"github.com/topspin-rpc/topspin/go/wire"
)

// heapObjects is the bytes of heap objects now, live or not yet swept.
func heapObjects() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// sampleHeap samples heapObjects every millisecond, for at most limit; the function it
// returns stops the sampling and gives the peak seen.
func sampleHeap(limit time.Duration) func() int64 {
	var peak atomic.Int64
	stop := make(chan struct{}) // a signal: closed, never sent on
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for end := time.Now().Add(limit); time.Now().Before(end); {
			peak.Store(max(peak.Load(), heapObjects()))
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return func() int64 {
		close(stop)
		<-sampled
		return peak.Load()
	}
}

// zstd bombs (1 KB each, 32 MiB inflated), 12 at a time for 120 calls, against a 256 MiB
// budget: the decompressed requests are charged (those that find no room are refused), and
// the heap stays within the budget + 192 MiB of what it was (measured +322 to +345 MiB on 2
// loaded CPUs, +240 to +257 MiB, none refused, since one message per CPU inflates at once;
// the margin for slower machines; before: decompression buffers
// grown by half again and again, and GOGC alone pacing the collector, took it past three
// times the budget). A good client is served during the attack, but for the moments the
// budget is spent, when new calls are refused RESOURCE_EXHAUSTED (as designed), and after.
func TestZstdBombsKeepTheHeapNearTheBudget(t *testing.T) {
	if os.Getenv("GOMEMLIMIT") != "" {
		t.Skip("GOMEMLIMIT is set: the process has its own limit")
	}
	const size, budget = 32 * mib, 256 * mib
	h := startHostile(t, topspin.WithMemoryBudget(wire.NewMemoryBudget(budget)))
	bomb, err := wire.Compress(wire.EncodingZstd, make([]byte, size))
	if err != nil || len(bomb) > 4096 {
		t.Fatalf("bomb: %d bytes, %v", len(bomb), err)
	}
	done := h.probeSpent(t)
	runtime.GC()
	base := heapObjects()
	peakHeap := sampleHeap(60 * time.Second)
	cc := dial(t, "tcp://"+h.addr)
	ctx := topspin.WithOutgoingMetadata(context.Background(), topspin.MD(wire.KeyEncoding, wire.EncodingZstd))
	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	for w := 0; w < 12; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, err := cc.InvokeRaw(cctx, "/h.S/Len", bomb, raw)
				cancel()
				switch topspin.CodeOf(err) {
				case topspin.OK:
					ok.Add(1)
				case topspin.ResourceExhausted:
					refused.Add(1)
				default:
					t.Errorf("bomb: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	_ = cc.Close()
	done()
	grew := peakHeap() - base
	t.Logf("%d bombs answered, %d refused; heap %d MiB before, peak +%d MiB (budget %d MiB), Go memory limit %d MiB",
		ok.Load(), refused.Load(), base>>20, grew>>20, budget>>20, debug.SetMemoryLimit(-1)>>20)
	if ok.Load() < 12 {
		t.Errorf("only %d of 120 bombs answered", ok.Load())
	}
	if grew > budget+192*mib {
		t.Errorf("the heap grew by %d MiB with a %d MiB budget", grew>>20, budget>>20)
	}
	h.after(t)
}

// probeSpent is probe, counting as served the calls refused because the memory budget was
// spent (but requiring some served).
func (h *hostile) probeSpent(t *testing.T) func() {
	t.Helper()
	stop := make(chan struct{}) // a signal: closed, never sent on
	var wg sync.WaitGroup
	var served, refused atomic.Int64
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
			switch {
			case err == nil:
				served.Add(1)
			case topspin.CodeOf(err) == topspin.ResourceExhausted && strings.Contains(err.Error(), "budget"):
				refused.Add(1)
			default:
				firstErr.CompareAndSwap(nil, err.Error())
			}
		}
	}()
	return func() {
		t.Helper()
		close(stop)
		wg.Wait()
		t.Logf("well-behaved client: %d served, %d refused while the budget was spent", served.Load(), refused.Load())
		if e := firstErr.Load(); e != nil || served.Load() == 0 {
			t.Fatalf("well-behaved client during the attack: %d served, failed: %v", served.Load(), e)
		}
	}
}
