package topspin

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"
)

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
		c.roomLocked()
	}
}

// roomLocked wakes those waiting for room in the send buffer, and starts the calls held for
// it, when there is room (under mu).
func (c *conn) roomLocked() {
	if c.fullLocked() {
		return
	}
	if c.drained != nil {
		close(c.drained)
		c.drained = nil
	}
	c.startHeld()
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

// fullLocked reports whether the unsent output and the room reserved for answers being
// encoded (answer.go) reached maxSend (under mu): senders then wait; a server stops reading
// and starting calls (flow control bounds each call; this bounds them all: unsent stays
// under maxSend + one message).
func (c *conn) fullLocked() bool { return c.unsentLocked()+c.reserved >= c.maxSend }

// waitRoom waits, under mu, until the connection's send buffer has room (fullLocked), done
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
