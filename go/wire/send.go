package wire

import (
	"fmt"
	"net"
)

// OutputLen is the number of bytes waiting to be sent.
func (c *Conn) OutputLen() int {
	n := len(c.out) - c.segAt
	for _, s := range c.segs {
		n += len(s)
	}
	return n
}

// HasOutput reports whether bytes are waiting to be sent.
func (c *Conn) HasOutput() bool { return len(c.segs) > 0 || len(c.out) > c.segAt }

// TakeOutput appends every queued byte slice to bufs and returns it, and the backing buffer
// of the small frames. Once written, give that buffer back as spare (any []byte, or nil).
func (c *Conn) TakeOutput(bufs net.Buffers, spare []byte) (net.Buffers, []byte) {
	bufs = append(bufs, c.segs...)
	if len(c.out) > c.segAt {
		bufs = append(bufs, c.out[c.segAt:])
	}
	clear(c.segs)
	c.segs = c.segs[:0]
	backing := c.out
	c.out, c.segAt = spare[:0], 0
	c.pingQueued = false
	return bufs, backing
}

func (c *Conn) frame(f *Frame) { c.out = Append(c.out, f) }

// appendPayloadFrame writes a MESSAGE or CONTINUATION, referencing large payloads.
func (c *Conn) appendPayloadFrame(typ, flags uint8, id uint32, split bool, total uint32, chunk []byte) {
	n := len(chunk)
	if split {
		n += 4
	}
	c.out = AppendHeader(c.out, uint32(n), typ, flags, id)
	if split {
		c.out = append(c.out, byte(total), byte(total>>8), byte(total>>16), byte(total>>24))
	}
	if len(chunk) >= c.CopyThreshold && c.CopyThreshold > 0 {
		c.segs = append(c.segs, c.out[c.segAt:], chunk)
		c.segAt = len(c.out)
		return
	}
	c.out = append(c.out, chunk...)
}

func (c *Conn) openCall(id uint32) (*call, error) {
	if c.st != stOpen {
		return nil, ErrConnClosed
	}
	cl := c.calls[id]
	if cl == nil || !cl.open {
		return nil, ErrCallClosed
	}
	return cl, nil
}

// CanSend reports whether SendMessage would be accepted now on the call.
func (c *Conn) CanSend(id uint32) bool {
	cl := c.calls[id]
	return cl != nil && cl.open && cl.pend == nil && cl.sendCredit > 0
}

// SendMessage sends one message on the call; endStream (client only) half-closes after it.
// It returns ErrBlocked when the call's send credit is not above zero. A message of at least
// CopyThreshold bytes is referenced until TakeOutput's buffers are written.
func (c *Conn) SendMessage(id uint32, msg []byte, endStream bool) error {
	cl, err := c.openCall(id)
	if err != nil {
		return err
	}
	if cl.localDone || (endStream && c.role == Server) {
		return ErrWrongSide
	}
	if cl.pend != nil || cl.sendCredit <= 0 {
		return ErrBlocked
	}
	if uint64(len(msg)) > uint64(c.peer.MaxMessageSize) {
		return &CallError{Code: ResourceExhausted, Message: fmt.Sprintf("message of %d bytes over the peer's limit of %d bytes (max_message_size)", len(msg), c.peer.MaxMessageSize)}
	}
	cl.answered = true
	var flags uint8
	if endStream {
		flags = FlagEndStream
		cl.localDone = true
	}
	max := int(c.peer.MaxFrameSize)
	if len(msg) <= max {
		c.appendPayloadFrame(TypeMessage, flags, id, false, 0, msg)
		cl.sendCredit -= int64(HeaderLen + len(msg))
		return nil
	}
	n := max - 4
	c.appendPayloadFrame(TypeMessage, flags|FlagSplit, id, true, uint32(len(msg)), msg[:n])
	cl.sendCredit -= int64(HeaderLen + 4 + n)
	cl.pend = msg[n:]
	c.pump(cl)
	return nil
}
