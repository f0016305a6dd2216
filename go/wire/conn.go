package wire

import (
	"errors"
	"time"
)

// Role is the side of a connection: the client opened it and starts calls.
type Role uint8

// UnprocessedReason is the UNAVAILABLE message of a call the server's GOAWAY says it never
// processed (its id is above the GOAWAY's last call): such a call is safe to send again, even
// when it is not idempotent (protocol.md, GOAWAY), and clients retry it once, transparently.
const UnprocessedReason = "the server went away before processing the call (safe to retry)"

// The two roles.
const (
	Client Role = iota
	Server
)

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
	// share: this connection's share of budget (1/ShareOfBudget), charged with its split
	// messages being reassembled (and so charging budget): while it is spent, chunk credit
	// is withheld (one split message goes on).
	share *MemoryBudget
	// messageTimeout: how long a split message may get no chunk (0: unbounded);
	// messageDue: when the last one that arrived times out (cleared lazily).
	messageTimeout time.Duration
	messageDue     time.Time
	// splitGoing: the call whose split message goes on while the budget is spent (one per
	// connection, §9); nWithheld: calls with chunk credit withheld.
	splitGoing uint32
	nWithheld  int
	fromIn     bool   // the frames being processed are in c.in
	detached   bool   // a message was handed out from c.in's memory
	block      []byte // what is left of the block small messages are cut from (carve)
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
