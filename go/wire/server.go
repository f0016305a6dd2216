package wire

import (
	"fmt"
	"time"
	"unicode/utf8"
)

// handleCall takes a CALL (server): a new call id, a method bound or named (§5.2), then
// the call opens unless it comes after our GOAWAY or is refused.
func (c *Conn) handleCall(f *Frame, now time.Time) *Error {
	if f.CallID <= c.highest {
		return c.fail(perr(DuplicateCall, "CALL %d not above the highest call id %d", f.CallID, c.highest), true, false)
	}
	c.highest = f.CallID
	if c.gotGoAway {
		return c.fail(perr(IllegalFrame, "CALL %d after the client's own GOAWAY", f.CallID), true, false)
	}
	method, err := c.bindMethod(f)
	if err != nil {
		return err
	}
	if c.sentGoAway && f.CallID > c.sentLast {
		return nil
	}
	if refused, err := c.refuse(f, now); refused || err != nil {
		return err
	}
	cl := c.newCall(f.CallID)
	c.emit(Event{Type: EvCallStarted, CallID: cl.id, Method: method, Codec: f.Codec,
		TimeoutUs: f.TimeoutUs, Metadata: f.Metadata})
	if c.local.InitialCallWindow == 0 {
		c.grant(cl, 1)
	}
	return nil
}

// SendHeaders sends the response headers (server), at most once, before any message.
func (c *Conn) SendHeaders(id uint32, md Metadata) error {
	cl, err := c.openCall(id)
	if err != nil {
		return err
	}
	if c.role != Server || cl.answered {
		return ErrWrongSide
	}
	if err := md.Validate(); err != nil {
		return &CallError{Code: Internal, Message: err.Error()}
	}
	if sz := md.Size(); sz > int(c.peer.MaxMetadataSize) || sz > int(c.peer.MaxFrameSize) {
		return &CallError{Code: ResourceExhausted, Message: fmt.Sprintf("response headers of %d bytes over the client's limit", sz)}
	}
	if md == nil {
		md = Metadata{}
	}
	cl.answered, cl.headersOut = true, true
	c.frame(&Frame{Type: TypeHeaders, CallID: id, Metadata: md})
	return nil
}

func (c *Conn) statusRoom() uint32 {
	return min(c.peer.MaxMetadataSize, c.peer.MaxFrameSize-2)
}

// EndCall ends the call with a status (server). A status over the client's limits keeps its
// code, drops the trailers and has its message cut (§5.6, §9).
func (c *Conn) EndCall(id uint32, code Code, msg string, trailers Metadata) error {
	cl, err := c.openCall(id)
	if err != nil {
		return err
	}
	if c.role != Server {
		return ErrWrongSide
	}
	if trailers.Validate() != nil {
		trailers = nil
	}
	if !utf8.ValidString(msg) {
		msg = string([]rune(msg))
	}
	room := int(c.statusRoom())
	if 2+len(msg)+trailers.Size() > room {
		trailers = nil
		msg = CutText(msg, room-4)
	}
	if trailers == nil {
		trailers = Metadata{}
	}
	f := Frame{Type: TypeEnd, CallID: id, Code: uint16(code), Message: msg, Metadata: trailers}
	cl.answered, cl.localDone = true, true
	if cl.pend != nil {
		q := f
		cl.queued = &q
	} else {
		c.frame(&f)
	}
	c.closeCall(cl)
	return nil
}

// recvHalfClose takes the client's half-close (once, not inside a split message).
func (c *Conn) recvHalfClose(cl *call) *Error {
	if cl.remoteDone {
		return c.fail(perr(IllegalFrame, "HALF_CLOSE on call %d after its half-close", cl.id), true, false)
	}
	if cl.splitOpen {
		return c.fail(perr(MessageLengthMismatch, "HALF_CLOSE on call %d inside a split message", cl.id), true, false)
	}
	cl.remoteDone = true
	c.emit(Event{Type: EvHalfClosed, CallID: cl.id})
	return nil
}

// recvCancel ends the call the client cancelled; cancels of calls not yet answered count
// against the rapid-reset budget (§9).
func (c *Conn) recvCancel(cl *call, f *Frame, now time.Time) *Error {
	if !cl.answered && !c.resetBucket.take(now) {
		return c.fail(perr(EnhanceYourCalm, "too_many_resets"), true, true)
	}
	c.endCall(cl, Code(f.Code).Known(), "cancelled by the client", nil)
	return nil
}

// bindMethod resolves the CALL's method: a NAMED CALL names it (binding its method id, if
// any), an unnamed one uses a method id bound before.
func (c *Conn) bindMethod(f *Frame) (string, *Error) {
	if !f.Named() {
		if f.MethodID == 0 || f.MethodID > MaxMethodID {
			return "", c.fail(perr(MethodIDError, "unnamed CALL with method id %d (1..=1023 required)", f.MethodID), true, false)
		}
		m, ok := c.methods[f.MethodID]
		if !ok {
			return "", c.fail(perr(MethodIDError, "method id %d is not bound", f.MethodID), true, false)
		}
		return m, nil
	}
	if f.MethodID > MaxMethodID {
		return "", c.fail(perr(MethodIDError, "NAMED CALL binds method id %d above 1023", f.MethodID), true, false)
	}
	if f.MethodID != 0 {
		if _, ok := c.methods[f.MethodID]; ok {
			return "", c.fail(perr(MethodIDError, "method id %d is already bound", f.MethodID), true, false)
		}
		c.methods[f.MethodID] = f.MethodName
	}
	return f.MethodName, nil
}

// refuse ends a CALL at once with RESOURCE_EXHAUSTED when its metadata is too large, the
// concurrent calls are at MAX_CONCURRENT_CALLS (within the refused-call budget, §9) or the
// memory budget is spent. It reports whether it did.
func (c *Conn) refuse(f *Frame, now time.Time) (bool, *Error) {
	var msg string
	switch sz := f.Metadata.Size(); {
	case sz > int(c.local.MaxMetadataSize):
		msg = fmt.Sprintf("request metadata of %d bytes over max_metadata_size %d", sz, c.local.MaxMetadataSize)
	case c.open >= int(c.local.MaxConcurrentCalls):
		if !c.refuseBucket.take(now) {
			return true, c.fail(perr(EnhanceYourCalm, "too_many_refused_calls"), true, true)
		}
		msg = "too many concurrent calls"
	case c.budget.Spent():
		msg = fmt.Sprintf("process memory budget for incoming messages exhausted (%d bytes)", c.budget.Limit())
	default:
		return false, nil
	}
	c.frame(&Frame{Type: TypeEnd, CallID: f.CallID, Code: uint16(ResourceExhausted), Message: msg, Metadata: Metadata{}})
	return true, nil
}
