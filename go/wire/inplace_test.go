package wire

import (
	"bytes"
	"testing"
	"time"
)

// A large frame read piecewise into PendingSpace gives the same message as Receive, and
// the message is handed over without a copy of c.in being kept by the engine.
func TestReceiveInPlace(t *testing.T) {
	now := time.Unix(1, 0)
	c, err := NewConn(Server, DefaultSettings(), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	budget := NewMemoryBudget(1 << 30) // room to reserve the frame whole
	c.SetMemoryBudget(budget)
	in := append(append([]byte{}, Preface[:]...), Append(nil, &Frame{Type: TypeSettings})...)
	in = Append(in, &Frame{Type: TypeCall, Flags: FlagNamed, CallID: 1, MethodID: 1, MethodName: "/a.B/C", Metadata: Metadata{}})
	msg := bytes.Repeat([]byte("0123456789"), 30000)
	frame := Append(nil, &Frame{Type: TypeMessage, Flags: FlagEndStream, CallID: 1, Chunk: msg})
	if err := c.Receive(append(in, frame[:1000]...), now); err != nil {
		t.Fatal(err)
	}
	rest := frame[1000:]
	inPlace := 0
	for len(rest) > 0 {
		space := c.PendingSpace()
		if space == nil { // under 64 KiB of room left: the ordinary path
			if err := c.Receive(rest, now); err != nil {
				t.Fatal(err)
			}
			break
		}
		inPlace++
		n := copy(space, rest[:min(len(rest), 70000)])
		rest = rest[n:]
		if err := c.ReceiveInPlace(n, now); err != nil {
			t.Fatal(err)
		}
	}
	var got []byte
	for {
		ev, ok := c.PollEvent()
		if !ok {
			break
		}
		if ev.Type == EvMessage {
			got = ev.Message
		}
	}
	if inPlace < 3 {
		t.Fatalf("only %d reads in place", inPlace)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("message of %d bytes, want %d", len(got), len(msg))
	}
	if c.PendingSpace() != nil || len(c.in) != 0 {
		t.Fatal("input buffer kept after the frame")
	}
	if budget.Used() != 0 {
		t.Fatalf("%d bytes still charged once the message was handed over", budget.Used())
	}
}

// Regression (§5.3): a split message reserved 64 bytes more than twice what had arrived.
func TestSplitReservesAtMostTwiceWhatArrived(t *testing.T) {
	now := time.Unix(1, 0)
	c, err := NewConn(Server, DefaultSettings(), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	in := append(append([]byte{}, Preface[:]...), Append(nil, &Frame{Type: TypeSettings})...)
	in = Append(in, &Frame{Type: TypeCall, Flags: FlagNamed, CallID: 1, MethodName: "/a.B/C", Metadata: Metadata{}})
	in = Append(in, &Frame{Type: TypeMessage, Flags: FlagSplit, CallID: 1, TotalLen: 1 << 20, Chunk: []byte{7}})
	if err := c.Receive(in, now); err != nil {
		t.Fatal(err)
	}
	if got := cap(c.calls[1].split); got > 2 {
		t.Fatalf("reserved %d bytes after 1 byte of a split message", got)
	}
}

// Small messages are cut from shared blocks (carve): each is its own, capped at its length
// (an append cannot write into the next), unchanged by the messages received after it, and
// one of carveMax bytes or more than a block's rest still arrives whole.
func TestSmallMessagesAreCutApartAndStayTheirOwn(t *testing.T) {
	now := time.Unix(1, 0)
	c, err := NewConn(Server, DefaultSettings(), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	in := append(append([]byte{}, Preface[:]...), Append(nil, &Frame{Type: TypeSettings})...)
	if err := c.Receive(in, now); err != nil {
		t.Fatal(err)
	}
	var got [][]byte
	var want [][]byte
	for i := range 40 {
		id := uint32(2*i + 1)
		body := bytes.Repeat([]byte{byte(i)}, []int{0, 1, 20, 700, carveMax, carveMax + 1}[i%6])
		want = append(want, body)
		b := Append(nil, &Frame{Type: TypeCall, Flags: FlagNamed, CallID: id, MethodName: "/a.B/C", Metadata: Metadata{}})
		b = Append(b, &Frame{Type: TypeMessage, Flags: FlagEndStream, CallID: id, Chunk: body})
		if err := c.Receive(b, now); err != nil {
			t.Fatal(err)
		}
		for {
			ev, ok := c.PollEvent()
			if !ok {
				break
			}
			if ev.Type == EvMessage {
				if len(ev.Message) > 0 && cap(ev.Message) != len(ev.Message) {
					t.Fatalf("message %d: capacity %d past its %d bytes", i, cap(ev.Message), len(ev.Message))
				}
				got = append(got, ev.Message)
			}
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d messages, want %d", len(got), len(want))
	}
	for i := range got {
		got[i] = append(got[i], 0xff) // a copy, never the next message's bytes
	}
	for i := range want {
		if !bytes.Equal(got[i][:len(want[i])], want[i]) {
			t.Fatalf("message %d changed after later messages arrived", i)
		}
	}
}
