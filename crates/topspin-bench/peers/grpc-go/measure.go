package main

import (
	"errors"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The measuring loops of topspin-bench-common (run_async, burst, throughput, Series), in Go:
// the same warm-up, bounds, figures and JSON.

// cmd is one measured series, as the driver sends it (topspin_bench_common::Cmd).
type cmd struct {
	Workload    string `json:"workload"`
	Size        uint64 `json:"size"`
	Connections int    `json:"connections"`
	InFlight    int    `json:"in_flight"`
	Warmup      uint32 `json:"warmup"`
	WarmupMs    uint64 `json:"warmup_ms"`
	Iters       uint32 `json:"iters"`
	MaxMs       uint64 `json:"max_ms"`
}

// outcome is what one series measured (topspin_bench_common::Outcome).
type outcome struct {
	Calls             uint64   `json:"calls"`
	MedianUs          *float64 `json:"median_us"`
	P99Us             *float64 `json:"p99_us"`
	CPUUsPerCall      *float64 `json:"cpu_us_per_call"`
	CallsPerS         *float64 `json:"calls_per_s"`
	AllocsPerCall     *float64 `json:"allocs_per_call"`
	BytesAllocPerCall *float64 `json:"bytes_alloc_per_call"`
	Unsupported       bool     `json:"unsupported"`
	Error             *string  `json:"error"`
}

func failed(err error) outcome {
	s := err.Error()
	return outcome{Error: &s}
}

func ptr(f float64) *float64 { return &f }

// cpuUs is the CPU time (user + system) of this process, plus that of the server process when
// it is a child of its own, in µs.
func cpuUs() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	t := func(tv syscall.Timeval) float64 { return float64(tv.Sec)*1e6 + float64(tv.Usec) }
	return t(ru.Utime) + t(ru.Stime) + serverCPUUs()
}

// Allocation counting: runtime.MemStats' Mallocs and TotalAlloc (objects and bytes allocated,
// cumulative, tiny allocations included) between "on" and "off", for the whole process.
var (
	countMu   sync.Mutex
	counting  bool
	countBase [2]uint64
	counted   [2]uint64
)

func memStats() [2]uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return [2]uint64{m.Mallocs, m.TotalAlloc}
}

// countLocal switches this process's allocation count on or off.
func countLocal(on bool) {
	countMu.Lock()
	defer countMu.Unlock()
	if on == counting {
		return
	}
	now := memStats()
	if on {
		countBase = now
	} else {
		counted[0] += now[0] - countBase[0]
		counted[1] += now[1] - countBase[1]
	}
	counting = on
}

func localAllocations() [2]uint64 {
	countMu.Lock()
	defer countMu.Unlock()
	return counted
}

// countAllocations switches counting on or off, client and server (ordered so that talking
// to a server process is never counted).
func countAllocations(on bool) {
	if on {
		serverCount(true)
		countLocal(true)
	} else {
		countLocal(false)
		serverCount(false)
	}
}

func allocations() [2]uint64 {
	a, b := localAllocations(), serverAllocations()
	return [2]uint64{a[0] + b[0], a[1] + b[1]}
}

// series holds a measured series' samples and the process counters around it.
type series struct {
	samples  []time.Duration
	cpu0     float64
	alloc0   [2]uint64
	counting bool
	t0       time.Time
}

func startSeries(c *cmd) *series {
	s := &series{samples: make([]time.Duration, 0, c.Iters+1)}
	s.counting = len(c.Workload) >= 6 && c.Workload[:6] == "allocs"
	s.cpu0 = cpuUs()
	s.alloc0 = allocations()
	if s.counting {
		countAllocations(true)
	}
	s.t0 = time.Now()
	return s
}

func (s *series) push(d time.Duration) {
	if len(s.samples) < cap(s.samples) {
		s.samples = append(s.samples, d)
	}
}

func (s *series) finish(calls uint64) outcome {
	wall := time.Since(s.t0)
	countAllocations(false)
	cpu := cpuUs() - s.cpu0
	a := allocations()
	o := outcome{Calls: calls}
	if calls == 0 {
		return failed(errors.New("no call completed"))
	}
	c := float64(calls)
	o.CPUUsPerCall = ptr(cpu / c)
	o.CallsPerS = ptr(c / wall.Seconds())
	if n := len(s.samples); n > 0 {
		slices.Sort(s.samples)
		o.MedianUs = ptr(float64(s.samples[n/2].Nanoseconds()) / 1000)
		i99 := min(max(int(math.Ceil(float64(n)*0.99)), 1), n) - 1
		o.P99Us = ptr(float64(s.samples[i99].Nanoseconds()) / 1000)
	}
	if s.counting {
		o.AllocsPerCall = ptr(float64(a[0]-s.alloc0[0]) / c)
		o.BytesAllocPerCall = ptr(float64(a[1]-s.alloc0[1]) / c)
	}
	return o
}

// caller makes one call of the series' input on one connection, checking the reply fully
// when check is set.
type caller func(conn int, check bool) error

// run runs any workload: warm-up on connection 0 (its first reply checked in full), then the
// series.
func run(c *cmd, call caller, conns int) outcome {
	wd := time.Now().Add(time.Duration(c.WarmupMs) * time.Millisecond)
	for i := uint32(0); i < max(c.Warmup, 1); i++ {
		if err := call(0, i == 0); err != nil {
			return failed(err)
		}
		if !time.Now().Before(wd) {
			break
		}
	}
	switch c.Workload {
	case "throughput":
		return throughput(c, call, conns)
	case "burst":
		return burst(c, call)
	}
	s := startSeries(c)
	deadline := time.Now().Add(time.Duration(c.MaxMs) * time.Millisecond)
	calls := uint64(0)
	for i := uint32(0); i < max(c.Iters, 1); i++ {
		t := time.Now()
		if err := call(0, false); err != nil {
			countAllocations(false)
			return failed(err)
		}
		e := time.Now()
		s.push(e.Sub(t))
		calls++
		if !e.Before(deadline) {
			break
		}
	}
	return s.finish(calls)
}

// burst issues 8 calls at once (a goroutine each), then waits for all; µs per call is the
// burst's time / 8.
func burst(c *cmd, call caller) outcome {
	s := startSeries(c)
	deadline := time.Now().Add(time.Duration(c.MaxMs) * time.Millisecond)
	calls := uint64(0)
	var errs [8]error
	for i := uint32(0); i < max(c.Iters, 1); i++ {
		t := time.Now()
		var wg sync.WaitGroup
		for j := range errs {
			wg.Go(func() { errs[j] = call(0, false) })
		}
		wg.Wait()
		e := time.Now()
		if err := errors.Join(errs[:]...); err != nil {
			countAllocations(false)
			return failed(err)
		}
		s.push(e.Sub(t) / 8)
		calls += 8
		if !e.Before(deadline) {
			break
		}
	}
	return s.finish(calls)
}

// throughput runs connections × in_flight lanes (a goroutine each, grpc-go's own shape),
// each calling back to back until the call budget or the time bound is reached: the warm-up
// with the same shape, then the measured run.
func throughput(c *cmd, call caller, conns int) outcome {
	nc := min(max(c.Connections, 1), conns)
	per := max(c.InFlight, 1)
	var out outcome
	for phase := range 2 {
		ms, budget := c.WarmupMs, uint64(c.Warmup)
		if phase == 1 {
			ms, budget = c.MaxMs, uint64(c.Iters)
		}
		budget *= uint64(nc * per)
		deadline := time.Now().Add(time.Duration(ms) * time.Millisecond)
		var done atomic.Uint64
		var stop atomic.Bool
		var firstErr error
		var errOnce sync.Once
		var s *series
		if phase == 1 {
			s = startSeries(c)
		}
		var wg sync.WaitGroup
		for conn := range nc {
			for range per {
				wg.Go(func() {
					for !stop.Load() && done.Load() < budget && time.Now().Before(deadline) {
						done.Add(1)
						if err := call(conn, false); err != nil {
							errOnce.Do(func() { firstErr = err })
							stop.Store(true)
						}
					}
				})
			}
		}
		wg.Wait()
		if firstErr != nil {
			countAllocations(false)
			return failed(firstErr)
		}
		if s != nil {
			out = s.finish(done.Load())
			out.MedianUs, out.P99Us = nil, nil
		}
	}
	return out
}
