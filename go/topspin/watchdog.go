package topspin

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
)

// timers are a connection's time bounds (0: off). A client keeps only the frame timeout
// here (its keep-alive has a goroutine of its own, its dial is bounded by its context).
type timers struct {
	handshake  time.Duration
	frame      time.Duration
	idle       time.Duration
	kaInterval time.Duration
	kaTimeout  time.Duration
}

// creditRetry is how often withheld chunk credit is looked at again while the memory
// budget is spent (protocol.md §9).
const creditRetry = 10 * time.Millisecond

// startWatchdog arms the timer that enforces the connection's time bounds. One timer per
// connection, set for the earliest bound that applies; no goroutine waits on it.
func (c *conn) startWatchdog() {
	now := time.Now()
	c.mu.Lock()
	c.started, c.lastRecv, c.lastCall = now, now, now
	if !c.acceptedAt.IsZero() {
		c.started = c.acceptedAt // the handshake timeout counts the wait for the first byte
	}
	c.dog = time.AfterFunc(time.Hour, c.onWatchdog)
	c.dog.Stop()
	c.armLocked(now)
	c.mu.Unlock()
}

func (c *conn) onWatchdog() {
	now := time.Now()
	c.mu.Lock()
	c.dogAt = time.Time{}
	if c.eng.Closed() {
		c.mu.Unlock()
		return
	}
	c.checkLocked(now)
	c.drain()
	if !c.eng.Closed() {
		c.armLocked(now)
	}
	wake := c.eng.HasOutput() || c.finishing
	c.mu.Unlock()
	if wake {
		c.signal()
	}
}

// checkLocked acts on the bounds that passed (under mu).
func (c *conn) checkLocked(now time.Time) {
	t := &c.timers
	if !c.eng.Established() {
		if t.handshake > 0 && now.Sub(c.started) >= t.handshake {
			c.eng.Abort(wire.Timeout, fmt.Sprintf("no preface and SETTINGS within %v (handshake timeout)", t.handshake))
		}
		return
	}
	if at, ok := c.frameDeadline(); ok && !now.Before(at) {
		c.eng.Abort(wire.Timeout, fmt.Sprintf("a frame stayed incomplete for %v (frame timeout)", t.frame))
		return
	}
	if at, ok := c.messageDeadline(); ok && !now.Before(at) {
		c.eng.CheckMessages(now)
		if c.eng.Closed() {
			return
		}
	}
	if t.kaInterval > 0 {
		if !c.pingAt.IsZero() && c.lastRecv.After(c.pingAt) {
			c.pingAt = time.Time{} // something arrived: the peer is alive
		}
		switch {
		case !c.pingAt.IsZero() && now.Sub(c.pingAt) >= t.kaTimeout:
			c.eng.Abort(wire.Timeout, fmt.Sprintf("keep-alive PING unanswered for %v (keepalive timeout)", t.kaTimeout))
			return
		case c.pingAt.IsZero() && now.Sub(c.lastRecv) >= t.kaInterval:
			var data [8]byte
			binary.BigEndian.PutUint64(data[:], uint64(now.UnixNano()))
			if c.eng.Ping(data) == nil {
				c.pingAt = now
			}
		}
	}
	if at, ok := c.idleDeadline(); ok && !now.Before(at) {
		_ = c.eng.GoAway(wire.NoError, "idle timeout")
		c.finishing = true
	}
	c.eng.RetryCredit()
}

// armLocked sets the timer for the earliest bound, unless it is set for earlier already.
func (c *conn) armLocked(now time.Time) {
	next := c.nextLocked(now)
	if next.IsZero() || (!c.dogAt.IsZero() && !next.Before(c.dogAt)) || c.dog == nil {
		return
	}
	c.dogAt = next
	c.dog.Reset(next.Sub(now))
}

// nextLocked is when the earliest bound that applies passes (zero: none applies).
func (c *conn) nextLocked(now time.Time) time.Time {
	var next time.Time
	consider := func(at time.Time) {
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	t := &c.timers
	if !c.eng.Established() {
		if t.handshake > 0 {
			consider(c.started.Add(t.handshake))
		}
		return next
	}
	if at, ok := c.frameDeadline(); ok {
		consider(at)
	}
	if at, ok := c.messageDeadline(); ok {
		consider(at)
	}
	if t.kaInterval > 0 {
		if c.pingAt.IsZero() {
			consider(c.lastRecv.Add(t.kaInterval))
		} else {
			consider(c.pingAt.Add(t.kaTimeout))
		}
	}
	if at, ok := c.idleDeadline(); ok {
		consider(at)
	}
	if c.eng.CreditWithheld() {
		consider(now.Add(creditRetry))
	}
	return next
}

// frameDeadline is when the frame being received must be complete. It does not run while
// the reader waits for the peer to read (the frame then stalls because of us).
func (c *conn) frameDeadline() (time.Time, bool) {
	since, ok := c.eng.PartialSince()
	if !ok || c.timers.frame <= 0 || c.readPaused {
		return time.Time{}, false
	}
	if c.resumedAt.After(since) {
		since = c.resumedAt
	}
	return since.Add(c.timers.frame), true
}

// messageDeadline is when a split message that gets no chunk times out (the frame timeout,
// wire.Conn.CheckMessages). As frameDeadline, it does not run while the reader waits for
// the peer to read.
func (c *conn) messageDeadline() (time.Time, bool) {
	at, ok := c.eng.MessageDeadline()
	if !ok || c.readPaused {
		return time.Time{}, false
	}
	if resumed := c.resumedAt.Add(c.timers.frame); resumed.After(at) {
		at = resumed
	}
	return at, true
}

// idleDeadline is when the connection, without an open call since lastCall, goes away.
func (c *conn) idleDeadline() (time.Time, bool) {
	if c.timers.idle <= 0 || c.eng.OpenCalls() > 0 || len(c.held) > 0 || c.eng.GoingAway() {
		return time.Time{}, false
	}
	return c.lastCall.Add(c.timers.idle), true
}
