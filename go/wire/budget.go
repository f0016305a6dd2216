package wire

import (
	"sync"
	"sync/atomic"
)

// MemoryBudget bounds the bytes a process reserves for messages it is receiving (protocol.md
// §9 "Local limits"): frames larger than a read reserved whole before they arrived, and
// split messages being reassembled. Connections sharing a budget charge it; past its limit a
// frame's buffer grows only as its bytes arrive, a server refuses new calls with
// RESOURCE_EXHAUSTED and chunk credit is withheld. Safe for concurrent use.
type MemoryBudget struct {
	limit int64
	used  atomic.Int64
}

// DefaultMemoryBudget is the limit of ProcessMemoryBudget: 1 GiB, as in the Rust runtime.
const DefaultMemoryBudget = 1 << 30

// NewMemoryBudget makes a budget of limit bytes.
func NewMemoryBudget(limit int64) *MemoryBudget { return &MemoryBudget{limit: max(limit, 0)} }

var processBudget = sync.OnceValue(func() *MemoryBudget { return NewMemoryBudget(DefaultMemoryBudget) })

// ProcessMemoryBudget is the budget every client and server of the process shares unless
// given another one (DefaultMemoryBudget bytes).
func ProcessMemoryBudget() *MemoryBudget { return processBudget() }

// TryReserve takes n bytes if that keeps the budget within its limit, and reports whether
// it did (a nil budget never does).
func (b *MemoryBudget) TryReserve(n int64) bool {
	if b == nil {
		return false
	}
	for {
		used := b.used.Load()
		if used+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// Charge takes n bytes even past the limit: bytes that already arrived within the peer's
// credit and must be held (the budget then stays spent until they are released).
func (b *MemoryBudget) Charge(n int64) {
	if b != nil && n > 0 {
		b.used.Add(n)
	}
}

// Release gives back n bytes taken with TryReserve or Charge.
func (b *MemoryBudget) Release(n int64) {
	if b != nil && n > 0 {
		b.used.Add(-n)
	}
}

// Spent reports whether nothing is left (Used() >= Limit()); a nil budget never is.
func (b *MemoryBudget) Spent() bool { return b != nil && b.used.Load() >= b.limit }

// Used is the number of bytes reserved now.
func (b *MemoryBudget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// Limit is the budget's limit in bytes.
func (b *MemoryBudget) Limit() int64 {
	if b == nil {
		return 0
	}
	return b.limit
}
