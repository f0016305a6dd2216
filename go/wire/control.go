package wire

import "time"

// fail closes the connection with err; send: queue ERROR (after GOAWAY if calm).
func (c *Conn) fail(err *Error, send, calm bool) *Error {
	if c.st == stClosed {
		return c.err
	}
	if calm {
		c.frame(&Frame{Type: TypeGoAway, LastCallID: c.highest, Code: uint16(err.Code),
			Message: CutText(err.Reason, int(c.peer.MaxFrameSize)-8)})
	}
	if send {
		c.frame(&Frame{Type: TypeError, Code: uint16(err.Code),
			Message: CutText(err.Reason, int(c.peer.MaxFrameSize)-4)})
	}
	c.closeCalls(Unavailable, "connection error: "+err.Error())
	c.dropIn()
	c.st = stClosed
	c.err = err
	c.emit(Event{Type: EvClosed, Err: err})
	return err
}

// Ping sends a PING; its answer is reported as Pong.
func (c *Conn) Ping(data [8]byte) error {
	if c.st != stOpen {
		return ErrNotReady
	}
	c.pingsOut++
	c.frame(&Frame{Type: TypePing, Data: data})
	return nil
}

// GoAway starts a graceful shutdown: a server finishes calls up to the highest id received
// and refuses later ones; a client starts no new call.
func (c *Conn) GoAway(code ErrCode, reason string) error {
	if c.st != stOpen {
		return ErrConnClosed
	}
	if c.sentGoAway {
		return nil
	}
	c.sentGoAway, c.sentLast = true, c.highest
	c.frame(&Frame{Type: TypeGoAway, LastCallID: c.highest, Code: uint16(code),
		Message: CutText(reason, int(c.peer.MaxFrameSize)-8)})
	return nil
}

// Abort closes the connection with a local connection error (for example a handshake
// timeout), queueing ERROR for the peer.
func (c *Conn) Abort(code ErrCode, reason string) {
	c.fail(&Error{Code: code, Reason: reason}, true, false)
}

// Shutdown closes the connection without error (the transport ended): open calls end
// with UNAVAILABLE and Closed is reported.
func (c *Conn) Shutdown(reason string) {
	if c.st == stClosed {
		return
	}
	c.closeCalls(Unavailable, reason)
	c.dropIn()
	c.st = stClosed
	c.emit(Event{Type: EvClosed})
}

// recvPing answers a PING (one answer queued at a time) or takes a PING ACK, within the
// local PING budget (§9).
func (c *Conn) recvPing(f *Frame, now time.Time) *Error {
	if f.Ack() {
		if c.pingsOut > 0 {
			c.pingsOut--
			c.emit(Event{Type: EvPong, Data: f.Data})
		}
		return nil
	}
	if !c.pingBucket.take(now) {
		return c.fail(perr(EnhanceYourCalm, "too_many_pings"), true, true)
	}
	if !c.pingQueued {
		c.frame(&Frame{Type: TypePing, Flags: FlagAck, Data: f.Data})
		c.pingQueued = true
	}
	return nil
}

// recvGoAway takes the peer's GOAWAY: a later one may only lower last_call_id. A client
// ends its calls above it (never processed: safe to retry).
func (c *Conn) recvGoAway(f *Frame) *Error {
	if c.gotGoAway && f.LastCallID > c.gotLast {
		return c.fail(perr(IllegalFrame, "GOAWAY raises last_call_id from %d to %d", c.gotLast, f.LastCallID), true, false)
	}
	if c.gotGoAway && f.LastCallID == c.gotLast {
		return nil
	}
	c.gotGoAway, c.gotLast = true, f.LastCallID
	c.emit(Event{Type: EvGoAway, LastCall: f.LastCallID, ErrCode: ErrCode(f.Code), Text: f.Message})
	if c.role == Client {
		c.endUnprocessed(f.LastCallID)
	}
	return nil
}
