package topspin

// stream is one call's state, shared by client and server; guarded by its conn's mu.
type stream struct {
	c     *conn
	id    uint32
	recvq [][]byte
	costs []uint32
	head  int
	qbuf  [2][]byte // first backing array of recvq (no allocation for short calls)
	cbuf  [2]uint32
	rnote chan struct{} // cap 1: a message or the end arrived (a server's: nil until Recv waits)
	wnote chan struct{} // cap 1, made on first use: send credit came back

	ended    bool // the call is over; code, msg and trailers are its status
	code     Code
	msg      string
	trailers Metadata

	enc        string // the encoding of the received messages ("" for none, §15)
	remoteDone bool   // server: the client half-closed
	headers    Metadata
	gotHeaders bool
	ss         *ServerStream // server: the stream's owner
}

func (s *stream) init(rnote chan struct{}) {
	s.rnote = rnote
	s.recvq, s.costs = s.qbuf[:0], s.cbuf[:0]
}

// status is the call's end as an error, with the response headers that came before it
// (client; protocol.md §5.4).
func (s *stream) status() *Status {
	return &Status{Code: s.code, Message: s.msg, Trailers: s.trailers, Headers: s.headers}
}

func (s *stream) setEnd(code Code, msg string, trailers Metadata) {
	s.ended, s.code, s.msg, s.trailers = true, code, msg, trailers
	s.notifyRead()
	s.notifyWrite()
}

func (s *stream) notifyRead() {
	select {
	case s.rnote <- struct{}{}:
	default:
	}
}

func (s *stream) notifyWrite() {
	if s.wnote == nil {
		return
	}
	select {
	case s.wnote <- struct{}{}:
	default:
	}
}

// writeNote returns the channel that says send credit came back (under mu).
func (s *stream) writeNote() chan struct{} {
	if s.wnote == nil {
		s.wnote = make(chan struct{}, 1)
	}
	return s.wnote
}

// push queues a received message (under mu).
func (s *stream) push(msg []byte, cost uint32) {
	s.recvq = append(s.recvq, msg)
	s.costs = append(s.costs, cost)
	s.notifyRead()
}

// pop takes a queued message (under mu) and returns its credit to the peer.
func (s *stream) pop() ([]byte, bool) {
	if s.head >= len(s.recvq) {
		return nil, false
	}
	msg, cost := s.recvq[s.head], s.costs[s.head]
	s.recvq[s.head] = nil
	s.head++
	if s.head == len(s.recvq) {
		s.recvq, s.costs, s.head = s.recvq[:0], s.costs[:0], 0
	}
	s.c.eng.ReturnCredit(s.id, cost)
	return msg, true
}
