package wire

import (
	"fmt"
	"slices"
	"unicode/utf8"
)

// StartCall starts a call (client). timeoutUs 0 means no deadline.
func (c *Conn) StartCall(method string, codec uint8, timeoutUs uint64, md Metadata) (uint32, error) {
	if err := c.canStart(); err != nil {
		return 0, err
	}
	if len(method) == 0 || len(method) > MaxMethodName || !utf8.ValidString(method) {
		return 0, &CallError{Code: Internal, Message: "method name must be 1..=1024 bytes of UTF-8"}
	}
	if err := md.Validate(); err != nil {
		return 0, &CallError{Code: Internal, Message: err.Error()}
	}
	f := Frame{Type: TypeCall, Codec: codec, TimeoutUs: timeoutUs, Metadata: md}
	mid, bound := c.interned[method]
	if bound {
		f.MethodID = mid
	} else {
		f.Flags = FlagNamed
		f.MethodName = method
		if c.nextMID <= MaxMethodID {
			f.MethodID = c.nextMID
		}
	}
	room := int(c.peer.MaxFrameSize) - 12
	if f.Named() {
		room -= 2 + len(method)
	}
	if sz := md.Size(); sz > int(c.peer.MaxMetadataSize) || sz > room {
		return 0, &CallError{Code: ResourceExhausted, Message: fmt.Sprintf("request metadata of %d bytes over the server's limit", sz)}
	}
	if f.Named() && f.MethodID != 0 {
		c.interned[method] = f.MethodID
		c.nextMID++
	}
	if f.Metadata == nil {
		f.Metadata = Metadata{}
	}
	c.highest++
	f.CallID = c.highest
	cl := c.newCall(f.CallID)
	c.frame(&f)
	if c.local.InitialCallWindow == 0 {
		c.grant(cl, 1)
	}
	return cl.id, nil
}

// HalfClose says the client sends no more messages.
func (c *Conn) HalfClose(id uint32) error {
	cl, err := c.openCall(id)
	if err != nil {
		return err
	}
	if c.role != Client || cl.localDone {
		return ErrWrongSide
	}
	cl.localDone = true
	if cl.pend != nil {
		cl.queued = &Frame{Type: TypeHalfClose, CallID: id}
		return nil
	}
	c.frame(&Frame{Type: TypeHalfClose, CallID: id})
	return nil
}

// Cancel abandons the call (client) and tells the server with code.
func (c *Conn) Cancel(id uint32, code Code) error {
	cl, err := c.openCall(id)
	if err != nil {
		return err
	}
	if c.role != Client {
		return ErrWrongSide
	}
	cl.pend, cl.queued = nil, nil
	c.frame(&Frame{Type: TypeCancel, CallID: id, Code: uint16(code)})
	c.closeCall(cl)
	return nil
}

// endUnprocessed ends the calls above the server's GOAWAY last call id, in id order.
func (c *Conn) endUnprocessed(last uint32) {
	ids := make([]uint32, 0)
	for id, cl := range c.calls {
		if cl.open && id > last {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		c.endCall(c.calls[id], Unavailable, UnprocessedReason, nil)
	}
}

// recvHeaders takes the response headers: at most once, before any message; headers over
// max_metadata_size cancel the call.
func (c *Conn) recvHeaders(cl *call, f *Frame) *Error {
	if cl.headersIn || cl.messageIn {
		return c.fail(perr(IllegalFrame, "HEADERS on call %d after HEADERS or MESSAGE", cl.id), true, false)
	}
	cl.headersIn = true
	if sz := f.Metadata.Size(); sz > int(c.local.MaxMetadataSize) {
		c.frame(&Frame{Type: TypeCancel, CallID: cl.id, Code: uint16(ResourceExhausted)})
		c.endCall(cl, ResourceExhausted, fmt.Sprintf("response headers of %d bytes over max_metadata_size %d", sz, c.local.MaxMetadataSize), nil)
		return nil
	}
	c.emit(Event{Type: EvHeaders, CallID: cl.id, Metadata: f.Metadata})
	return nil
}

// recvEnd ends the call with the server's status (RESOURCE_EXHAUSTED when the status is
// over max_metadata_size).
func (c *Conn) recvEnd(cl *call, f *Frame) {
	if sz := 2 + len(f.Message) + f.Metadata.Size(); sz > int(c.local.MaxMetadataSize) {
		c.endCall(cl, ResourceExhausted, fmt.Sprintf("END status of %d bytes over max_metadata_size %d", sz, c.local.MaxMetadataSize), nil)
		return
	}
	c.endCall(cl, Code(f.Code).Known(), f.Message, f.Metadata)
}

// canStart reports why a new call cannot start now, if it cannot.
func (c *Conn) canStart() error {
	if c.role != Client {
		return ErrWrongSide
	}
	switch c.st {
	case stClosed:
		return ErrConnClosed
	case stPreface, stSettings:
		return ErrNotReady
	}
	if c.gotGoAway || c.sentGoAway {
		return &CallError{Code: Unavailable, Message: "the connection is going away"}
	}
	if c.peer.MaxConcurrentCalls == 0 {
		return &CallError{Code: Unavailable, Message: "the server takes no new calls (MAX_CONCURRENT_CALLS 0)"}
	}
	if c.open >= int(c.peer.MaxConcurrentCalls) {
		return ErrTooManyCalls
	}
	if c.highest == 1<<32-1 {
		return &CallError{Code: Unavailable, Message: "call ids exhausted on this connection"}
	}
	return nil
}
