package wire

import (
	"encoding/binary"
	"errors"
	"time"
)

// Receive hands the engine bytes from the peer. It returns the connection error, if the
// input caused one (the engine then queued ERROR as §10 says and reported Closed).
func (c *Conn) Receive(data []byte, now time.Time) error {
	if c.st == stClosed {
		if c.err != nil {
			return c.err
		}
		return ErrConnClosed
	}
	buf := data
	if len(c.in) > 0 {
		c.in = append(c.in, data...)
		buf = c.in
	}
	return c.receive(buf, len(c.in) > 0, now)
}

// PendingSpace is room in the engine's own input buffer while a large frame is incomplete
// (nil otherwise): a reader can read into it directly and report the count with
// ReceiveInPlace, saving a copy. Only the goroutine that calls Receive may use it.
func (c *Conn) PendingSpace() []byte {
	if c.st == stClosed || len(c.in) == 0 || cap(c.in)-len(c.in) < 64<<10 {
		return nil
	}
	return c.in[len(c.in):cap(c.in)]
}

// ReceiveInPlace is Receive for n bytes read into PendingSpace.
func (c *Conn) ReceiveInPlace(n int, now time.Time) error {
	if c.st == stClosed {
		if c.err != nil {
			return c.err
		}
		return ErrConnClosed
	}
	if n < 0 || len(c.in)+n > cap(c.in) {
		return errors.New("topspin: ReceiveInPlace past PendingSpace")
	}
	c.in = c.in[:len(c.in)+n]
	return c.receive(c.in, true, now)
}

func (c *Conn) receive(buf []byte, fromIn bool, now time.Time) error {
	c.fromIn, c.detached = fromIn, false
	n, err := c.process(buf, now)
	rest := buf[n:]
	if c.detached { // parts of c.in were handed to the application as messages
		c.in = nil
	}
	// Keep what is left of an incomplete frame. Once its header is in, the buffer is made
	// as large as the frame at once (the header was checked against MAX_FRAME_SIZE, the
	// bound protocol.md §9 sets for one frame), so that a large frame is not copied again
	// at every doubling and can be read in place; a buffer over 4 MiB is let go once it
	// is no longer needed. (Split messages, whose total_len is only a claim, grow with
	// what arrives instead, §5.3.)
	if err != nil {
		c.in = nil
		return err
	}
	need := len(rest)
	if (c.st == stSettings || c.st == stOpen) && len(rest) >= HeaderLen {
		need = HeaderLen + int(binary.LittleEndian.Uint32(rest))
	}
	switch {
	case len(rest) == 0 && cap(c.in) > 4<<20:
		c.in = nil
	case cap(c.in) >= need:
		m := copy(c.in[:cap(c.in)], rest)
		c.in = c.in[:m]
	case len(rest) > 0:
		in := make([]byte, len(rest), max(need, 4096))
		copy(in, rest)
		c.in = in
	default:
		c.in = c.in[:0]
	}
	return nil
}

func (c *Conn) process(buf []byte, now time.Time) (int, *Error) {
	off := 0
	for c.st != stClosed {
		if c.st == stPreface {
			avail := buf[off:]
			for i := 0; i < min(7, len(avail)); i++ {
				if avail[i] != Preface[i] {
					return off, c.fail(perr(BadPreface, "the peer did not start with the topspin preface"), true, false)
				}
			}
			if len(avail) < 8 {
				return off, nil
			}
			if avail[7] != Preface[7] {
				return off, c.fail(perr(UnsupportedVersion, "protocol version %d; this peer speaks version 1 only", avail[7]), true, false)
			}
			off += 8
			c.st = stSettings
			continue
		}
		f, n, err := Decode(buf[off:], c.local.MaxFrameSize)
		if err != nil {
			return off, c.fail(err, true, false)
		}
		if n == 0 {
			return off, nil
		}
		off += n
		if err := c.handle(&f, now); err != nil {
			return off, err
		}
	}
	return off, c.err
}
