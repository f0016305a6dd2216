package topspin

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
)

const readBufSize = 64 << 10

var readBufPool = sync.Pool{New: func() any { b := make([]byte, readBufSize); return &b }}

// conn runs one connection around a wire.Conn: one reader goroutine and one writer
// goroutine. A caller that queues frames while nobody writes writes them itself (saving
// a goroutine hop); whoever writes takes everything queued so far in one vectored write.
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

	writing bool        // a goroutine is writing (it owns wbufs, spare, wtmp)
	wbufs   net.Buffers // reused list of slices to write
	wtmp    net.Buffers // WriteTo consumes it; a field so that it does not escape
	spare   []byte      // the small-frame buffer, back from the last write

	writeTimeout time.Duration // 0: none (WithWriteTimeout)
	writeBy      time.Time     // the socket's write deadline (writer only)
	isTLS        bool          // a TLS write cannot go on after its deadline passed

	// drained is closed (and cleared) once the unsent output is back under maxSend;
	// senders (and a server's reader) that find it over wait for it.
	drained  chan struct{}
	maxSend  int
	writingN int   // bytes taken by the writing goroutine, not yet written
	held     []job // server: calls that arrived while the send buffer was full

	timers     timers
	dog        *time.Timer // the watchdog (watchdog.go), set for dogAt
	dogAt      time.Time
	started    time.Time
	lastCall   time.Time // when a call last started or ended (idle timeout)
	pingAt     time.Time // server keep-alive: when the unanswered PING went
	readPaused bool      // the reader waits for the peer to read
	resumedAt  time.Time // when it last stopped waiting

	ev      wire.Event // the event being dispatched (a field: no allocation)
	streams map[uint32]*stream
	// slot is closed and replaced when a call ends while callers wait for room under
	// the peer's MAX_CONCURRENT_CALLS.
	slot        chan struct{}
	slotWaiters int
	err         error     // why the connection ended
	lastRecv    time.Time // when bytes last arrived (keep-alive)

	server  *Server // nil on a client
	onClose func()

	pre        []byte    // server: bytes read before the engine started (the sniffed first byte)
	acceptedAt time.Time // server: when the connection was accepted (zero: when it started)
}

func newConn(nc net.Conn, role wire.Role, o *options) (*conn, error) {
	eng, err := wire.NewConn(role, o.settings, o.limits)
	if err != nil {
		return nil, err
	}
	eng.SetMemoryBudget(o.memoryBudget())
	c := &conn{nc: nc, eng: eng, wake: make(chan struct{}, 1), done: make(chan struct{}),
		established: make(chan struct{}), streams: make(map[uint32]*stream),
		slot: make(chan struct{}), maxSend: o.maxSend, timers: timers{frame: o.frameTimeout},
		writeTimeout: o.writeTimeout}
	_, c.isTLS = nc.(*tls.Conn)
	if role == wire.Server {
		c.timers.handshake, c.timers.idle = o.handshake, o.idleTimeout
		c.timers.kaInterval, c.timers.kaTimeout = o.kaInterval, o.kaTimeout
	}
	return c, nil
}

func (c *conn) start() {
	c.startWatchdog()
	c.signal()
	go c.writeLoop()
	go c.readLoop()
}

// signal wakes the writer goroutine.
func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *conn) writeLoop() {
	for {
		select {
		case <-c.wake:
		case <-c.done:
			return
		}
		c.mu.Lock()
		if c.eng.OpenCalls() > 1 {
			// Other calls are in flight: let their goroutines (ready to run) queue
			// their frames first, so that one write carries more of them.
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
		}
		c.flushLocked()
	}
}

// flushLocked writes what the engine queued, unless another goroutine is writing (it
// then writes this too). Called with mu held; returns with mu released.
func (c *conn) flushLocked() {
	if c.writing {
		c.mu.Unlock()
		return
	}
	c.writing = true
	for {
		c.wbufs, c.spare = c.eng.TakeOutput(c.wbufs[:0], c.spare)
		c.writingN = 0
		for _, b := range c.wbufs {
			c.writingN += len(b)
		}
		if len(c.wbufs) == 0 {
			c.writing = false
			closing := c.eng.Closed() || c.finishing
			c.mu.Unlock()
			if closing {
				c.shutdown(nil)
			}
			return
		}
		c.mu.Unlock()
		c.wtmp = c.wbufs
		err := c.write()
		clear(c.wbufs)
		c.mu.Lock()
		c.writingN = 0
		if err != nil {
			c.writing = false
			c.mu.Unlock()
			c.shutdown(err)
			return
		}
		if c.unsentLocked() < c.maxSend {
			if c.drained != nil {
				close(c.drained)
				c.drained = nil
			}
			c.startHeld()
		}
	}
}

// tlsWriteChunk is the most a TLS connection writes at once under the write timeout: a
// timed-out TLS write cannot go on, so a peer must take this much within the timeout.
const tlsWriteChunk = 256 << 10

// write writes c.wtmp (by the writing goroutine, without mu), bounded by the write
// timeout. The socket's write deadline is moved only when less than the timeout remains
// (to 1.25 × the timeout ahead: one change per quarter timeout of writing at most, not one
// per write); a write that reaches it having moved some bytes goes on with a fresh one, one
// that moved none has waited at least the timeout for a peer taking nothing, and the
// connection closes. So a peer that takes nothing is closed after 1 to 2.25 × the timeout.
func (c *conn) write() error {
	wt := c.writeTimeout
	if wt <= 0 {
		_, err := c.wtmp.WriteTo(c.nc)
		return err
	}
	if c.isTLS {
		for _, b := range c.wtmp {
			for len(b) > 0 {
				n := min(len(b), tlsWriteChunk)
				c.armWrite(wt)
				if _, err := c.nc.Write(b[:n]); err != nil {
					return c.writeErr(err)
				}
				b = b[n:]
			}
		}
		return nil
	}
	for {
		c.armWrite(wt)
		n, err := c.wtmp.WriteTo(c.nc)
		if err == nil || n == 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return c.writeErr(err)
		}
		c.writeBy = time.Time{} // bytes moved before the deadline: a fresh one for the rest
	}
}

// armWrite makes sure the socket's write deadline is at least wt ahead.
func (c *conn) armWrite(wt time.Duration) {
	if now := time.Now(); c.writeBy.Sub(now) < wt {
		c.writeBy = now.Add(wt + wt/4)
		_ = c.nc.SetWriteDeadline(c.writeBy)
	}
}

// writeErr names the write timeout in the error of a write that reached it.
func (c *conn) writeErr(err error) error {
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("write timeout: the peer took none of our bytes for %v", c.writeTimeout)
	}
	return err
}

// unsentLocked is the bytes produced for the peer and not yet written (under mu).
func (c *conn) unsentLocked() int { return c.eng.OutputLen() + c.writingN }

// fullLocked reports whether the unsent output reached maxSend (under mu): senders then
// wait; a server stops reading and starting calls (flow control bounds each call; this
// bounds them all: unsent stays under maxSend + one message).
func (c *conn) fullLocked() bool { return c.unsentLocked() >= c.maxSend }

// waitRoom waits, under mu, until the connection's unsent output is under maxSend, done
// is closed or the connection ends; it returns false in the last two cases. mu is held
// again on return.
func (c *conn) waitRoom(done <-chan struct{}) bool {
	for c.fullLocked() && !c.eng.Closed() {
		if c.drained == nil {
			c.drained = make(chan struct{}) // a signal: closed, never sent on, so it holds nothing
		}
		ch := c.drained
		c.mu.Unlock()
		c.signal()
		select {
		case <-ch:
		case <-done:
			c.mu.Lock()
			return false
		case <-c.done:
			c.mu.Lock()
			return false
		}
		c.mu.Lock()
	}
	return true
}

// sendLocked gets queued frames written: by this goroutine when the connection is quiet
// (one hop less), by the writer goroutine when other calls are in flight (it then
// writes the frames of many calls at once). Called with mu held; returns with it released.
func (c *conn) sendLocked() {
	if c.writing || c.eng.OpenCalls() > 1 {
		c.mu.Unlock()
		c.signal()
		return
	}
	c.flushLocked()
}

func (c *conn) readLoop() {
	bp := readBufPool.Get().(*[]byte)
	defer readBufPool.Put(bp)
	buf := *bp
	if pre := c.pre; len(pre) > 0 {
		c.pre = nil
		if !c.received(pre, false) {
			return
		}
	}
	for {
		// A large incomplete frame is read straight into the engine's buffer (only this
		// goroutine touches it).
		c.mu.Lock()
		if c.server != nil && c.fullLocked() {
			// The peer does not read what it asked for: take no more from it until it does.
			c.readPaused = true
			c.waitRoom(nil)
			c.readPaused, c.resumedAt = false, time.Now()
		}
		space := c.eng.PendingSpace()
		c.mu.Unlock()
		var n int
		var err error
		if space != nil {
			n, err = c.nc.Read(space)
		} else {
			n, err = c.nc.Read(buf)
		}
		if n > 0 {
			in := space
			if in == nil {
				in = buf
			}
			in = in[:n]
			if !c.received(in, space != nil) {
				return // the writer flushes ERROR and closes
			}
		}
		if err != nil {
			c.shutdown(err)
			return
		}
	}
}

// received hands the engine the bytes just read (inPlace: read into its PendingSpace) and
// dispatches what they make happen; false when they ended the connection.
func (c *conn) received(in []byte, inPlace bool) bool {
	now := time.Now()
	c.mu.Lock()
	c.lastRecv = now
	var rerr error
	if inPlace {
		rerr = c.eng.ReceiveInPlace(len(in), now)
	} else {
		rerr = c.eng.Receive(in, now)
	}
	c.drain()
	c.armLocked(now)
	wake := c.eng.HasOutput() || c.finishing
	c.mu.Unlock()
	if wake {
		c.signal()
	}
	return rerr == nil
}

// drain dispatches the engine's events (under mu).
func (c *conn) drain() {
	for {
		var ok bool
		c.ev, ok = c.eng.PollEvent()
		if !ok {
			break
		}
		ev := &c.ev
		switch ev.Type {
		case wire.EvEstablished:
			c.estOnce.Do(func() { close(c.established) })
			c.lastCall = time.Now()
		case wire.EvWritable:
			if s := c.streams[ev.CallID]; s != nil {
				s.notifyWrite()
			}
		case wire.EvClosed:
			if ev.Err != nil && c.err == nil {
				c.err = ev.Err
			}
		default:
			if c.server != nil {
				c.server.serverEvent(c, ev)
			} else {
				c.clientEvent(ev)
			}
		}
	}
	c.ev = wire.Event{}
	if c.eng.Closed() || (c.eng.GoingAway() && c.eng.OpenCalls() == 0) {
		c.finishing = true
	}
}

// callEnded forgets a call and wakes callers waiting for room (under mu).
func (c *conn) callEnded(id uint32) {
	delete(c.streams, id)
	if c.timers.idle > 0 && c.eng.OpenCalls() == 0 {
		now := time.Now()
		c.lastCall = now
		c.armLocked(now) // the idle timeout runs from now
	}
	if c.slotWaiters > 0 {
		close(c.slot)
		c.slot = make(chan struct{}) // a signal: closed, never sent on, so it holds nothing
	}
	if c.eng.GoingAway() && c.eng.OpenCalls() == 0 {
		c.finishing = true
	}
}

// shutdown closes the socket and fails every call.
func (c *conn) shutdown(err error) {
	c.closeOnce.Do(func() {
		_ = c.nc.Close()
		c.mu.Lock()
		if c.dog != nil {
			c.dog.Stop()
		}
		clear(c.held)
		c.held = nil
		if c.err == nil {
			if err == nil {
				err = errConnClosed
			}
			c.err = err
		}
		c.eng.Shutdown("connection closed: " + c.err.Error())
		c.drain()
		if c.drained != nil {
			close(c.drained)
			c.drained = nil
		}
		c.mu.Unlock()
		close(c.done)
		if c.onClose != nil {
			c.onClose()
		}
	})
}

var errConnClosed = errors.New("connection closed")

// stream is one call's state, shared by client and server; guarded by its conn's mu.
type stream struct {
	c     *conn
	id    uint32
	recvq [][]byte
	costs []uint32
	head  int
	qbuf  [2][]byte // first backing array of recvq (no allocation for short calls)
	cbuf  [2]uint32
	rnote chan struct{} // cap 1: a message or the end arrived
	wnote chan struct{} // cap 1, made on first use: send credit came back

	ended    bool // the call is over; code, msg and trailers are its status
	code     Code
	msg      string
	trailers Metadata

	enc        string // the encoding of the received messages ("" for none, §15)
	remoteDone bool   // server: the client half-closed
	headers    Metadata
	gotHeaders bool
	ss         *ServerStream // server: the stream's owner
}

func (s *stream) init(rnote chan struct{}) {
	s.rnote = rnote
	s.recvq, s.costs = s.qbuf[:0], s.cbuf[:0]
}

// status is the call's end as an error (nil for OK).
func (s *stream) status() *Status {
	return &Status{Code: s.code, Message: s.msg, Trailers: s.trailers}
}

func (s *stream) setEnd(code Code, msg string, trailers Metadata) {
	s.ended, s.code, s.msg, s.trailers = true, code, msg, trailers
	s.notifyRead()
	s.notifyWrite()
}

func (s *stream) notifyRead() {
	select {
	case s.rnote <- struct{}{}:
	default:
	}
}

func (s *stream) notifyWrite() {
	if s.wnote == nil {
		return
	}
	select {
	case s.wnote <- struct{}{}:
	default:
	}
}

// writeNote returns the channel that says send credit came back (under mu).
func (s *stream) writeNote() chan struct{} {
	if s.wnote == nil {
		s.wnote = make(chan struct{}, 1)
	}
	return s.wnote
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
