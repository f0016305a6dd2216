package wire

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
