// Package heapgate makes large allocations of received messages yield to the garbage
// collector under a Go memory limit (the wire package's decompression, the topspin
// package's unmarshalling of large requests).
package heapgate

import (
	"math"
	"runtime"
	"runtime/metrics"
	"sync"
)

// A burst of large received messages (decompressed, then unmarshalled) allocates faster than
// a concurrent collection reclaims the messages before them (what is allocated while it
// marks counts as live), so the heap overshoots a soft limit (GOMEMLIMIT, or the one a
// topspin server keeps: topspin.WithGoMemoryLimit) by what the burst allocated meanwhile.
// So before such an allocation (Wait) the heap is looked at: past the limit, with
// more than heapGateSlack allocated since the last collection it waited for, it waits for a
// collection (one at a time, the others wait for that one, and allocate nothing meanwhile).
// Under the limit, or without one, it costs a read of two metrics.

// heapGateSlack is the garbage below which a collection is not worth waiting for.
const heapGateSlack = 16 << 20

var heapGate struct {
	mu      sync.Mutex
	samples []metrics.Sample
	after   uint64 // the heap's objects after the last collection waited for
	pending uint64 // bytes let through and not yet allocated
}

// heapObjectsLocked reads the memory limit and the heap's objects (live or not yet swept)
// (under heapGate.mu); limit is math.MaxInt64 without one.
func heapObjectsLocked() (limit, objects uint64) {
	if heapGate.samples == nil {
		heapGate.samples = []metrics.Sample{{Name: "/gc/gomemlimit:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}}
	}
	s := heapGate.samples
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 || s[1].Value.Kind() != metrics.KindUint64 {
		return math.MaxInt64, 0
	}
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

// Wait waits for a collection if the heap is past the memory limit before extra more bytes
// are allocated; the caller calls the function returned once it allocated them (until then
// they count as allocated for the others).
func Wait(extra int64) func() {
	n := uint64(max(extra, 0))
	heapGate.mu.Lock()
	defer heapGate.mu.Unlock()
	limit, objects := heapObjectsLocked()
	if limit < math.MaxInt64 && objects+heapGate.pending+n > limit && objects > heapGate.after+heapGateSlack {
		runtime.GC()
		_, heapGate.after = heapObjectsLocked()
	}
	heapGate.pending += n
	return func() {
		heapGate.mu.Lock()
		heapGate.pending -= n
		heapGate.mu.Unlock()
	}
}
