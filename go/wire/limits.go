package wire

import "time"

// Limits are the local flood budgets (§9 "Local limits"). A zero Per disables refilling.
type Limits struct {
	PingBurst        int
	PingPer          time.Duration
	RapidResetBurst  int
	RapidResetPer    time.Duration
	RefusedCallBurst int
	RefusedCallPer   time.Duration
}

// DefaultLimits are protocol.md's RECOMMENDED limits.
func DefaultLimits() Limits {
	return Limits{PingBurst: 20, PingPer: 100 * time.Millisecond,
		RapidResetBurst: 1000, RapidResetPer: time.Millisecond,
		RefusedCallBurst: 100, RefusedCallPer: 10 * time.Millisecond}
}

type bucket struct {
	tokens float64
	burst  float64
	per    time.Duration
	last   time.Time
}

func newBucket(burst int, per time.Duration) bucket {
	return bucket{tokens: float64(burst), burst: float64(burst), per: per}
}

func (b *bucket) take(now time.Time) bool {
	if b.per > 0 && !b.last.IsZero() && now.After(b.last) {
		b.tokens = min(b.burst, b.tokens+float64(now.Sub(b.last))/float64(b.per))
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
