// Command topspin-go-bench measures topspin-go against a raw Go socket echo (the floor),
// grpc-go and DRPC (storj.io/drpc), over loopback TCP, client and server in this process:
//
//	go run ./cmd/topspin-go-bench            # full run (about a minute)
//	go run ./cmd/topspin-go-bench -quick     # fewer iterations
//	go run ./cmd/topspin-go-bench -smoke     # correctness of every system only, no timings
//
// Workloads: echo of 20 B, 20000 B and 2 MB (one call in flight: median and p99 latency,
// CPU per call of the whole process), answer (empty request, 8-byte answer), throughput
// with 64 calls in flight on 1 and on 4 connections (20 B echo), and heap allocations per
// 20 B echo call (client and server together, runtime.MemStats).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"storj.io/drpc"
	"storj.io/drpc/drpcconn"
	"storj.io/drpc/drpcmux"
	"storj.io/drpc/drpcserver"
)

// system is one RPC system under test: a connected client making echo calls.
type system interface {
	name() string
	// call sends req and returns the echoed (or answered) bytes.
	call(conn int, req []byte) ([]byte, error)
	close()
}

// ---- raw: length-prefixed echo on a plain socket, one goroutine per connection ----

type rawSystem struct {
	l     net.Listener
	conns []*rawConn
}

type rawConn struct {
	mu  sync.Mutex
	nc  net.Conn
	r   *bufio.Reader
	hdr [4]byte
	buf []byte
}

func newRaw(conns int) (*rawSystem, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			go rawServe(nc)
		}
	}()
	s := &rawSystem{l: l}
	for i := 0; i < conns; i++ {
		nc, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			return nil, err
		}
		s.conns = append(s.conns, &rawConn{nc: nc, r: bufio.NewReaderSize(nc, 64<<10)})
	}
	return s, nil
}

func rawServe(nc net.Conn) {
	defer nc.Close()
	r := bufio.NewReaderSize(nc, 64<<10)
	var hdr [4]byte
	var buf []byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := binary.LittleEndian.Uint32(hdr[:])
		if cap(buf) < int(n) {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := io.ReadFull(r, buf); err != nil {
			return
		}
		if n == 0 { // "answer"
			buf = append(buf, 42, 0, 0, 0, 0, 0, 0, 0)
			binary.LittleEndian.PutUint32(hdr[:], 8)
		}
		bufs := net.Buffers{hdr[:], buf}
		if _, err := bufs.WriteTo(nc); err != nil {
			return
		}
	}
}

func (s *rawSystem) name() string { return "raw Go socket" }

func (s *rawSystem) call(i int, req []byte) ([]byte, error) {
	c := s.conns[i%len(s.conns)]
	c.mu.Lock()
	defer c.mu.Unlock()
	binary.LittleEndian.PutUint32(c.hdr[:], uint32(len(req)))
	bufs := net.Buffers{c.hdr[:], req}
	if _, err := bufs.WriteTo(c.nc); err != nil {
		return nil, err
	}
	var hdr [4]byte
	if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if cap(c.buf) < int(n) {
		c.buf = make([]byte, n)
	}
	c.buf = c.buf[:n]
	_, err := io.ReadFull(c.r, c.buf)
	return c.buf, err
}

func (s *rawSystem) close() {
	_ = s.l.Close()
	for _, c := range s.conns {
		_ = c.nc.Close()
	}
}

// ---- topspin-go ----

type topspinSystem struct {
	srv   *topspin.Server
	conns []*topspin.ClientConn
	opt   topspin.CallOption
}

var answer = []byte{42, 0, 0, 0, 0, 0, 0, 0}

func newTopspin(conns int) (*topspinSystem, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := topspin.NewServer()
	srv.Handle("/bench.Echo/Echo", topspin.UnaryRaw(func(_ context.Context, _ topspin.Metadata, req []byte) ([]byte, error) {
		if len(req) == 0 {
			return answer, nil
		}
		return req, nil
	}), topspin.CodecRaw)
	go func() { _ = srv.Serve(l) }()
	s := &topspinSystem{srv: srv, opt: topspin.WithCodec(topspin.CodecRaw)}
	for i := 0; i < conns; i++ {
		cc, err := topspin.Dial(context.Background(), "tcp://"+l.Addr().String())
		if err != nil {
			return nil, err
		}
		s.conns = append(s.conns, cc)
	}
	return s, nil
}

func (s *topspinSystem) name() string { return "topspin-go" }

func (s *topspinSystem) call(i int, req []byte) ([]byte, error) {
	return s.conns[i%len(s.conns)].InvokeRaw(context.Background(), "/bench.Echo/Echo", req, s.opt)
}

func (s *topspinSystem) close() {
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.srv.Stop()
}

// ---- grpc-go, with a raw-bytes codec (no protobuf cost on either side) ----

type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "raw" }

var _ encoding.Codec = rawCodec{}

type grpcSystem struct {
	srv   *grpc.Server
	conns []*grpc.ClientConn
}

func newGRPC(conns int) (*grpcSystem, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.MaxRecvMsgSize(64<<20), grpc.MaxSendMsgSize(64<<20))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "bench.Echo",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Echo", Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var in []byte
			if err := dec(&in); err != nil {
				return nil, err
			}
			if len(in) == 0 {
				in = answer
			}
			return &in, nil
		}}},
	}, struct{}{})
	go func() { _ = srv.Serve(l) }()
	s := &grpcSystem{srv: srv}
	for i := 0; i < conns; i++ {
		cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}),
				grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
		if err != nil {
			return nil, err
		}
		s.conns = append(s.conns, cc)
	}
	return s, nil
}

func (s *grpcSystem) name() string { return "grpc-go" }

func (s *grpcSystem) call(i int, req []byte) ([]byte, error) {
	var out []byte
	err := s.conns[i%len(s.conns)].Invoke(context.Background(), "/bench.Echo/Echo", &req, &out)
	return out, err
}

func (s *grpcSystem) close() {
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.srv.Stop()
}

// ---- DRPC (storj.io/drpc): one call at a time per connection, so callers share a
// connection under a lock, like raw ----

type drpcRaw struct{}

func (drpcRaw) Marshal(msg drpc.Message) ([]byte, error) { return *(msg.(*[]byte)), nil }
func (drpcRaw) Unmarshal(buf []byte, msg drpc.Message) error {
	*(msg.(*[]byte)) = append([]byte(nil), buf...)
	return nil
}

type drpcEcho struct{}

func (*drpcEcho) Echo(_ context.Context, in *[]byte) (*[]byte, error) {
	if len(*in) == 0 {
		a := answer
		return &a, nil
	}
	return in, nil
}

type drpcDesc struct{}

func (drpcDesc) NumMethods() int { return 1 }
func (drpcDesc) Method(n int) (string, drpc.Encoding, drpc.Receiver, any, bool) {
	if n != 0 {
		return "", nil, nil, nil, false
	}
	return "/bench.Echo/Echo", drpcRaw{}, func(srv any, ctx context.Context, in1, _ any) (drpc.Message, error) {
		return srv.(*drpcEcho).Echo(ctx, in1.(*[]byte))
	}, (*drpcEcho).Echo, true
}

type drpcSystem struct {
	l      net.Listener
	cancel context.CancelFunc
	conns  []*drpcConn
}

type drpcConn struct {
	mu sync.Mutex
	c  *drpcconn.Conn
}

func newDRPC(conns int) (*drpcSystem, error) {
	mux := drpcmux.New()
	if err := mux.Register(&drpcEcho{}, drpcDesc{}); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = drpcserver.New(mux).Serve(ctx, l) }()
	s := &drpcSystem{l: l, cancel: cancel}
	for i := 0; i < conns; i++ {
		nc, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			return nil, err
		}
		s.conns = append(s.conns, &drpcConn{c: drpcconn.New(nc)})
	}
	return s, nil
}

func (s *drpcSystem) name() string { return "drpc" }

func (s *drpcSystem) call(i int, req []byte) ([]byte, error) {
	c := s.conns[i%len(s.conns)]
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []byte
	err := c.c.Invoke(context.Background(), "/bench.Echo/Echo", drpcRaw{}, &req, &out)
	return out, err
}

func (s *drpcSystem) close() {
	for _, c := range s.conns {
		_ = c.c.Close()
	}
	s.cancel()
	_ = s.l.Close()
}

// ---- measurement ----

type factory struct {
	name string
	make func(conns int) (system, error)
}

var factories = []factory{
	{"raw Go socket", func(n int) (system, error) { return newRaw(n) }},
	{"topspin-go", func(n int) (system, error) { return newTopspin(n) }},
	{"grpc-go", func(n int) (system, error) { return newGRPC(n) }},
	{"drpc", func(n int) (system, error) { return newDRPC(n) }},
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type result struct {
	median, p99, cpu time.Duration
	rate             float64
}

// latencies makes iters calls one after the other; it returns each call's time and the
// process CPU time they took.
func latencies(s system, size, iters int) ([]time.Duration, time.Duration, error) {
	req := bytes.Repeat([]byte{7}, size)
	want := len(req)
	if size == 0 {
		want = 8
	}
	for i := 0; i < min(iters/10+1, 100); i++ { // warm-up
		if _, err := s.call(0, req); err != nil {
			return nil, 0, err
		}
	}
	lat := make([]time.Duration, iters)
	cpu0 := cpuTime()
	for i := range lat {
		t := time.Now()
		out, err := s.call(0, req)
		lat[i] = time.Since(t)
		if err != nil {
			return nil, 0, err
		}
		if len(out) != want {
			return nil, 0, fmt.Errorf("%s: %d bytes back, want %d", s.name(), len(out), want)
		}
	}
	return lat, cpuTime() - cpu0, nil
}

func throughput(s system, conns, inflight int, d time.Duration) (result, error) {
	req := bytes.Repeat([]byte{7}, 20)
	var n atomic.Int64
	var firstErr atomic.Value
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	cpu0 := cpuTime()
	start := time.Now()
	for c := 0; c < conns; c++ {
		for k := 0; k < inflight; k++ {
			wg.Add(1)
			go func(c int) {
				defer wg.Done()
				for time.Now().Before(stop) {
					out, err := s.call(c, req)
					if err != nil || len(out) != 20 {
						firstErr.CompareAndSwap(nil, fmt.Errorf("%s: %v (%d bytes)", s.name(), err, len(out)))
						return
					}
					n.Add(1)
				}
			}(c)
		}
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return result{}, err
	}
	el := time.Since(start)
	calls := n.Load()
	return result{rate: float64(calls) / el.Seconds(), cpu: (cpuTime() - cpu0) / time.Duration(max(calls, 1))}, nil
}

func allocsPerCall(s system, iters int) (float64, error) {
	req := bytes.Repeat([]byte{7}, 20)
	for i := 0; i < 200; i++ {
		if _, err := s.call(0, req); err != nil {
			return 0, err
		}
	}
	runtime.GC()
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	for i := 0; i < iters; i++ {
		if _, err := s.call(0, req); err != nil {
			return 0, err
		}
	}
	runtime.ReadMemStats(&b)
	return float64(b.Mallocs-a.Mallocs) / float64(iters), nil
}

func smoke() error {
	for _, f := range factories {
		for _, conns := range []int{1, 4} {
			s, err := f.make(conns)
			if err != nil {
				return fmt.Errorf("%s: %w", f.name, err)
			}
			for _, size := range []int{20, 20000, 2 << 20} {
				req := make([]byte, size)
				for i := range req {
					req[i] = byte(i * 7)
				}
				for c := 0; c < conns; c++ {
					out, err := s.call(c, req)
					if err != nil || !bytes.Equal(out, req) {
						return fmt.Errorf("%s: echo of %d bytes: %v (%d bytes back)", f.name, size, err, len(out))
					}
				}
			}
			out, err := s.call(0, nil)
			if err != nil || !bytes.Equal(out, answer) {
				return fmt.Errorf("%s: answer: %v %x", f.name, err, out)
			}
			if _, err := throughput(s, conns, 8, 50*time.Millisecond); err != nil {
				return err
			}
			s.close()
		}
		fmt.Printf("%-14s ok\n", f.name)
	}
	return nil
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Nanoseconds())/1000) }

func main() {
	smokeOnly := flag.Bool("smoke", false, "check that every system answers correctly; no timings")
	quick := flag.Bool("quick", false, "fewer iterations")
	flag.Parse()
	if *smokeOnly {
		if err := smoke(); err != nil {
			fmt.Fprintln(os.Stderr, "smoke:", err)
			os.Exit(1)
		}
		return
	}
	scale, dur := 1, 2*time.Second
	if *quick {
		scale, dur = 5, 500*time.Millisecond
	}
	type workload struct {
		title string
		size  int
		iters int
	}
	workloads := []workload{{"echo 20 B", 20, 20000 / scale}, {"echo 20000 B", 20000, 5000 / scale},
		{"echo 2 MB", 2 << 20, 200 / scale}, {"answer", 0, 20000 / scale}}
	systems := make([]system, len(factories))
	for i, f := range factories {
		s, err := f.make(1)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		systems[i] = s
	}
	fmt.Printf("GOMAXPROCS=%d, %s, loopback TCP, client and server in one process (CPU = both)\n", runtime.GOMAXPROCS(0), runtime.Version())
	for _, w := range workloads {
		fmt.Printf("\n%s\n%-14s %10s %10s %12s %9s %9s\n", w.title, "system", "median µs", "p99 µs", "CPU µs/call", "vs raw", "vs grpc")
		// Rounds, every system in turn, so that a noisy moment of the machine is shared.
		const rounds = 5
		lats := make([][]time.Duration, len(systems))
		cpus := make([]time.Duration, len(systems))
		for round := 0; round < rounds; round++ {
			for i, s := range systems {
				l, cpu, err := latencies(s, w.size, max(w.iters/rounds, 10))
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				lats[i] = append(lats[i], l...)
				cpus[i] += cpu
			}
		}
		rs := make([]result, len(systems))
		for i, l := range lats {
			slices.Sort(l)
			rs[i] = result{median: l[len(l)/2], p99: l[len(l)*99/100], cpu: cpus[i] / time.Duration(len(l))}
		}
		for i, r := range rs {
			fmt.Printf("%-14s %10s %10s %12s %8.2fx %8.2fx\n", systems[i].name(), us(r.median), us(r.p99), us(r.cpu),
				float64(r.median)/float64(rs[0].median), float64(r.median)/float64(rs[2].median))
		}
	}
	fmt.Printf("\nallocations per 20 B echo call (client + server)\n")
	for _, s := range systems {
		a, err := allocsPerCall(s, 5000/scale)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%-14s %8.1f\n", s.name(), a)
	}
	for _, s := range systems {
		s.close()
	}
	for _, tc := range []struct{ conns, inflight int }{{1, 64}, {4, 64}} {
		fmt.Printf("\nthroughput, %d×%d in flight, 20 B echo\n%-14s %12s %12s %9s %9s\n", tc.conns, tc.inflight, "system", "calls/s", "CPU µs/call", "vs raw", "vs grpc")
		rs := make([]result, len(factories))
		for i, f := range factories {
			s, err := f.make(tc.conns)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			rs[i], err = throughput(s, tc.conns, tc.inflight, dur)
			s.close()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
		for i, r := range rs {
			fmt.Printf("%-14s %12.0f %12s %8.2fx %8.2fx\n", factories[i].name, r.rate, us(r.cpu), r.rate/rs[0].rate, r.rate/rs[2].rate)
		}
	}
}
