package topspin

import (
	"crypto/tls"
	"errors"
	"net"
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
	reserved int   // server: room taken by answers being encoded (answer.go), counted as unsent
	held     []job // server: calls that arrived while the send buffer was full; at most MaxConcurrentCalls (each is an open call of streams, which the engine caps)

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
	eng.SetMessageTimeout(o.frameTimeout)
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
