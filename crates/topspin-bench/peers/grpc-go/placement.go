package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Where the server runs, as topspin-bench-common's placement.rs: in this process, or (with
// --separate-processes) in a child started with --server-only, which serves until its stdin
// closes and answers the allocation counter requests over that pipe; its CPU time is read
// through its CPU-time clock, so CPU and allocations per call stay client + server.

type serverChild struct {
	mu  sync.Mutex
	pid int
	in  io.WriteCloser
	out *bufio.Reader
}

var child *serverChild

// startServerProcess starts this program again with --server-only and returns the address it
// listens on.
func startServerProcess() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	c := exec.Command(exe, "--server-only")
	c.Stderr = os.Stderr
	in, err := c.StdinPipe()
	if err != nil {
		return "", err
	}
	outPipe, err := c.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := c.Start(); err != nil {
		return "", err
	}
	out := bufio.NewReader(outPipe)
	line, err := out.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("server process: %w", err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if !ok {
		return "", fmt.Errorf("server process said %q, not `listening ADDR`", line)
	}
	child = &serverChild{pid: c.Process.Pid, in: in, out: out}
	return addr, nil
}

// ask sends one request line to the server child and returns its answer ("" without one).
func ask(req string) string {
	if child == nil {
		return ""
	}
	child.mu.Lock()
	defer child.mu.Unlock()
	if _, err := io.WriteString(child.in, req+"\n"); err != nil {
		return ""
	}
	line, _ := child.out.ReadString('\n')
	return strings.TrimSpace(line)
}

func serverCount(on bool) {
	if on {
		ask("count on")
	} else {
		ask("count off")
	}
}

func serverAllocations() [2]uint64 {
	var a [2]uint64
	if child != nil {
		_, _ = fmt.Sscan(ask("allocs"), &a[0], &a[1])
	}
	return a
}

// serverCPUUs is the server child's CPU time in µs (0 without one), from its process CPU-time
// clock: glibc's clock_getcpuclockid(pid) is ((^pid) << 3) | CPUCLOCK_SCHED (2).
func serverCPUUs() float64 {
	if child == nil {
		return 0
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(int32((^child.pid)<<3|2), &ts); err != nil {
		return 0
	}
	return float64(ts.Sec)*1e6 + float64(ts.Nsec)/1e3
}

// serveCounters is the --server-only process's life once its server runs: announce the
// address, answer the parent's counter requests until stdin closes, exit.
func serveCounters(addr string) {
	fmt.Printf("listening %s\n", addr)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var ans string
		switch strings.TrimSpace(in.Text()) {
		case "count on":
			countLocal(true)
			ans = "ok"
		case "count off":
			countLocal(false)
			ans = "ok"
		case "allocs":
			a := localAllocations()
			ans = fmt.Sprintf("%d %d", a[0], a[1])
		case "quit":
			os.Exit(0)
		default:
			ans = "?"
		}
		fmt.Println(ans)
	}
	if err := in.Err(); err != nil && !errors.Is(err, io.EOF) {
		os.Exit(1)
	}
	os.Exit(0)
}
