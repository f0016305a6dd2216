package topspin

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
)

const readBufSize = 64 << 10

var readBufPool = sync.Pool{New: func() any { b := make([]byte, readBufSize); return &b }}

// conn runs one connection: one reader and one writer goroutine around a wire.Conn.
type conn struct {
	nc   net.Conn
	mu   sync.Mutex
	eng  *wire.Conn
	wake chan struct{}
	done chan struct{} // closed once the connection is over
	// established is closed when the peer's SETTINGS arrived.
	established chan struct{}
	estOnce     sync.Once
	closeOnce   sync.Once
	finishing   bool // close once the output is flushed

	streams map[uint32]*stream
	// slot is closed and replaced when a call ends (wakes callers waiting for room).
	slot chan struct{}
	err  error // why the connection ended

	onEvent func(ev *wire.Event) // role-specific events (under mu)
	onClose func()
}

func newConn(nc net.Conn, role wire.Role, s wire.Settings, l wire.Limits) (*conn, error) {
	eng, err := wire.NewConn(role, s, l)
	if err != nil {
		return nil, err
	}
	return &conn{nc: nc, eng: eng, wake: make(chan struct{}, 1), done: make(chan struct{}),
		established: make(chan struct{}), streams: make(map[uint32]*stream),
		slot: make(chan struct{})}, nil
}

func (c *conn) start() {
	c.signal()
	go c.writeLoop()
	go c.readLoop()
}

// signal wakes the writer.
func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *conn) writeLoop() {
	var bufs net.Buffers
	var spare []byte
	for {
		select {
		case <-c.wake:
		case <-c.done:
			return
		}
		c.mu.Lock()
		bufs, spare = c.eng.TakeOutput(bufs[:0], spare)
		closing := c.eng.Closed() || c.finishing
		c.mu.Unlock()
		if len(bufs) > 0 {
			w := bufs
			if _, err := w.WriteTo(c.nc); err != nil {
				c.shutdown(err)
				return
			}
			clear(bufs)
		}
		if closing {
			c.mu.Lock()
			more := c.eng.HasOutput()
			c.mu.Unlock()
			if more {
				c.signal()
				continue
			}
			c.shutdown(nil)
			return
		}
	}
}

func (c *conn) readLoop() {
	bp := readBufPool.Get().(*[]byte)
	defer readBufPool.Put(bp)
	buf := *bp
	for {
		n, err := c.nc.Read(buf)
		if n > 0 {
			c.mu.Lock()
			rerr := c.eng.Receive(buf[:n], time.Now())
			c.drain()
			c.mu.Unlock()
			c.signal()
			if rerr != nil {
				return // the writer flushes ERROR and closes
			}
		}
		if err != nil {
			c.shutdown(err)
			return
		}
	}
}

// drain dispatches the engine's events (under mu).
func (c *conn) drain() {
	for {
		ev, ok := c.eng.PollEvent()
		if !ok {
			break
		}
		switch ev.Type {
		case wire.EvEstablished:
			c.estOnce.Do(func() { close(c.established) })
		case wire.EvWritable:
			if s := c.streams[ev.CallID]; s != nil {
				s.notifyWrite()
			}
		case wire.EvClosed:
			if ev.Err != nil && c.err == nil {
				c.err = ev.Err
			}
		default:
			c.onEvent(&ev)
		}
	}
	if c.eng.Closed() || (c.eng.GoingAway() && c.eng.OpenCalls() == 0) {
		c.finishing = true
	}
}

// callEnded wakes callers waiting for room under MAX_CONCURRENT_CALLS (under mu).
func (c *conn) callEnded(id uint32) {
	delete(c.streams, id)
	close(c.slot)
	c.slot = make(chan struct{})
	if c.eng.GoingAway() && c.eng.OpenCalls() == 0 {
		c.finishing = true
	}
}

// shutdown closes the socket and fails every call.
func (c *conn) shutdown(err error) {
	c.closeOnce.Do(func() {
		_ = c.nc.Close()
		c.mu.Lock()
		if c.err == nil {
			if err == nil {
				err = errConnClosed
			}
			c.err = err
		}
		c.eng.Shutdown("connection closed: " + c.err.Error())
		c.drain()
		c.mu.Unlock()
		close(c.done)
		if c.onClose != nil {
			c.onClose()
		}
	})
}

var errConnClosed = errors.New("connection closed")

// stream is one call's state, shared by client and server.
type stream struct {
	c          *conn
	id         uint32
	recvq      [][]byte
	costs      []uint32
	head       int
	rnote      chan struct{} // cap 1: a message or the end arrived
	wnote      chan struct{} // cap 1: send credit came back
	ended      bool          // the call is over (status set)
	status     *Status
	remoteDone bool // server: the client half-closed
	headers    Metadata
	gotHeaders bool
	cancel     func() // server: cancels the handler's context
}

func (s *stream) notifyRead() {
	select {
	case s.rnote <- struct{}{}:
	default:
	}
}

func (s *stream) notifyWrite() {
	select {
	case s.wnote <- struct{}{}:
	default:
	}
}

// push queues a received message (under mu).
func (s *stream) push(msg []byte, cost uint32) {
	s.recvq = append(s.recvq, msg)
	s.costs = append(s.costs, cost)
	s.notifyRead()
}

// pop takes a queued message (under mu) and returns its credit to the peer.
func (s *stream) pop() ([]byte, bool) {
	if s.head >= len(s.recvq) {
		return nil, false
	}
	msg, cost := s.recvq[s.head], s.costs[s.head]
	s.recvq[s.head] = nil
	s.head++
	if s.head == len(s.recvq) {
		s.recvq, s.costs, s.head = s.recvq[:0], s.costs[:0], 0
	}
	s.c.eng.ReturnCredit(s.id, cost)
	return msg, true
}
