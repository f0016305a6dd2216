package wire

import "fmt"

// chunkCredit gives a split chunk's credit back as it arrives (§7) — unless the memory
// budget, or this connection's share of it, is spent: then one split message per
// connection goes on (so that messages that each fit cannot wait for one another for ever,
// §9) and the others' credit is withheld until RetryCredit finds room.
func (c *Conn) chunkCredit(cl *call, cost uint32) {
	if c.share.Spent() && !c.mayProgress(cl) {
		if cl.withheld == 0 {
			c.nWithheld++
		}
		cl.withheld += int64(cost)
		return
	}
	c.grant(cl, cost)
}

// mayProgress reports whether cl is the connection's split message that goes on while the
// budget is spent (the first to ask, until it completes or ends).
func (c *Conn) mayProgress(cl *call) bool {
	if g := c.calls[c.splitGoing]; c.splitGoing != 0 && g != nil && g.open && g.splitOpen {
		return g == cl
	}
	c.splitGoing = cl.id
	return true
}

// CreditWithheld reports whether chunk credit is withheld because the memory budget (or
// the connection's share of it) is spent: call RetryCredit again in a while (every 10 ms, §9).
func (c *Conn) CreditWithheld() bool { return c.nWithheld > 0 }

// RetryCredit gives the withheld chunk credit back where the memory budget allows it now.
func (c *Conn) RetryCredit() {
	if c.nWithheld == 0 || c.st != stOpen {
		return
	}
	for _, cl := range c.calls {
		if cl.withheld == 0 || !cl.open || (c.share.Spent() && !c.mayProgress(cl)) {
			continue
		}
		inc := cl.withheld
		cl.withheld = 0
		c.nWithheld--
		c.grant(cl, uint32(min(inc, MaxWindow)))
	}
}

func (c *Conn) credit(cl *call, f *Frame) *Error {
	if cl.sendCredit+int64(f.Increment) > MaxWindow {
		return c.fail(perr(FlowControl, "CREDIT raises call %d's send credit above 2147483647", cl.id), true, false)
	}
	before := cl.sendCredit
	cl.sendCredit += int64(f.Increment)
	if before <= 0 && cl.sendCredit > 0 {
		c.pump(cl)
		if cl.open && cl.pend == nil {
			c.emit(Event{Type: EvWritable, CallID: cl.id})
		}
	}
	return nil
}

func (c *Conn) grant(cl *call, inc uint32) {
	if inc == 0 {
		return
	}
	if cl.recvCredit+int64(inc) > MaxWindow {
		inc = uint32(MaxWindow - cl.recvCredit)
		if inc == 0 || cl.recvCredit >= MaxWindow {
			return
		}
	}
	cl.recvCredit += int64(inc)
	c.frame(&Frame{Type: TypeCredit, CallID: cl.id, Increment: inc})
}

// ReturnCredit tells the engine the application consumed a message of the call (its
// Event.Cost): credit goes back to the peer, batched until half the window is used.
func (c *Conn) ReturnCredit(id uint32, cost uint32) {
	cl := c.calls[id]
	if cl == nil || !cl.open || c.st != stOpen {
		return
	}
	cl.unreturned += int64(cost)
	if cl.unreturned*2 >= int64(c.local.InitialCallWindow) || cl.recvCredit <= 0 {
		inc := cl.unreturned
		cl.unreturned = 0
		c.grant(cl, uint32(min(inc, MaxWindow)))
	}
}

// GrantCredit sends CREDIT for inc bytes on the call.
func (c *Conn) GrantCredit(id uint32, inc uint32) error {
	cl := c.calls[id]
	if c.st != stOpen {
		return ErrConnClosed
	}
	if cl == nil || !cl.open {
		return ErrCallClosed
	}
	if inc == 0 || inc > MaxWindow {
		return fmt.Errorf("topspin: credit increment %d outside 1..=2147483647", inc)
	}
	c.grant(cl, inc)
	return nil
}

// pump sends as much of a pending split message as credit allows.
func (c *Conn) pump(cl *call) {
	max := int(c.peer.MaxFrameSize)
	for cl.pend != nil && cl.sendCredit > 0 {
		n := min(len(cl.pend), max)
		last := n == len(cl.pend)
		c.appendPayloadFrame(TypeContinuation, 0, cl.id, false, 0, cl.pend[:n])
		cl.sendCredit -= int64(HeaderLen + n)
		if last {
			cl.pend = nil
		} else {
			cl.pend = cl.pend[n:]
		}
	}
	if cl.pend == nil && cl.queued != nil {
		c.frame(cl.queued)
		cl.queued = nil
	}
	if cl.pend == nil && cl.queued == nil && !cl.open {
		c.release(cl)
	}
}
