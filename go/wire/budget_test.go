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
	// Call 1 ends (its charge given back): call 3's message is the one that goes on now.
	if err := c.Receive(Append(nil, &Frame{Type: TypeCancel, CallID: 1, Code: uint16(Canceled)}), now); err != nil {
		t.Fatal(err)
	}
	c.RetryCredit()
	out = frames(t, c)
	if len(out) != 1 || out[0].Type != TypeCredit || out[0].CallID != 3 || c.CreditWithheld() {
		t.Fatalf("want the withheld CREDIT for call 3, got %+v", out)
	}
}

// One connection's split messages hold at most its share of the budget (1/ShareOfBudget)
// plus the one message that goes on (and what the calls' windows let in): a greedy peer
// announcing far more than the budget gets no more credit past that, and another
// connection on the same budget still has its calls taken and its messages credited.
func TestOneConnectionHoldsAtMostItsShare(t *testing.T) {
	now := time.Unix(1, 0)
	const (
		window = 64 << 10
		total  = 4 << 20
		chunk  = 16 << 10
		calls  = 20
	)
	budget := NewMemoryBudget(8 << 20)
	share := budget.Limit() / ShareOfBudget
	set := DefaultSettings()
	set.InitialCallWindow = window
	open := func() *Conn {
		c, err := NewConn(Server, set, DefaultLimits())
		if err != nil {
			t.Fatal(err)
		}
		c.SetMemoryBudget(budget)
		in := append(append([]byte{}, Preface[:]...), Append(nil, &Frame{Type: TypeSettings})...)
		if err := c.Receive(in, now); err != nil {
			t.Fatal(err)
		}
		c.TakeOutput(nil, nil)
		return c
	}
	a := open()
	credit := map[uint32]int64{}
	sent := map[uint32]int{}
	var in []byte
	for i := 0; i < calls; i++ {
		id := uint32(2*i + 1)
		in = Append(in, &Frame{Type: TypeCall, Flags: FlagNamed, CallID: id, MethodName: "/a.B/C", Metadata: Metadata{}})
		in = Append(in, &Frame{Type: TypeMessage, Flags: FlagSplit, CallID: id, TotalLen: total, Chunk: make([]byte, chunk)})
		credit[id], sent[id] = window-(HeaderLen+4+chunk), chunk
	}
	if err := a.Receive(in, now); err != nil {
		t.Fatal(err)
	}
	// The peer sends a chunk on every call that has credit, until none has (bounded).
	for round := 0; round < 10000; round++ {
		for _, f := range frames(t, a) {
			if f.Type == TypeCredit {
				credit[f.CallID] += int64(f.Increment)
			}
		}
		in = in[:0]
		for id, cr := range credit {
			if cr > 0 && sent[id] < total {
				n := min(chunk, total-sent[id])
				in = Append(in, &Frame{Type: TypeContinuation, CallID: id, Chunk: make([]byte, n)})
				credit[id] -= int64(HeaderLen + n)
				sent[id] += n
			}
		}
		if len(in) == 0 {
			break
		}
		if err := a.Receive(in, now); err != nil {
			t.Fatal(err)
		}
	}
	for _, ev := range events(a) {
		if ev.Type == EvMessage {
			a.ReturnCredit(ev.CallID, ev.Cost) // the application took it (and let it go)
		}
	}
	if !a.CreditWithheld() {
		t.Fatal("no chunk credit withheld from a connection past its share")
	}
	// Its share, the one message that goes on (twice its size at most while it grows) and
	// the windows of the others.
	if most := share + 2*total + calls*window; budget.Used() > most {
		t.Fatalf("one connection holds %d bytes (share %d, at most %d)", budget.Used(), share, most)
	}
	if budget.Spent() {
		t.Fatalf("one connection spent the whole budget (%d of %d)", budget.Used(), budget.Limit())
	}
	// Another connection is served: its call is taken and its split message credited.
	b := open()
	in = Append(nil, &Frame{Type: TypeCall, Flags: FlagNamed, CallID: 1, MethodName: "/a.B/C", Metadata: Metadata{}})
	in = Append(in, &Frame{Type: TypeMessage, Flags: FlagSplit, CallID: 1, TotalLen: 1 << 20, Chunk: make([]byte, window/2)})
	in = Append(in, &Frame{Type: TypeContinuation, CallID: 1, Chunk: make([]byte, window/2)})
	if err := b.Receive(in, now); err != nil {
		t.Fatal(err)
	}
	credited := false
	for _, f := range frames(t, b) {
		if f.Type == TypeEnd {
			t.Fatalf("the other connection's call was refused: %+v", f)
		}
		credited = credited || f.Type == TypeCredit && f.CallID == 1
	}
	if !credited {
		t.Fatal("the other connection's split message got no credit")
	}
	a.Shutdown("test over")
	b.Shutdown("test over")
	if budget.Used() != 0 {
		t.Fatalf("%d bytes still charged after the connections ended", budget.Used())
	}
}

// A share takes from its whole and is spent when either is.
func TestShareOfBudget(t *testing.T) {
	whole := NewMemoryBudget(100)
	share := ShareOf(whole, 30)
	if !share.TryReserve(30) || share.TryReserve(1) || whole.Used() != 30 || !share.Spent() || whole.Spent() {
		t.Fatalf("share %d, whole %d", share.Used(), whole.Used())
	}
	whole.Charge(70)
	other := ShareOf(whole, 30)
	if other.TryReserve(1) || !other.Spent() {
		t.Fatal("a share of a spent whole took bytes")
	}
	share.Release(30)
	whole.Release(70)
	if share.Used() != 0 || whole.Used() != 0 || ShareOf(nil, 10) != nil {
		t.Fatalf("share %d, whole %d", share.Used(), whole.Used())
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

// A split message that gets no chunk for the message timeout while it has credit closes
// the connection with TIMEOUT (its charge given back); a chunk starts its time again, and
// while all credit is withheld by the budget the time is not the peer's to lose.
func TestSplitMessageTimeout(t *testing.T) {
	t0 := time.Unix(100, 0)
	budget := NewMemoryBudget(64 << 20)
	c := serverWithCall(t, budget)
	c.SetMessageTimeout(30 * time.Second)
	in := Append(nil, &Frame{Type: TypeMessage, Flags: FlagSplit, CallID: 1, TotalLen: 1 << 20, Chunk: make([]byte, 1000)})
	if err := c.Receive(in, t0); err != nil {
		t.Fatal(err)
	}
	if at, ok := c.MessageDeadline(); !ok || !at.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("deadline %v %v", at, ok)
	}
	t1 := t0.Add(20 * time.Second)
	if err := c.Receive(Append(nil, &Frame{Type: TypeContinuation, CallID: 1, Chunk: make([]byte, 1000)}), t1); err != nil {
		t.Fatal(err)
	}
	c.CheckMessages(t0.Add(31 * time.Second)) // 11 s after the last chunk
	if c.Closed() || budget.Used() == 0 {
		t.Fatalf("closed %v, charged %d", c.Closed(), budget.Used())
	}
	c.TakeOutput(nil, nil)
	c.CheckMessages(t1.Add(30 * time.Second))
	if !c.Closed() || c.Err() == nil || c.Err().Code != Timeout {
		t.Fatalf("closed %v, err %v", c.Closed(), c.Err())
	}
	if out := frames(t, c); len(out) != 1 || out[0].Type != TypeError || ErrCode(out[0].Code) != Timeout {
		t.Fatalf("want ERROR TIMEOUT, got %+v", out)
	}
	if budget.Used() != 0 {
		t.Fatalf("%d bytes still charged", budget.Used())
	}
	// Completed messages leave nothing timed; withheld credit is not the peer's fault.
	d := serverWithCall(t, NewMemoryBudget(1))
	d.SetMessageTimeout(30 * time.Second)
	in = Append(nil, &Frame{Type: TypeCall, Flags: FlagNamed, CallID: 3, MethodName: "/a.B/C", Metadata: Metadata{}})
	in = Append(in, &Frame{Type: TypeMessage, Flags: FlagSplit, CallID: 1, TotalLen: 2000, Chunk: make([]byte, 1000)})
	if err := d.Receive(in, t0); err != nil {
		t.Fatal(err)
	}
	// Call 1's message goes on while the budget is spent; call 3's credit is withheld.
	in = Append(nil, &Frame{Type: TypeMessage, Flags: FlagSplit, CallID: 3, TotalLen: 2000, Chunk: make([]byte, 1000)})
	in = Append(in, &Frame{Type: TypeContinuation, CallID: 1, Chunk: make([]byte, 1000)})
	if err := d.Receive(in, t0); err != nil {
		t.Fatal(err)
	}
	if !d.CreditWithheld() {
		t.Fatal("no credit withheld")
	}
	later := t0.Add(time.Minute)
	d.CheckMessages(later)
	if at, ok := d.MessageDeadline(); !ok || !at.Equal(later.Add(30*time.Second)) || d.Closed() {
		t.Fatalf("a message whose credit is withheld: deadline %v %v, closed %v", at, ok, d.Closed())
	}
	if err := d.Receive(Append(nil, &Frame{Type: TypeCancel, CallID: 3, Code: uint16(Canceled)}), later); err != nil {
		t.Fatal(err)
	}
	d.CheckMessages(later.Add(time.Minute))
	if _, ok := d.MessageDeadline(); ok || d.Closed() {
		t.Fatalf("no split message open, still timed (closed %v)", d.Closed())
	}
}
