package wire

import (
	"encoding/binary"
	"errors"
	"time"
)

// bigFrame is a normal read: a frame up to this size gets a buffer of its whole size as
// soon as its header is in; a larger one only while the memory budget has room for it.
const bigFrame = 64 << 10

// Receive hands the engine bytes from the peer. It returns the connection error, if the
// input caused one (the engine then queued ERROR as §10 says and reported Closed).
func (c *Conn) Receive(data []byte, now time.Time) error {
	for len(c.in) > 0 && len(data) > 0 && c.st != stClosed {
		// Complete the frame held in c.in first, without growing it past that frame.
		take := len(data)
		if want := c.frameLen(c.in); want > len(c.in) {
			take = min(take, want-len(c.in))
		}
		c.appendIn(data[:take])
		data = data[take:]
		if err := c.receive(c.in, true, now); err != nil {
			return err
		}
	}
	if c.st == stClosed {
		if c.err != nil {
			return c.err
		}
		return ErrConnClosed
	}
	if len(data) == 0 {
		return nil
	}
	return c.receive(data, false, now)
}

// PendingSpace is room in the engine's own input buffer while a large frame is incomplete
// (nil otherwise): a reader can read into it directly and report the count with
// ReceiveInPlace, saving a copy. Only the goroutine that calls Receive may use it.
func (c *Conn) PendingSpace() []byte {
	if c.st == stClosed || len(c.in) == 0 || cap(c.in)-len(c.in) < bigFrame {
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

// PartialSince reports since when a frame has been partly received (false: none is).
func (c *Conn) PartialSince() (time.Time, bool) { return c.partialAt, !c.partialAt.IsZero() }

// SetMemoryBudget sets the budget the engine charges for frames reserved whole before they
// arrived and for split messages being reassembled (§9); call it before any input. Without
// one (nil, the default) nothing is reserved ahead: every buffer grows as bytes arrive,
// and no call is refused for memory. The connection's split messages hold at most
// 1/ShareOfBudget of it (plus the one message that goes on): past that share their chunk
// credit is withheld as when the whole budget is spent, so that a single peer cannot spend
// the budget and have every other connection's new calls refused.
func (c *Conn) SetMemoryBudget(b *MemoryBudget) {
	c.budget = b
	c.share = ShareOf(b, max(b.Limit()/ShareOfBudget, 1))
}

func (c *Conn) receive(buf []byte, fromIn bool, now time.Time) error {
	c.fromIn, c.detached = fromIn, false
	n, err := c.process(buf, now)
	rest := buf[n:]
	if c.detached { // parts of c.in were handed to the application as messages
		c.dropIn()
	}
	if err != nil {
		c.dropIn()
		c.partialAt = time.Time{}
		return err
	}
	switch {
	case len(rest) == 0:
		c.partialAt = time.Time{}
	case n > 0 || c.partialAt.IsZero(): // a frame completed: the rest is a new one
		c.partialAt = now
	}
	c.keepRest(rest)
	return nil
}

// keepRest keeps what is left of an incomplete frame (rest may be part of c.in). A large
// buffer is let go once it holds nothing.
func (c *Conn) keepRest(rest []byte) {
	want := c.frameLen(rest)
	switch {
	case len(rest) == 0 && (c.inCharge > 0 || cap(c.in) > bigFrame):
		c.dropIn()
	case len(rest) == 0:
		c.in = c.in[:0]
	case cap(c.in) >= max(len(rest), want):
		m := copy(c.in[:cap(c.in)], rest)
		c.in = c.in[:m]
	default:
		in, charge := c.newIn(len(rest), want)
		c.setIn(append(in, rest...), charge)
	}
}

// appendIn appends data to c.in, growing it as newIn says.
func (c *Conn) appendIn(data []byte) {
	if n := len(c.in) + len(data); n > cap(c.in) {
		in, charge := c.newIn(n, c.frameLen(c.in))
		c.setIn(append(in, c.in...), charge)
	}
	c.in = append(c.in, data...)
}

// newIn makes an empty input buffer for n bytes that arrived of a frame of want bytes (0:
// its header is not in yet), and the bytes it charged to the budget. A frame header's
// length is a claim (§9): a large frame gets a buffer of its whole size only if the budget
// has room for it; otherwise the buffer holds at most twice what arrived, and grows as more
// does.
func (c *Conn) newIn(n, want int) ([]byte, int64) {
	size := max(n, 4096)
	switch {
	case want <= size:
	case want <= bigFrame:
		size = want
	case c.budget.TryReserve(int64(want)):
		return make([]byte, 0, want), int64(want)
	default:
		size = min(want, max(2*n, 4096))
	}
	return make([]byte, 0, size), 0
}

// setIn replaces c.in (its charge given back) with in, charged charge bytes.
func (c *Conn) setIn(in []byte, charge int64) {
	c.budget.Release(c.inCharge)
	c.in, c.inCharge = in, charge
}

// dropIn lets go of c.in and its charge.
func (c *Conn) dropIn() { c.setIn(nil, 0) }

// frameLen is the size of the frame starting b (header included), 0 while its header is
// incomplete or before the preface. The header was checked against MAX_FRAME_SIZE.
func (c *Conn) frameLen(b []byte) int {
	if (c.st == stSettings || c.st == stOpen) && len(b) >= HeaderLen {
		return HeaderLen + int(binary.LittleEndian.Uint32(b))
	}
	return 0
}

func (c *Conn) process(buf []byte, now time.Time) (int, *Error) {
	off := 0
	for c.st != stClosed {
		if c.st == stPreface {
			n, err := c.readPreface(buf[off:])
			if err != nil || n == 0 {
				return off, err
			}
			off += n
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

// handle acts on one decoded frame.
func (c *Conn) handle(f *Frame, now time.Time) *Error {
	if c.st == stSettings {
		return c.handshake(f)
	}
	switch f.Type {
	case TypeSettings:
		return c.fail(perr(SettingsError, "second SETTINGS frame"), true, false)
	case TypePing:
		return c.recvPing(f, now)
	case TypeGoAway:
		return c.recvGoAway(f)
	case TypeError:
		return c.fail(&Error{Code: ErrCode(f.Code), Reason: f.Message}, false, false)
	case TypeCall:
		if c.role == Client {
			return c.fail(perr(IllegalFrame, "CALL from the server"), true, false)
		}
		return c.handleCall(f, now)
	}
	if f.Type >= 0x80 {
		return nil // an extension frame: ignored
	}
	return c.handleCallFrame(f, now)
}

// handleCallFrame acts on a frame of a call (not CALL): one from the wrong side is a
// connection error, one for a call that is over is ignored (CREDIT still counts).
func (c *Conn) handleCallFrame(f *Frame, now time.Time) *Error {
	if err := c.checkSender(f); err != nil {
		return err
	}
	if f.CallID > c.highest {
		return c.fail(perr(UnknownCall, "frame type 0x%02x for call %d, never opened", f.Type, f.CallID), true, false)
	}
	cl := c.calls[f.CallID]
	if cl == nil || !cl.open {
		if cl != nil && f.Type == TypeCredit {
			return c.credit(cl, f)
		}
		return nil
	}
	switch f.Type {
	case TypeMessage:
		return c.message(cl, f, now)
	case TypeContinuation:
		return c.continuation(cl, f, now)
	case TypeCredit:
		return c.credit(cl, f)
	case TypeHalfClose:
		return c.recvHalfClose(cl)
	case TypeCancel:
		return c.recvCancel(cl, f, now)
	case TypeHeaders:
		return c.recvHeaders(cl, f)
	case TypeEnd:
		c.recvEnd(cl, f)
	}
	return nil
}

// checkSender fails the connection on a call frame only the other side may send.
func (c *Conn) checkSender(f *Frame) *Error {
	switch f.Type {
	case TypeHeaders, TypeEnd:
		if c.role == Server {
			return c.fail(perr(IllegalFrame, "frame type 0x%02x from the client", f.Type), true, false)
		}
	case TypeHalfClose, TypeCancel:
		if c.role == Client {
			return c.fail(perr(IllegalFrame, "frame type 0x%02x from the server", f.Type), true, false)
		}
	case TypeMessage:
		if c.role == Client && f.EndStream() {
			return c.fail(perr(IllegalFrame, "MESSAGE with END_STREAM from the server"), true, false)
		}
	}
	return nil
}
