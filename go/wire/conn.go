package wire

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"time"
	"unicode/utf8"
)

// Role is the side of a connection: the client opened it and starts calls.
type Role uint8

// The two roles.
// UnprocessedReason is the UNAVAILABLE message of a call the server's GOAWAY says it never
// processed (its id is above the GOAWAY's last call): such a call is safe to send again, even
// when it is not idempotent (protocol.md, GOAWAY), and clients retry it once, transparently.
const UnprocessedReason = "the server went away before processing the call (safe to retry)"

const (
	Client Role = iota
	Server
)

// EventType says what happened.
type EventType uint8

// Event types, named as in the connection API of the vectors' README.
const (
	EvEstablished EventType = iota + 1
	EvCallStarted
	EvHeaders
	EvMessage
	EvHalfClosed
	EvEnded
	EvCancelled
	EvWritable
	EvPong
	EvGoAway
	EvClosed
)

// Event is something the engine reports to the application.
type Event struct {
	Type      EventType
	CallID    uint32
	Method    string   // CallStarted
	Codec     uint8    // CallStarted
	TimeoutUs uint64   // CallStarted
	Metadata  Metadata // CallStarted, Headers; trailers for Ended
	Message   []byte   // Message: the whole message, owned by the application
	Cost      uint32   // Message: credit to return with ReturnCredit once consumed
	Code      Code     // Ended, Cancelled
	Text      string   // Ended, Cancelled: the status message; GoAway: reason
	LastCall  uint32   // GoAway
	ErrCode   ErrCode  // GoAway
	Data      [8]byte  // Pong
	Err       *Error   // Closed: nil when the connection closed without error
}

// Limits are the local flood budgets (§9 "Local limits"). A zero Per disables refilling.
type Limits struct {
	PingBurst        int
	PingPer          time.Duration
	RapidResetBurst  int
	RapidResetPer    time.Duration
	RefusedCallBurst int
	RefusedCallPer   time.Duration
}

// DefaultLimits are protocol.md's RECOMMENDED limits.
func DefaultLimits() Limits {
	return Limits{PingBurst: 20, PingPer: 100 * time.Millisecond,
		RapidResetBurst: 1000, RapidResetPer: time.Millisecond,
		RefusedCallBurst: 100, RefusedCallPer: 10 * time.Millisecond}
}

type bucket struct {
	tokens float64
	burst  float64
	per    time.Duration
	last   time.Time
}

func newBucket(burst int, per time.Duration) bucket {
	return bucket{tokens: float64(burst), burst: float64(burst), per: per}
}

func (b *bucket) take(now time.Time) bool {
	if b.per > 0 && !b.last.IsZero() && now.After(b.last) {
		b.tokens = min(b.burst, b.tokens+float64(now.Sub(b.last))/float64(b.per))
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Errors of commands.
var (
	// ErrBlocked: the call's send credit is not above zero (or a split message is still
	// going out); wait for a Writable event and try again.
	ErrBlocked = errors.New("topspin: send credit exhausted, wait for Writable")
	// ErrNotReady: the peer's SETTINGS have not arrived yet.
	ErrNotReady = errors.New("topspin: handshake not complete")
	// ErrTooManyCalls: the peer's MAX_CONCURRENT_CALLS are open; wait for a call to end.
	ErrTooManyCalls = errors.New("topspin: peer's MAX_CONCURRENT_CALLS reached")
	// ErrCallClosed: the call is not open (ended, cancelled or unknown).
	ErrCallClosed = errors.New("topspin: call is not open")
	// ErrConnClosed: the connection is closed.
	ErrConnClosed = errors.New("topspin: connection closed")
	// ErrWrongSide: the command is not for this side or this state of the call.
	ErrWrongSide = errors.New("topspin: command not allowed here")
)

type state uint8

const (
	stPreface state = iota
	stSettings
	stOpen
	stClosed
)

type call struct {
	id   uint32
	open bool

	recvCredit int64 // the peer's send credit, as we count it
	unreturned int64 // consumed bytes not yet granted back
	remoteDone bool  // server: the client half-closed
	headersIn  bool  // client: HEADERS received
	messageIn  bool  // client: a MESSAGE received
	split      []byte
	splitOpen  bool
	splitTotal uint32
	splitEnd   bool
	// splitCharge: bytes of split charged to the memory budget; withheld: chunk credit
	// not given back while the budget is spent.
	splitCharge int64
	withheld    int64

	sendCredit int64
	answered   bool // server: HEADERS, MESSAGE or END sent
	headersOut bool
	localDone  bool // client: half-closed; server: END queued
	pend       []byte
	queued     *Frame // HALF_CLOSE or END waiting behind the pending message
}

// Conn is one connection's protocol engine, sans I/O. It is not safe for concurrent use.
type Conn struct {
	role   Role
	local  Settings
	peer   Settings
	limits Limits
	st     state
	err    *Error

	in        []byte
	inCharge  int64     // bytes of c.in charged to budget
	partialAt time.Time // when the incomplete frame in c.in started to arrive
	budget    *MemoryBudget
	// splitGoing: the call whose split message goes on while the budget is spent (one per
	// connection, §9); nWithheld: calls with chunk credit withheld.
	splitGoing uint32
	nWithheld  int
	fromIn     bool   // the frames being processed are in c.in
	detached   bool   // a message was handed out from c.in's memory
	out        []byte // backing buffer of small frames
	segAt      int    // start of the current small segment in out
	segs       [][]byte
	events     []Event
	evHead     int

	calls    map[uint32]*call
	free     []*call
	open     int
	highest  uint32
	methods  map[uint16]string // server: bound ids
	interned map[string]uint16 // client: our bindings
	nextMID  uint16

	sentGoAway   bool
	sentLast     uint32
	gotGoAway    bool
	gotLast      uint32
	pingQueued   bool
	pingsOut     int
	pingBucket   bucket
	resetBucket  bucket
	refuseBucket bucket

	// CopyThreshold: message payloads of at least this many bytes are referenced, not
	// copied, by the output (vectored writes). The caller must then not change them.
	CopyThreshold int
}

// NewConn creates an engine for role with its own settings and limits, and queues its
// preface and SETTINGS.
func NewConn(role Role, local Settings, limits Limits) (*Conn, error) {
	if err := local.Validate(); err != nil {
		return nil, err
	}
	c := &Conn{role: role, local: local, peer: DefaultSettings(), limits: limits,
		calls: make(map[uint32]*call), nextMID: 1, CopyThreshold: 16 << 10,
		pingBucket:   newBucket(limits.PingBurst, limits.PingPer),
		resetBucket:  newBucket(limits.RapidResetBurst, limits.RapidResetPer),
		refuseBucket: newBucket(limits.RefusedCallBurst, limits.RefusedCallPer)}
	if role == Server {
		c.methods = make(map[uint16]string)
	} else {
		c.interned = make(map[string]uint16)
	}
	c.out = make([]byte, 0, 4096)
	c.out = append(c.out, Preface[:]...)
	c.out = Append(c.out, &Frame{Type: TypeSettings, Entries: local.Entries()})
	return c, nil
}

// Role is the engine's side.
func (c *Conn) Role() Role { return c.role }

// PeerSettings are the peer's settings (defaults until Established).
func (c *Conn) PeerSettings() Settings { return c.peer }

// LocalSettings are the engine's own settings.
func (c *Conn) LocalSettings() Settings { return c.local }

// Established reports whether the peer's SETTINGS arrived and the connection is not closed.
func (c *Conn) Established() bool { return c.st == stOpen }

// Closed reports whether the connection is over; Err says why (nil: no error).
func (c *Conn) Closed() bool { return c.st == stClosed }

// Err is the connection error, if any.
func (c *Conn) Err() *Error { return c.err }

// OpenCalls is the number of open calls.
func (c *Conn) OpenCalls() int { return c.open }

// GoingAway reports whether either side sent GOAWAY.
func (c *Conn) GoingAway() bool { return c.sentGoAway || c.gotGoAway }

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

// PollEvent returns the next event, if any.
func (c *Conn) PollEvent() (Event, bool) {
	if c.evHead >= len(c.events) {
		if c.evHead > 0 {
			clear(c.events)
			c.events, c.evHead = c.events[:0], 0
		}
		return Event{}, false
	}
	ev := c.events[c.evHead]
	c.events[c.evHead] = Event{}
	c.evHead++
	return ev, true
}

func (c *Conn) emit(ev Event) { c.events = append(c.events, ev) }

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

func (c *Conn) handle(f *Frame, now time.Time) *Error {
	if c.st == stSettings {
		switch f.Type {
		case TypeSettings:
			peer, err := DefaultSettings().Apply(f.Entries)
			if err != nil {
				return c.fail(err, true, false)
			}
			c.peer = peer
			c.st = stOpen
			c.emit(Event{Type: EvEstablished})
			return nil
		case TypeError:
			return c.fail(&Error{Code: ErrCode(f.Code), Reason: f.Message}, false, false)
		default:
			return c.fail(perr(SettingsError, "first frame is type 0x%02x, not SETTINGS", f.Type), true, false)
		}
	}
	switch f.Type {
	case TypeSettings:
		return c.fail(perr(SettingsError, "second SETTINGS frame"), true, false)
	case TypePing:
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
	case TypeGoAway:
		if c.gotGoAway && f.LastCallID > c.gotLast {
			return c.fail(perr(IllegalFrame, "GOAWAY raises last_call_id from %d to %d", c.gotLast, f.LastCallID), true, false)
		}
		if c.gotGoAway && f.LastCallID == c.gotLast {
			return nil
		}
		c.gotGoAway, c.gotLast = true, f.LastCallID
		c.emit(Event{Type: EvGoAway, LastCall: f.LastCallID, ErrCode: ErrCode(f.Code), Text: f.Message})
		if c.role == Client {
			ids := make([]uint32, 0)
			for id, cl := range c.calls {
				if cl.open && id > f.LastCallID {
					ids = append(ids, id)
				}
			}
			slices.Sort(ids)
			for _, id := range ids {
				c.endCall(c.calls[id], Unavailable, UnprocessedReason, nil)
			}
		}
		return nil
	case TypeError:
		return c.fail(&Error{Code: ErrCode(f.Code), Reason: f.Message}, false, false)
	case TypeCall:
		if c.role == Client {
			return c.fail(perr(IllegalFrame, "CALL from the server"), true, false)
		}
		return c.handleCall(f, now)
	}
	if f.Type >= 0x80 {
		return nil
	}
	// Call frames: wrong side first.
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
		return c.message(cl, f)
	case TypeContinuation:
		return c.continuation(cl, f)
	case TypeCredit:
		return c.credit(cl, f)
	case TypeHalfClose:
		if cl.remoteDone {
			return c.fail(perr(IllegalFrame, "HALF_CLOSE on call %d after its half-close", cl.id), true, false)
		}
		if cl.splitOpen {
			return c.fail(perr(MessageLengthMismatch, "HALF_CLOSE on call %d inside a split message", cl.id), true, false)
		}
		cl.remoteDone = true
		c.emit(Event{Type: EvHalfClosed, CallID: cl.id})
	case TypeCancel:
		if !cl.answered && !c.resetBucket.take(now) {
			return c.fail(perr(EnhanceYourCalm, "too_many_resets"), true, true)
		}
		c.endCall(cl, Code(f.Code).Known(), "cancelled by the client", nil)
	case TypeHeaders:
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
	case TypeEnd:
		if sz := 2 + len(f.Message) + f.Metadata.Size(); sz > int(c.local.MaxMetadataSize) {
			c.endCall(cl, ResourceExhausted, fmt.Sprintf("END status of %d bytes over max_metadata_size %d", sz, c.local.MaxMetadataSize), nil)
			return nil
		}
		c.endCall(cl, Code(f.Code).Known(), f.Message, f.Metadata)
	}
	return nil
}

func (c *Conn) handleCall(f *Frame, now time.Time) *Error {
	if f.CallID <= c.highest {
		return c.fail(perr(DuplicateCall, "CALL %d not above the highest call id %d", f.CallID, c.highest), true, false)
	}
	c.highest = f.CallID
	if c.gotGoAway {
		return c.fail(perr(IllegalFrame, "CALL %d after the client's own GOAWAY", f.CallID), true, false)
	}
	var method string
	if f.Named() {
		if f.MethodID > MaxMethodID {
			return c.fail(perr(MethodIDError, "NAMED CALL binds method id %d above 1023", f.MethodID), true, false)
		}
		if f.MethodID != 0 {
			if _, ok := c.methods[f.MethodID]; ok {
				return c.fail(perr(MethodIDError, "method id %d is already bound", f.MethodID), true, false)
			}
			c.methods[f.MethodID] = f.MethodName
		}
		method = f.MethodName
	} else {
		if f.MethodID == 0 || f.MethodID > MaxMethodID {
			return c.fail(perr(MethodIDError, "unnamed CALL with method id %d (1..=1023 required)", f.MethodID), true, false)
		}
		m, ok := c.methods[f.MethodID]
		if !ok {
			return c.fail(perr(MethodIDError, "method id %d is not bound", f.MethodID), true, false)
		}
		method = m
	}
	if c.sentGoAway && f.CallID > c.sentLast {
		return nil
	}
	refuse := func(msg string) {
		c.frame(&Frame{Type: TypeEnd, CallID: f.CallID, Code: uint16(ResourceExhausted), Message: msg, Metadata: Metadata{}})
	}
	if sz := f.Metadata.Size(); sz > int(c.local.MaxMetadataSize) {
		refuse(fmt.Sprintf("request metadata of %d bytes over max_metadata_size %d", sz, c.local.MaxMetadataSize))
		return nil
	}
	if c.open >= int(c.local.MaxConcurrentCalls) {
		if !c.refuseBucket.take(now) {
			return c.fail(perr(EnhanceYourCalm, "too_many_refused_calls"), true, true)
		}
		refuse("too many concurrent calls")
		return nil
	}
	if c.budget.Spent() {
		refuse(fmt.Sprintf("process memory budget for incoming messages exhausted (%d bytes)", c.budget.Limit()))
		return nil
	}
	cl := c.newCall(f.CallID)
	c.emit(Event{Type: EvCallStarted, CallID: cl.id, Method: method, Codec: f.Codec,
		TimeoutUs: f.TimeoutUs, Metadata: f.Metadata})
	if c.local.InitialCallWindow == 0 {
		c.grant(cl, 1)
	}
	return nil
}

// StartCall starts a call (client). timeoutUs 0 means no deadline.
func (c *Conn) StartCall(method string, codec uint8, timeoutUs uint64, md Metadata) (uint32, error) {
	if c.role != Client {
		return 0, ErrWrongSide
	}
	switch c.st {
	case stClosed:
		return 0, ErrConnClosed
	case stPreface, stSettings:
		return 0, ErrNotReady
	}
	if c.gotGoAway || c.sentGoAway {
		return 0, &CallError{Code: Unavailable, Message: "the connection is going away"}
	}
	if c.peer.MaxConcurrentCalls == 0 {
		return 0, &CallError{Code: Unavailable, Message: "the server takes no new calls (MAX_CONCURRENT_CALLS 0)"}
	}
	if c.open >= int(c.peer.MaxConcurrentCalls) {
		return 0, ErrTooManyCalls
	}
	if c.highest == 1<<32-1 {
		return 0, &CallError{Code: Unavailable, Message: "call ids exhausted on this connection"}
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
