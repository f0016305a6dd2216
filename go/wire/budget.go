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
	// parent: a share's whole, charged with every byte the share is (ShareOf).
	parent *MemoryBudget
}

// ShareOfBudget: a connection's incomplete messages hold at most 1/ShareOfBudget of the
// memory budget (128 MiB of the default 1 GiB), plus the one message that always goes on,
// as in the Rust runtime (SHARE_OF_BUDGET).
const ShareOfBudget = 8

// ShareOf makes a share of parent of at most limit bytes: what it takes is taken from
// parent too, and it is spent when either is (one connection's share of the process
// budget, so that a single peer cannot spend all of it). A nil parent gives nil.
func ShareOf(parent *MemoryBudget, limit int64) *MemoryBudget {
	if parent == nil {
		return nil
	}
	return &MemoryBudget{limit: max(limit, 0), parent: parent}
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
			break
		}
	}
	if b.parent != nil && !b.parent.TryReserve(n) {
		b.used.Add(-n)
		return false
	}
	return true
}

// Charge takes n bytes even past the limit: bytes that already arrived within the peer's
// credit and must be held (the budget then stays spent until they are released).
func (b *MemoryBudget) Charge(n int64) {
	if b != nil && n > 0 {
		b.used.Add(n)
		b.parent.Charge(n)
	}
}

// Release gives back n bytes taken with TryReserve or Charge.
func (b *MemoryBudget) Release(n int64) {
	if b != nil && n > 0 {
		b.used.Add(-n)
		b.parent.Release(n)
	}
}

// Spent reports whether nothing is left (Used() >= Limit(), or a share's whole is spent);
// a nil budget never is.
func (b *MemoryBudget) Spent() bool {
	return b != nil && (b.used.Load() >= b.limit || b.parent.Spent())
}

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
