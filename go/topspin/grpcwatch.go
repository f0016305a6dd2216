package topspin

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
)

// The gRPC face's request messages under way, read from the HTTP/2 frames as they pass
// between the socket and grpc-go (as the Rust face's grpc/watch.rs). grpc-go buffers a
// request message as its bytes arrive, and widens a stream's window to a whole message (up
// to the max message size) as soon as its handler waits for it; it has no hook to withhold
// a stream's window, nor a bound on a message that stops arriving. So the face itself:
//
//   - charges the bytes of every request message still incomplete to the connection's share
//     of the memory budget (1/wire.ShareOfBudget of it, as a native connection's split
//     messages), given back as each message completes (its handler then holds it, charged
//     by the bridge) or its stream ends;
//   - closes a connection whose incomplete messages pass its share by more than the
//     largest of them (the one message that always goes on): where the native face and the
//     Rust face withhold credit, grpc-go offers no way to;
//   - closes a connection one of whose streams has an incomplete message that got no byte
//     for the frame timeout while the stream and the connection had window open (time the
//     client waits for our window does not count): grpc-go gives no way to end that one call,
//     where the Rust face ends it UNAVAILABLE;
//   - closes a connection whose frame (or frame header) stays incomplete for the frame
//     timeout, whatever its type, as the Rust face: grpc-go reads a frame whole and waits for
//     ever on one that stops halfway. Windows play no part: a client sends a DATA frame only
//     with window for all of it (RFC 9113 §6.9), so a frame that stops halfway is its doing.
//
// Frames are parsed from their 9-byte headers; DATA frames' payloads to find the gRPC
// messages' 5-byte prefixes. What the client sends goes through watchIn, what grpc-go sends
// (window updates, stream ends) through watchOut.

// h2Preface is what an HTTP/2 client sends first.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// HTTP/2 frame types and flags the watch reads.
const (
	h2Data         = 0x0
	h2Headers      = 0x1
	h2RSTStream    = 0x3
	h2WindowUpdate = 0x8
	h2EndStream    = 0x1
	h2Padded       = 0x8
	h2ConnWindow   = 65535 // the connection window before any WINDOW_UPDATE
)

// grpcWatch follows one gRPC connection's streams.
type grpcWatch struct {
	mu                   sync.Mutex
	share                *wire.MemoryBudget // the connection's share of the budget (nil: no budget)
	win                  int64              // the streams' initial window (the server's INITIAL_WINDOW_SIZE)
	timeout              time.Duration      // the frame timeout (0: none)
	fromClient, toClient h2Parser
	streams              map[uint32]*watchedStream
	connWin              int64  // what the client may still send on the connection
	cut                  string // why the connection must close ("" while it may go on)
	closed               bool
}

// watchedStream is a stream whose request is still arriving.
type watchedStream struct {
	window  int64     // what the client may still send on it
	prefix  [5]byte   // the current message's prefix, as far as it arrived
	nprefix int       // bytes of it arrived
	left    int64     // bytes of the current message still to come (after its prefix)
	partial int64     // bytes of the current message arrived (charged)
	last    time.Time // when a byte of it last arrived
}

func newGRPCWatch(share *wire.MemoryBudget, win int64, timeout time.Duration) *grpcWatch {
	w := &grpcWatch{share: share, win: win, timeout: timeout, streams: map[uint32]*watchedStream{},
		connWin: h2ConnWindow}
	w.fromClient.skip = len(h2Preface)
	return w
}

// h2Parser cuts a byte stream into frames: each header, then its payload in pieces.
type h2Parser struct {
	skip   int // bytes to pass over first (the client's preface)
	hdr    [9]byte
	nhdr   int
	typ    uint8
	flags  uint8
	stream uint32
	length int     // the current frame's payload length
	left   int     // of which still to come
	pad    int     // its trailing padding (DATA; -1 while the pad length is unknown)
	head   [4]byte // the first bytes of its payload (a WINDOW_UPDATE's increment)
	// since is when the frame now incomplete started to arrive (zero: none is). It is set
	// once per read at most, from the time the read already took.
	since time.Time
}

// h2Frame is a frame the parser finished.
type h2Frame struct {
	typ, flags uint8
	stream     uint32
	length     int
	head       [4]byte
}

// feed parses b, which arrived at now, calling onData with each piece of a DATA frame's
// content (padding left out) and onFrame once each frame has passed whole.
func (p *h2Parser) feed(b []byte, now time.Time, onData func(stream uint32, d []byte), onFrame func(f h2Frame)) {
	if p.skip > 0 {
		k := min(p.skip, len(b))
		p.skip, b = p.skip-k, b[k:]
	}
	whole := false // a frame completed in b
	for len(b) > 0 {
		if p.nhdr < 9 {
			k := copy(p.hdr[p.nhdr:], b)
			p.nhdr, b = p.nhdr+k, b[k:]
			if p.nhdr < 9 {
				break
			}
			p.length = int(p.hdr[0])<<16 | int(p.hdr[1])<<8 | int(p.hdr[2])
			p.typ, p.flags = p.hdr[3], p.hdr[4]
			p.stream = binary.BigEndian.Uint32(p.hdr[5:]) & 0x7fffffff
			p.left, p.pad, p.head = p.length, 0, [4]byte{}
			if p.typ == h2Data && p.flags&h2Padded != 0 {
				p.pad = -1
			}
		} else {
			b = p.payload(b, onData)
		}
		if p.nhdr == 9 && p.left == 0 {
			p.nhdr, whole = 0, true
			onFrame(h2Frame{p.typ, p.flags, p.stream, p.length, p.head})
		}
	}
	// A frame left incomplete started in b if one completed in b or none was incomplete.
	switch {
	case p.nhdr == 0:
		p.since = time.Time{}
	case whole || p.since.IsZero():
		p.since = now
	}
}

// payload takes the current frame's payload bytes from b and returns the rest.
func (p *h2Parser) payload(b []byte, onData func(stream uint32, d []byte)) []byte {
	k := min(p.left, len(b))
	piece := b[:k]
	if at := p.length - p.left; at < len(p.head) {
		copy(p.head[at:], piece)
	}
	p.left -= k
	if p.typ == h2Data {
		if p.pad < 0 && len(piece) > 0 { // the pad length byte
			p.pad, piece = int(piece[0]), piece[1:]
		}
		content := len(piece) - max(0, p.pad-p.left) // the padding comes last
		if content > 0 {
			onData(p.stream, piece[:content])
		}
	}
	return b[k:]
}

// in follows what the client sent (b, as read) and returns why the connection must close
// ("" while it may go on).
func (w *grpcWatch) in(b []byte, now time.Time) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fromClient.feed(b, now, func(id uint32, d []byte) { w.inData(id, d, now) }, w.inFrame)
	if w.share != nil && w.share.Used() > w.share.Limit() && w.cut == "" {
		var most int64
		for _, st := range w.streams {
			most = max(most, st.partial)
		}
		if w.share.Used()-most > w.share.Limit() {
			w.cut = fmt.Sprintf("the connection's incomplete request messages hold %d bytes, over its share of the memory budget (%d bytes) and the largest message", w.share.Used(), w.share.Limit())
		}
	}
	return w.cut
}

// inData follows a piece of a request stream's DATA: the messages' prefixes and bytes.
func (w *grpcWatch) inData(id uint32, d []byte, now time.Time) {
	st := w.streams[id]
	if st == nil || w.closed {
		return
	}
	st.last = now
	for len(d) > 0 {
		if st.nprefix < len(st.prefix) {
			k := copy(st.prefix[st.nprefix:], d)
			st.nprefix, d = st.nprefix+k, d[k:]
			if st.nprefix == len(st.prefix) {
				st.left = int64(binary.BigEndian.Uint32(st.prefix[1:]))
			}
		} else {
			k := min(st.left, int64(len(d)))
			st.left, st.partial, d = st.left-k, st.partial+k, d[k:]
			w.share.Charge(k)
		}
		if st.nprefix == len(st.prefix) && st.left == 0 { // the message is whole
			w.share.Release(st.partial)
			st.nprefix, st.partial = 0, 0
		}
	}
}

// inFrame follows a frame the client sent.
func (w *grpcWatch) inFrame(f h2Frame) {
	st := w.streams[f.stream]
	switch f.typ {
	case h2Headers:
		if st == nil && f.flags&h2EndStream == 0 && !w.closed {
			w.streams[f.stream] = &watchedStream{window: w.win}
		}
	case h2Data:
		w.connWin -= int64(f.length)
		if st != nil {
			st.window -= int64(f.length)
		}
	case h2RSTStream:
		w.end(f.stream)
		return
	}
	if f.flags&h2EndStream != 0 && (f.typ == h2Headers || f.typ == h2Data) {
		w.end(f.stream)
	}
}

// out follows what grpc-go sends: window updates and the ends of streams.
func (w *grpcWatch) out(b []byte, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.toClient.feed(b, now, func(uint32, []byte) {}, func(f h2Frame) {
		switch {
		case f.typ == h2WindowUpdate:
			inc := int64(binary.BigEndian.Uint32(f.head[:]) & 0x7fffffff)
			w.open(f.stream, inc, now)
		case f.typ == h2RSTStream, f.typ == h2Headers && f.flags&h2EndStream != 0:
			w.end(f.stream) // the server ended the call
		}
	})
}

// open adds inc to a stream's window (0: the connection's); a window that opens restarts
// the time of the messages waiting on it (the client could not send meanwhile).
func (w *grpcWatch) open(id uint32, inc int64, now time.Time) {
	if id == 0 {
		if w.connWin <= 0 && w.connWin+inc > 0 {
			for _, st := range w.streams {
				st.last = now
			}
		}
		w.connWin += inc
		return
	}
	if st := w.streams[id]; st != nil {
		if st.window <= 0 && st.window+inc > 0 {
			st.last = now
		}
		st.window += inc
	}
}

// end forgets a stream whose request is over (or that was reset), giving back its charge.
func (w *grpcWatch) end(id uint32) {
	if st := w.streams[id]; st != nil {
		w.share.Release(st.partial)
		delete(w.streams, id)
	}
}

// stalled returns why the connection must close: a frame from the client incomplete for the
// frame timeout, or a request message under way that got no byte for it while it had window
// ("" if none).
func (w *grpcWatch) stalled(now time.Time) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cut != "" || w.timeout <= 0 {
		return w.cut
	}
	if since := w.fromClient.since; !since.IsZero() && now.Sub(since) >= w.timeout {
		w.cut = fmt.Sprintf("an HTTP/2 frame stayed incomplete for the frame_timeout (%v)", w.timeout)
		return w.cut
	}
	if w.connWin <= 0 {
		return w.cut
	}
	for _, st := range w.streams {
		if (st.nprefix > 0 || st.partial > 0) && st.window > 0 && now.Sub(st.last) >= w.timeout {
			w.cut = fmt.Sprintf("a request message got no byte for the frame_timeout (%v) while its window was open", w.timeout)
		}
	}
	return w.cut
}

// close gives back every charge; the watch follows nothing more.
func (w *grpcWatch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id := range w.streams {
		w.end(id)
	}
	w.closed = true
}

// isClosed reports whether close was called.
func (w *grpcWatch) isClosed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}
