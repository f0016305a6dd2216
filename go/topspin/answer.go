package topspin

import (
	"context"
	"errors"

	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/protobuf/proto"
)

// reserveMin is the size from which a server's answer takes its room in the send buffer
// before it is encoded (or compressed): handlers run on worker goroutines, so the calls of one
// read are all under way before any answer is queued, and counted only once queued, every
// one of them would encode its answer and hold it while the peer does not read. Reserved
// first, at most one answer goes past the buffer (as in Rust, where a handler that answers at
// once is applied only while there is room); the others wait before they allocate. Smaller
// answers are encoded first: at most MAX_CONCURRENT_CALLS × 4 KiB (4 MiB by default) per
// connection, and no lock more on the fast path.
const reserveMin = 4 << 10

// sendMsg encodes m (protobuf) and sends it; with end, END OK follows (unary answers). On the
// native face an answer of reserveMin bytes or more first waits for room in the send buffer
// and takes it, so that a peer that does not read holds the buffer and one encoded answer.
func (ss *ServerStream) sendMsg(m proto.Message, end bool) error {
	if ss.g != nil {
		b, err := proto.Marshal(m)
		if err != nil {
			return &Status{Code: Internal, Message: "marshal: " + err.Error()}
		}
		return ss.g.send(b)
	}
	n, reserved := proto.Size(m), 0
	if n >= reserveMin {
		if err := ss.reserve(n); err != nil {
			return err
		}
		reserved = n
	}
	b, err := proto.MarshalOptions{UseCachedSize: true}.Marshal(m) // sized just above
	if err != nil {
		ss.unreserve(reserved)
		return &Status{Code: Internal, Message: "marshal: " + err.Error()}
	}
	return ss.queue(b, end, reserved)
}

// send queues msg; with end, END OK follows in the same write (unary answers).
func (ss *ServerStream) send(msg []byte, end bool) error {
	if ss.g != nil {
		return ss.g.send(msg)
	}
	reserved := 0
	if ss.respEnc != "" && len(msg) >= reserveMin {
		// Room before the compressed copy is made.
		if err := ss.reserve(len(msg)); err != nil {
			return err
		}
		reserved = len(msg)
	}
	return ss.queue(msg, end, reserved)
}

// endedErr is the error of a send on a call that ended (under mu).
func (ss *ServerStream) endedErr() error {
	if ss.s.code == OK {
		return &Status{Code: FailedPrecondition, Message: "send after the call ended"}
	}
	return ss.s.status()
}

// reserve waits until the connection's send buffer has room (its unsent and reserved bytes
// under maxSend), then counts n bytes of it as taken by an answer about to be encoded.
func (ss *ServerStream) reserve(n int) error {
	c := ss.s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if ss.s.ended {
			return ss.endedErr()
		}
		if !c.fullLocked() || c.eng.Closed() { // closed: queueing reports it
			c.reserved += n
			return nil
		}
		if !c.waitRoom(ss.doneLocked()) && !ss.s.ended && ss.err != nil {
			return StatusOf(ss.err)
		} // else the call or the connection ended: reported above
	}
}

// unreserve gives back n reserved bytes whose answer is not queued.
func (ss *ServerStream) unreserve(n int) {
	if n == 0 {
		return
	}
	c := ss.s.c
	c.mu.Lock()
	c.reserved -= n
	c.roomLocked()
	c.mu.Unlock()
}

// queue compresses msg (the response encoding) and queues it; reserved: the room reserve
// took for it, now its own (it goes into the buffer without waiting), 0 for none.
func (ss *ServerStream) queue(msg []byte, end bool, reserved int) error {
	c := ss.s.c
	if ss.respEnc != "" {
		var err error
		if msg, err = wire.Compress(ss.respEnc, msg); err != nil {
			ss.unreserve(reserved)
			return &Status{Code: Internal, Message: "compress: " + err.Error()}
		}
	}
	for {
		c.mu.Lock()
		roomTaken := reserved > 0
		if roomTaken {
			// The reservation becomes the queued message (or is given back below).
			c.reserved -= reserved
			reserved = 0
		}
		if ss.s.ended {
			c.roomLocked()
			c.mu.Unlock()
			return ss.endedErr()
		}
		if !roomTaken && c.fullLocked() && !c.waitRoom(ss.doneLocked()) {
			c.mu.Unlock()
			continue // the call or the connection ended: reported above
		}
		if ss.hdrSet {
			if err := c.eng.SendHeaders(ss.s.id, ss.header); err != nil {
				c.roomLocked()
				c.mu.Unlock()
				return StatusOf(err)
			}
			ss.hdrSet = false
		}
		err := c.eng.SendMessage(ss.s.id, msg, false)
		if err == nil {
			if end {
				ss.endLocked(OK, "", nil, nil)
				ss.cancelLocked(context.Canceled)
			}
			c.sendLocked()
			return nil
		}
		c.roomLocked() // not queued: its room goes back (it waits for room again after credit)
		if !errors.Is(err, wire.ErrBlocked) {
			c.mu.Unlock()
			return StatusOf(err)
		}
		wn := ss.s.writeNote()
		if ss.err != nil {
			c.mu.Unlock()
			return StatusOf(ss.err)
		}
		c.mu.Unlock()
		<-wn // credit came back, or the call ended (cancelLocked notifies)
	}
}
