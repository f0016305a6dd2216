package topspin

import (
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
)

// The Go memory limit a serving server sets (WithGoMemoryLimit). The memory budget bounds
// the bytes held for messages being received, but Go's collector lets the heap grow to
// twice what was live at its last cycle (GOGC=100): a burst of decompressed requests that
// fills a 1 GiB budget can take 2.4 GB of RSS before the garbage of the requests before is
// collected. So while a server serves, and the process has no limit of its own (GOMEMLIMIT
// unset, and none set with debug.SetMemoryLimit), this package keeps a soft limit of
//
//	the budgets' limits + 2 × (the live heap the budgets do not account for)
//
// re-read every 100 ms: the heap the application keeps for itself still gets GOGC's room to
// grow, the budget none beyond its limit. The application's heap is followed at once when
// it shrinks and slowly when it grows (1/64 of the step per 100 ms): what a collection
// finds live during a burst of requests includes what they allocated while it ran, which is
// not the application's. It goes (back to no limit) when the last server
// stops, and is left alone for good once anyone else sets one.

// memLimitEvery is how often the limit follows the live heap.
const memLimitEvery = 100 * time.Millisecond

var memLimit struct {
	mu      sync.Mutex
	budgets map[*wire.MemoryBudget]int // the budgets of the servers serving, with their number
	set     int64                      // the limit this package set last (0: none)
	app     int64                      // the application's live heap, as followed (-1: not yet)
	running bool                       // the governor runs
}

// WithGoMemoryLimit lets a server keep a soft Go memory limit tied to its memory budget
// (default on; see memlimit.go): while it serves, and the process has no limit of its own,
// the collector works to keep the heap within the budget and twice the rest of the live
// heap (large decompressions and unmarshallings wait for it past that, internal/heapgate). Off (false), GOGC alone paces the collector and the process can hold about
// twice the budget at peak. A program that sets GOMEMLIMIT, or calls debug.SetMemoryLimit,
// keeps its own limit either way.
func WithGoMemoryLimit(on bool) Option { return func(o *options) { o.memLimitOff = !on } }

// holdMemoryLimit counts the server's budget in the limit while it serves; the returned
// function takes it out.
func (s *Server) holdMemoryLimit() func() {
	if s.opts.memLimitOff || os.Getenv("GOMEMLIMIT") != "" {
		return func() {}
	}
	b := s.opts.memoryBudget()
	memLimit.mu.Lock()
	defer memLimit.mu.Unlock()
	if cur := debug.SetMemoryLimit(-1); cur != math.MaxInt64 && cur != memLimit.set {
		return func() {} // the program's own limit
	}
	if memLimit.budgets == nil {
		memLimit.budgets = map[*wire.MemoryBudget]int{}
	}
	memLimit.budgets[b]++
	if !memLimit.running {
		memLimit.running, memLimit.app = true, -1
		go governMemoryLimit()
	}
	return sync.OnceFunc(func() {
		memLimit.mu.Lock()
		defer memLimit.mu.Unlock()
		if memLimit.budgets[b]--; memLimit.budgets[b] <= 0 {
			delete(memLimit.budgets, b)
		}
	})
}

// governMemoryLimit keeps the limit while a server serves (one goroutine per process).
func governMemoryLimit() {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	t := time.NewTicker(memLimitEvery)
	defer t.Stop()
	for {
		memLimit.mu.Lock()
		if !setMemoryLimitLocked(sample) {
			memLimit.running = false
			memLimit.mu.Unlock()
			return
		}
		memLimit.mu.Unlock()
		<-t.C
	}
}

// setMemoryLimitLocked sets the limit for the budgets now (under memLimit.mu); false once
// there is none left (the limit is taken back) or someone else set a limit.
func setMemoryLimitLocked(sample []metrics.Sample) bool {
	if cur := debug.SetMemoryLimit(-1); memLimit.set != 0 && cur != memLimit.set {
		memLimit.set = 0 // someone else's now
		clear(memLimit.budgets)
		return false
	}
	if len(memLimit.budgets) == 0 {
		if memLimit.set != 0 {
			debug.SetMemoryLimit(math.MaxInt64)
			memLimit.set = 0
		}
		return false
	}
	var limit, used int64
	for b := range memLimit.budgets {
		limit += b.Limit()
		used += b.Used()
	}
	metrics.Read(sample)
	var live int64
	if sample[0].Value.Kind() == metrics.KindUint64 {
		live = int64(min(sample[0].Value.Uint64(), math.MaxInt64/4))
	}
	app := max(live-used, 0)
	switch {
	case memLimit.app < 0 || app < memLimit.app:
		memLimit.app = app
	default:
		memLimit.app += (app - memLimit.app) / 64
	}
	want := limit + 2*memLimit.app
	if want != memLimit.set {
		debug.SetMemoryLimit(want)
		memLimit.set = want
	}
	return true
}
