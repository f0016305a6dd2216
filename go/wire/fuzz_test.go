package wire

import (
	"bytes"
	"testing"
	"time"
)

func addVectorSeeds(f *testing.F) {
	for _, name := range []string{"frames_valid.json", "frames_invalid.json"} {
		for _, v := range loadVectors(f, name) {
			f.Add(hexValue(f, v["hex"]))
		}
	}
}

// FuzzDecode: the decoder never panics, never claims more bytes than it was given, and a
// frame it accepts encodes to bytes that decode to the same frame.
func FuzzDecode(f *testing.F) {
	addVectorSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, n, err := Decode(data, 1<<20)
		if err != nil || n == 0 {
			return
		}
		if n > len(data) {
			t.Fatalf("consumed %d of %d", n, len(data))
		}
		if fr.Type >= 0x80 {
			return
		}
		out := Append(nil, &fr)
		fr2, n2, err := Decode(out, 1<<20)
		if err != nil || n2 != len(out) {
			t.Fatalf("re-encoded frame does not decode: %v", err)
		}
		if !bytes.Equal(Append(nil, &fr2), out) {
			t.Fatalf("re-encoding is not stable")
		}
	})
}

// FuzzConn: after a valid handshake, arbitrary bytes make either side of the engine
// either go on or close with a connection error, and never panic; once it is shut down,
// nothing is left charged to its memory budget.
func FuzzConn(f *testing.F) {
	addVectorSeeds(f)
	for _, v := range loadVectors(f, "sessions_valid.json") {
		for _, s := range v["steps"].([]any) {
			if h, ok := s.(map[string]any)["recv_hex"]; ok {
				f.Add(hexValue(f, h))
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		hello := append(append([]byte{}, Preface[:]...), Append(nil, &Frame{Type: TypeSettings})...)
		for _, role := range []Role{Server, Client} {
			c, err := NewConn(role, DefaultSettings(), DefaultLimits())
			if err != nil {
				t.Fatal(err)
			}
			// Small (sometimes spent), or room for frames announced whole.
			budget := NewMemoryBudget(int64(64<<10) << (6 * (len(data) % 2)))
			c.SetMemoryBudget(budget)
			now := time.Unix(1, 0)
			if err := c.Receive(hello, now); err != nil {
				t.Fatal(err)
			}
			if role == Client {
				if _, err := c.StartCall("/a.B/C", 0, 0, nil); err != nil {
					t.Fatal(err)
				}
			}
			_ = c.Receive(data, now)
			c.RetryCredit()
			for {
				if _, ok := c.PollEvent(); !ok {
					break
				}
			}
			c.TakeOutput(nil, nil)
			c.Shutdown("end of input")
			if used := budget.Used(); used != 0 {
				t.Fatalf("%d bytes still charged to the memory budget after Shutdown", used)
			}
		}
	})
}
