package wire

import (
	"fmt"
	"time"
)

func (c *Conn) message(cl *call, f *Frame, now time.Time) *Error {
	if c.role == Server && cl.remoteDone {
		return c.fail(perr(IllegalFrame, "MESSAGE on call %d after the client's half-close", cl.id), true, false)
	}
	if cl.splitOpen {
		return c.fail(perr(MessageLengthMismatch, "MESSAGE on call %d while a split message is open", cl.id), true, false)
	}
	if cl.recvCredit <= 0 {
		return c.fail(perr(FlowControl, "MESSAGE on call %d without send credit", cl.id), true, false)
	}
	cost := int64(HeaderLen + len(f.Chunk))
	if f.Split() {
		cost += 4
	}
	cl.recvCredit -= cost
	size := uint32(len(f.Chunk))
	if f.Split() {
		if uint64(len(f.Chunk)) >= uint64(f.TotalLen) {
			return c.fail(perr(MessageLengthMismatch, "SPLIT MESSAGE on call %d whose chunk holds all of total_len %d", cl.id, f.TotalLen), true, false)
		}
		size = f.TotalLen
	}
	cl.messageIn = true
	if size > c.local.MaxMessageSize {
		c.tooLarge(cl, size)
		return nil
	}
	if !f.Split() {
		var msg []byte
		if c.fromIn && len(f.Chunk) >= 64<<10 {
			// A large frame assembled in c.in: hand its memory over instead of copying.
			msg = f.Chunk[:len(f.Chunk):len(f.Chunk)]
			c.detached = true
		} else {
			msg = c.carve(len(f.Chunk))
			copy(msg, f.Chunk)
		}
		c.emit(Event{Type: EvMessage, CallID: cl.id, Message: msg, Cost: uint32(cost)})
		if f.EndStream() {
			cl.remoteDone = true
			c.emit(Event{Type: EvHalfClosed, CallID: cl.id})
		}
		return nil
	}
	cl.splitOpen, cl.splitTotal, cl.splitEnd = true, f.TotalLen, f.EndStream()
	c.splitAppend(cl, f.Chunk)
	c.chunkCredit(cl, uint32(cost))
	c.messageProgressed(now)
	return nil
}

// Small messages are cut from a block of their own rather than allocated one by one: a
// block is never written again once a message is cut from it, so a message handed out stays
// valid for as long as it is kept (and keeps its block, at most carveBlock bytes, alive).
const (
	carveMax   = 1 << 10
	carveBlock = 8 << 10
)

// carve returns n bytes for a message's copy.
func (c *Conn) carve(n int) []byte {
	if n > carveMax || n == 0 {
		return make([]byte, n)
	}
	if len(c.block) < n {
		c.block = make([]byte, carveBlock)
	}
	m := c.block[:n:n]
	c.block = c.block[n:]
	return m
}

func (c *Conn) tooLarge(cl *call, size uint32) {
	msg := fmt.Sprintf("message of %d bytes over the limit of %d bytes (max_message_size)", size, c.local.MaxMessageSize)
	if c.role == Server {
		c.frame(&Frame{Type: TypeEnd, CallID: cl.id, Code: uint16(ResourceExhausted), Message: CutText(msg, int(c.statusRoom())-4), Metadata: Metadata{}})
	} else {
		c.frame(&Frame{Type: TypeCancel, CallID: cl.id, Code: uint16(ResourceExhausted)})
	}
	c.endCall(cl, ResourceExhausted, msg, nil)
}

func (c *Conn) continuation(cl *call, f *Frame, now time.Time) *Error {
	if !cl.splitOpen {
		return c.fail(perr(MessageLengthMismatch, "CONTINUATION on call %d with no split message open", cl.id), true, false)
	}
	if cl.recvCredit <= 0 {
		return c.fail(perr(FlowControl, "CONTINUATION on call %d without send credit", cl.id), true, false)
	}
	cost := int64(HeaderLen + len(f.Chunk))
	cl.recvCredit -= cost
	if uint64(len(cl.split))+uint64(len(f.Chunk)) > uint64(cl.splitTotal) {
		return c.fail(perr(MessageLengthMismatch, "CONTINUATION on call %d goes past total_len %d", cl.id, cl.splitTotal), true, false)
	}
	c.splitAppend(cl, f.Chunk)
	if uint32(len(cl.split)) < cl.splitTotal {
		c.chunkCredit(cl, uint32(cost))
		c.messageProgressed(now)
		return nil
	}
	msg := cl.split
	c.dropSplit(cl) // the message is the application's now
	cl.splitOpen = false
	c.emit(Event{Type: EvMessage, CallID: cl.id, Message: msg, Cost: uint32(cost)})
	if cl.splitEnd {
		cl.remoteDone = true
		c.emit(Event{Type: EvHalfClosed, CallID: cl.id})
	}
	return nil
}

// splitAppend appends a chunk to the call's split message (the caller checked it stays
// within total_len). The buffer grows as chunks arrive, to at most twice what arrived
// (never to total_len, a claim, §5.3), and its growth is charged to the memory budget.
func (c *Conn) splitAppend(cl *call, chunk []byte) {
	need := len(cl.split) + len(chunk)
	if need > cap(cl.split) {
		size := int(min(uint64(cl.splitTotal), uint64(2*need)))
		grown := make([]byte, len(cl.split), size)
		copy(grown, cl.split)
		c.share.Charge(int64(size) - cl.splitCharge)
		cl.split, cl.splitCharge = grown, int64(size)
	}
	cl.split = append(cl.split, chunk...)
}

// dropSplit forgets the call's split buffer and gives its charge back.
func (c *Conn) dropSplit(cl *call) {
	c.share.Release(cl.splitCharge)
	cl.split, cl.splitCharge = nil, 0
	if c.splitGoing == cl.id {
		c.splitGoing = 0
	}
}

// SetMessageTimeout bounds how long a split message may get no chunk while this side
// gives it credit (the frame timeout, §9): past it, CheckMessages closes the connection
// with TIMEOUT. 0 (the default) turns the bound off.
func (c *Conn) SetMessageTimeout(d time.Duration) { c.messageTimeout = max(d, 0) }

// messageProgressed: a chunk of a split message that is still incomplete arrived, its
// timeout starts again.
func (c *Conn) messageProgressed(now time.Time) {
	if c.messageTimeout > 0 {
		c.messageDue = now.Add(c.messageTimeout)
	}
}

// MessageDeadline is when CheckMessages must next run (false: no split message is timed).
func (c *Conn) MessageDeadline() (time.Time, bool) {
	if c.messageTimeout <= 0 || c.messageDue.IsZero() || c.st != stOpen {
		return time.Time{}, false
	}
	return c.messageDue, true
}

// CheckMessages closes the connection with TIMEOUT when split messages are open and none
// got a chunk for the message timeout while this side gave credit; while all their credit
// is withheld (the memory budget's doing, not the peer's) their time starts again.
func (c *Conn) CheckMessages(now time.Time) {
	if c.messageTimeout <= 0 || c.messageDue.IsZero() || c.st != stOpen || now.Before(c.messageDue) {
		return
	}
	open, credited := false, false
	for _, cl := range c.calls {
		if cl.open && cl.splitOpen {
			open = true
			credited = credited || cl.withheld == 0
		}
	}
	switch {
	case !open:
		c.messageDue = time.Time{}
	case !credited:
		c.messageDue = now.Add(c.messageTimeout)
	default:
		c.fail(perr(Timeout, "a split message got no chunk for %v (frame timeout)", c.messageTimeout), true, false)
	}
}
