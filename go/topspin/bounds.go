package topspin

import (
	"fmt"
	"net"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
)

// Refusing connections over max_connections (as the Rust server does): at most
// maxRefusals at once, each bounded in time and in what it reads.
const (
	maxRefusals      = 64
	refusalWait      = time.Second
	refusalReadLimit = 64 << 10
)

// full reports whether the server has max_connections open.
func (s *Server) full() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.openLocked() >= s.opts.maxConns
}

// openLocked is the connections that count toward max_connections (under mu): native ones,
// the gRPC face's, and those whose first byte is awaited.
func (s *Server) openLocked() int { return len(s.conns) + s.grpcConns + s.sniffing }

// admitSniff counts a new connection as awaiting its first byte, unless the server is full
// and already refusing as many connections as it may at once.
func (s *Server) admitSniff() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping || s.openLocked() >= s.opts.maxConns && s.sniffing >= maxRefusals {
		return false
	}
	s.sniffing++
	return true
}

// refuse tells a connection over max_connections why it is refused, then closes it: it
// gets the preface and SETTINGS and, once its first call arrives (so that the call fails
// with the reason) or after refusalWait, ERROR INTERNAL_ERROR naming the limit. No
// handler, a small buffer and a bounded time.
func (s *Server) refuse(nc net.Conn, pre []byte) {
	defer func() {
		_ = nc.Close()
		s.mu.Lock()
		s.refusing--
		s.mu.Unlock()
	}()
	eng, err := wire.NewConn(wire.Server, s.opts.settings, s.opts.limits)
	if err != nil {
		return
	}
	wait := refusalWait
	if d := s.opts.handshake; d > 0 {
		wait = min(wait, d)
	}
	_ = nc.SetDeadline(time.Now().Add(wait))
	buf := make([]byte, 4096)
	if len(pre) > 0 {
		_ = eng.Receive(pre, time.Now()) // a bad first byte: the engine says so below
	}
	for read := 0; read < refusalReadLimit && writeAll(nc, eng) == nil; {
		n, err := nc.Read(buf)
		read += n
		if n > 0 && (eng.Receive(buf[:n], time.Now()) != nil || callStarted(eng)) {
			break
		}
		if err != nil {
			break
		}
	}
	eng.Abort(wire.InternalError, fmt.Sprintf("max_connections (%d) reached: the server takes no more connections now; try again later", s.opts.maxConns))
	_ = nc.SetDeadline(time.Now().Add(time.Second))
	_ = writeAll(nc, eng)
}

// callStarted reports whether the engine's events include a call.
func callStarted(eng *wire.Conn) bool {
	started := false
	for {
		ev, ok := eng.PollEvent()
		if !ok {
			return started
		}
		started = started || ev.Type == wire.EvCallStarted
	}
}

// writeAll writes what the engine queued.
func writeAll(nc net.Conn, eng *wire.Conn) error {
	bufs, _ := eng.TakeOutput(nil, nil)
	_, err := bufs.WriteTo(nc)
	return err
}

// Gauges are what a server holds now (Server.Gauges).
type Gauges struct {
	Connections   int   // connections open (handshaking, serving or draining; both faces)
	OpenCalls     int   // calls open on them (both faces)
	UnsentBytes   int   // bytes produced for native peers and not yet written to their sockets
	ReservedBytes int64 // bytes reserved in the memory budget (shared: the whole budget's)
	MemoryBudget  int64 // that budget's limit
}

// Gauges reads the server's gauges (a snapshot: each connection is read under its lock).
func (s *Server) Gauges() Gauges {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	s.mu.Lock()
	g := Gauges{Connections: len(conns) + s.grpcConns, OpenCalls: int(s.grpcCalls.Load())}
	s.mu.Unlock()
	for _, c := range conns {
		c.mu.Lock()
		g.OpenCalls += c.eng.OpenCalls()
		g.UnsentBytes += c.unsentLocked()
		c.mu.Unlock()
	}
	b := s.opts.memoryBudget()
	g.ReservedBytes, g.MemoryBudget = b.Used(), b.Limit()
	return g
}
