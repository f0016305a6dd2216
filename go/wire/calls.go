package wire

import "slices"

func (c *Conn) closeCalls(code Code, msg string) {
	ids := make([]uint32, 0, len(c.calls))
	for id, cl := range c.calls {
		if cl.open {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		c.endCall(c.calls[id], code, msg, nil)
	}
	clear(c.calls)
	c.free = nil
	c.open, c.nWithheld, c.splitGoing = 0, 0, 0
}

// endCall closes a call and reports it (Ended on a client, Cancelled on a server).
func (c *Conn) endCall(cl *call, code Code, msg string, trailers Metadata) {
	id := cl.id
	c.closeCall(cl)
	t := EvEnded
	if c.role == Server {
		t = EvCancelled
	}
	c.emit(Event{Type: t, CallID: id, Code: code, Text: msg, Metadata: trailers})
}

func (c *Conn) closeCall(cl *call) {
	if cl.open {
		cl.open = false
		c.open--
	}
	c.dropSplit(cl)
	if cl.withheld > 0 {
		cl.withheld = 0
		c.nWithheld--
	}
	if cl.pend == nil && cl.queued == nil {
		c.release(cl)
	}
}

// newCall makes an open call, reusing a released one.
func (c *Conn) newCall(id uint32) *call {
	var cl *call
	if n := len(c.free); n > 0 {
		cl = c.free[n-1]
		c.free = c.free[:n-1]
	} else {
		cl = new(call)
	}
	*cl = call{id: id, open: true, recvCredit: int64(c.local.InitialCallWindow),
		sendCredit: int64(c.peer.InitialCallWindow)}
	c.calls[id] = cl
	c.open++
	return cl
}

// release forgets a call that is over and keeps its memory for the next one.
func (c *Conn) release(cl *call) {
	delete(c.calls, cl.id)
	if len(c.free) < 64 {
		c.free = append(c.free, cl)
	}
}
