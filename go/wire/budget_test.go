package wire

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// serverWithCall is an established server engine charging budget, with call 1 open.
func serverWithCall(t *testing.T, budget *MemoryBudget) *Conn {
	t.Helper()
	c, err := NewConn(Server, DefaultSettings(), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	c.SetMemoryBudget(budget)
	in := append(append([]byte{}, Preface[:]...), Append(nil, &Frame{Type: TypeSettings})...)
	in = Append(in, &Frame{Type: TypeCall, Flags: FlagNamed, CallID: 1, MethodName: "/a.B/C", Metadata: Metadata{}})
	if err := c.Receive(in, time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	return c
}

func events(c *Conn) []Event {
	var out []Event
	for {
		ev, ok := c.PollEvent()
		if !ok {
			return out
		}
		out = append(out, ev)
	}
}

// A frame header's length is a claim: a 16 MiB frame is reserved whole only while the
// budget has room; past it the buffer holds at most twice what arrived, and the message
// still arrives whole. Charges go back once the frame is handed over or the connection ends.
func TestLargeFramesReservedOnlyWithinTheBudget(t *testing.T) {
	now := time.Unix(1, 0)
	budget := NewMemoryBudget(20 << 20)
	msg := bytes.Repeat([]byte("abcdefgh"), (16<<20-64)/8)
	frame := Append(nil, &Frame{Type: TypeMessage, Flags: FlagEndStream, CallID: 1, Chunk: msg})
	a, b := serverWithCall(t, budget), serverWithCall(t, budget)
	if err := a.Receive(frame[:14], now); err != nil {
		t.Fatal(err)
	}
	if cap(a.in) != len(frame) || budget.Used() != int64(len(frame)) {
		t.Fatalf("first frame: buffer %d, charged %d; want both %d", cap(a.in), budget.Used(), len(frame))
	}
	if err := b.Receive(frame[:14], now); err != nil {
		t.Fatal(err)
	}
	if cap(b.in) > 4096 || budget.Used() != int64(len(frame)) {
		t.Fatalf("second frame, over the budget: buffer %d, charged %d", cap(b.in), budget.Used())
	}
	// b gets the rest in pieces of growing size: never more than twice what arrived.
	got, step := 14, 1000
	for got < len(frame) {
		n := min(step, len(frame)-got)
		if err := b.Receive(frame[got:got+n], now); err != nil {
			t.Fatal(err)
		}
		got += n
		step *= 2
		if len(b.in) > 0 && cap(b.in) > max(2*len(b.in), 4096) {
			t.Fatalf("buffer of %d bytes for %d arrived", cap(b.in), len(b.in))
		}
	}
	var whole []byte
	for _, ev := range events(b) {
		if ev.Type == EvMessage {
			whole = ev.Message
		}
	}
	if !bytes.Equal(whole, msg) {
		t.Fatalf("message of %d bytes, want %d", len(whole), len(msg))
	}
	a.Shutdown("test over")
	if budget.Used() != 0 {
		t.Fatalf("%d bytes still charged after the connection ended", budget.Used())
	}
}

// Split messages are charged as they grow. Once the budget is spent a new CALL ends
// RESOURCE_EXHAUSTED, one split message per connection still gets its chunk credit, the
// others' waits until RetryCredit finds room.
func TestSplitMessagesChargeTheBudget(t *testing.T) {
	now := time.Unix(1, 0)
	budget := NewMemoryBudget(64 << 10)
	c := serverWithCall(t, budget)
	in := Append(nil, &Frame{Type: TypeCall, Flags: FlagNamed, CallID: 3, MethodName: "/a.B/C", Metadata: Metadata{}})
	chunk := bytes.Repeat([]byte{7}, 40<<10)
	in = Append(in, &Frame{Type: TypeMessage, Flags: FlagSplit, CallID: 1, TotalLen: 1 << 20, Chunk: chunk})
	in = Append(in, &Frame{Type: TypeMessage, Flags: FlagSplit, CallID: 3, TotalLen: 1 << 20, Chunk: chunk})
	c.TakeOutput(nil, nil)
	if err := c.Receive(in, now); err != nil {
		t.Fatal(err)
	}
	if !budget.Spent() || !c.CreditWithheld() {
		t.Fatalf("charged %d of %d, withheld %v", budget.Used(), budget.Limit(), c.CreditWithheld())
	}
	out := frames(t, c)
	if len(out) != 1 || out[0].Type != TypeCredit || out[0].CallID != 1 {
		t.Fatalf("want CREDIT for call 1 alone, got %+v", out)
	}
	if err := c.Receive(Append(nil, &Frame{Type: TypeCall, Flags: FlagNamed, CallID: 5, MethodName: "/a.B/C", Metadata: Metadata{}}), now); err != nil {
		t.Fatal(err)
	}
	out = frames(t, c)
	if len(out) != 1 || out[0].Type != TypeEnd || Code(out[0].Code) != ResourceExhausted || !strings.Contains(out[0].Message, "memory budget") {
		t.Fatalf("want END RESOURCE_EXHAUSTED for call 5, got %+v", out)
	}
	c.RetryCredit() // still spent: nothing
	if out = frames(t, c); len(out) != 0 {
		t.Fatalf("credit given while the budget is spent: %+v", out)
	}
	budget.Release(budget.Used()) // room again (as if other connections let go)
	c.RetryCredit()
	out = frames(t, c)
	if len(out) != 1 || out[0].Type != TypeCredit || out[0].CallID != 3 || c.CreditWithheld() {
		t.Fatalf("want the withheld CREDIT for call 3, got %+v", out)
	}
}

// frames decodes what the engine queued.
func frames(t *testing.T, c *Conn) []Frame {
	t.Helper()
	bufs, _ := c.TakeOutput(nil, nil)
	var all []byte
	for _, b := range bufs {
		all = append(all, b...)
	}
	var out []Frame
	for len(all) > 0 {
		f, n, err := Decode(all, 1<<24)
		if err != nil || n == 0 {
			t.Fatalf("bad output %x", all)
		}
		out, all = append(out, f), all[n:]
	}
	return out
}
