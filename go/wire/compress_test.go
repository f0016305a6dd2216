package wire

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// Every vector of compression.json (kind "compression", protocol.md §15).
func TestCompressionVectors(t *testing.T) {
	n := 0
	for _, v := range loadVectors(t, "compression.json") {
		if v["kind"] != "compression" {
			continue
		}
		n++
		name := v["name"].(string)
		t.Run(name, func(t *testing.T) {
			limit, err := strconv.ParseUint(string(v["limit"].(json.Number)), 10, 32)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decompress(v["encoding"].(string), hexValue(t, v["payload"]), uint32(limit))
			if want, ok := v["message"]; ok {
				if err != nil {
					t.Fatalf("error %v, want message", err)
				}
				if w := hexValue(t, want); !bytes.Equal(got, w) {
					t.Fatalf("decoded %x, want %x", got, w)
				}
				return
			}
			want := statusFromJSON(t, v["code"])
			var ce *CallError
			if !errors.As(err, &ce) || uint16(ce.Code) != want {
				t.Fatalf("got %x, %v; want %v", got, err, want)
			}
		})
	}
	if n == 0 {
		t.Fatal("no compression vectors")
	}
}

// Compress and Decompress round-trip; small or incompressible messages go with flag 0.
func TestCompressRoundTrip(t *testing.T) {
	big := []byte(strings.Repeat("topspin compresses ", 200))
	for _, enc := range []string{EncodingZstd, EncodingGzip} {
		for _, msg := range [][]byte{nil, []byte("hi"), big} {
			p, err := Compress(enc, msg)
			if err != nil {
				t.Fatal(err)
			}
			if wantFlag := byte(0); len(msg) >= CompressMin {
				wantFlag = 1
				if p[0] != wantFlag || len(p) >= len(msg) {
					t.Fatalf("%s: flag %d, %d bytes for %d", enc, p[0], len(p), len(msg))
				}
			} else if p[0] != wantFlag {
				t.Fatalf("%s: small message with flag %d", enc, p[0])
			}
			got, err := Decompress(enc, p, uint32(len(msg)))
			if err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("%s: round trip %d bytes: %v", enc, len(msg), err)
			}
		}
	}
	if _, err := Compress("br", []byte("x")); err == nil {
		t.Fatal("unknown encoding accepted")
	}
}

// A decompressed message is charged to the budget until the caller releases it (and twice
// while its pieces are copied into its buffer); one that finds no room ends
// RESOURCE_EXHAUSTED and leaves nothing charged.
func TestDecompressChargedToBudget(t *testing.T) {
	b := NewMemoryBudget(8 << 20)
	msg := make([]byte, 5<<19) // 2.5 MiB: two are held, a third needs 5 MiB more
	for i := range msg {
		msg[i] = byte(i / 4096)
	}
	comp, err := Compress(EncodingZstd, msg)
	if err != nil || len(comp) > 4096 {
		t.Fatalf("compress: %d bytes, %v", len(comp), err)
	}
	var held []int64
	for i := 0; i < 2; i++ {
		out, charged, err := DecompressCharged(EncodingZstd, comp, 16<<20, b)
		if err != nil || len(out) != len(msg) {
			t.Fatalf("decompress %d: %d bytes, %v", i, len(out), err)
		}
		if charged < int64(len(msg)) || charged > 2*int64(len(msg)) {
			t.Fatalf("charged %d for a %d-byte message", charged, len(msg))
		}
		held = append(held, charged)
	}
	if used := b.Used(); used != held[0]+held[1] {
		t.Fatalf("budget used %d, charged %d", used, held[0]+held[1])
	}
	used := b.Used()
	_, charged, err := DecompressCharged(EncodingZstd, comp, 16<<20, b)
	var ce *CallError
	if !errors.As(err, &ce) || ce.Code != ResourceExhausted || !strings.Contains(ce.Message, NoRoomReason) || charged != 0 {
		t.Fatalf("third message: %v, %d charged", err, charged)
	}
	if b.Used() != used {
		t.Fatalf("a refused message left %d bytes charged", b.Used()-used)
	}
	// The limit still applies, and a bomb past it leaves nothing charged.
	big := NewMemoryBudget(64 << 20)
	if _, _, err := DecompressCharged(EncodingZstd, comp, 1<<20, big); !errors.As(err, &ce) || ce.Code != ResourceExhausted || big.Used() != 0 {
		t.Fatalf("past the limit: %v, %d left charged", err, big.Used())
	}
	b.Release(held[0] + held[1])
	if b.Used() != 0 {
		t.Fatalf("budget used %d after release", b.Used())
	}
}

// A compressed empty message decompresses to an empty slice, not nil (a handler may tell
// "no message" by nil).
func TestDecompressedEmptyMessageIsNotNil(t *testing.T) {
	for _, enc := range []string{EncodingZstd, EncodingGzip} {
		var body []byte
		if enc == EncodingZstd {
			e, _ := zstd.NewWriter(nil)
			body = e.EncodeAll(nil, nil)
		} else {
			var b bytes.Buffer
			w := gzip.NewWriter(&b)
			_ = w.Close()
			body = b.Bytes()
		}
		out, charged, err := DecompressCharged(enc, append([]byte{1}, body...), 1<<20, NewMemoryBudget(1<<20))
		if err != nil || out == nil || len(out) != 0 || charged != 0 {
			t.Fatalf("%s: %v (nil: %v), %d charged, %v", enc, out, out == nil, charged, err)
		}
	}
}

// At most GOMAXPROCS messages are decompressed past their first piece at once: 16 goroutines
// inflating 16 MiB of gzip each hold at most that many messages charged (pieces and the buffer
// they are copied to, 2 × 16 MiB each), a first piece each and the messages returned and not
// yet released (allowed 2), not 16 partial messages growing together (the charges' peak is
// sampled; on 2 CPUs 50 to 68 MiB, and 128 to 146 MiB without the bound).
func TestInflationsPastTheFirstPieceAreOnePerCPU(t *testing.T) {
	const n, size = 16, 16 << 20
	budget := NewMemoryBudget(1 << 30)
	bomb, err := Compress(EncodingGzip, make([]byte, size))
	if err != nil {
		t.Fatal(err)
	}
	var peak atomic.Int64
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), budget.Used()))
			select {
			case <-stop:
				return
			default:
				runtime.Gosched()
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, charged, err := DecompressCharged(EncodingGzip, bomb, size, budget)
			if err == nil && len(out) != size {
				err = errors.New("wrong size")
			}
			budget.Release(charged)
			errs <- err
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	procs := int64(cap(inflating))
	bound := procs*2*size + 2*size + n*inflateChunk
	t.Logf("%d inflations of %d MiB at once, %d at a time past the first piece: charges peaked at %.1f MiB (bound %.1f MiB)",
		n, size>>20, procs, float64(peak.Load())/(1<<20), float64(bound)/(1<<20))
	if procs < n && peak.Load() > bound {
		t.Errorf("charges peaked at %d bytes; want at most %d", peak.Load(), bound)
	}
	if budget.Used() != 0 {
		t.Errorf("%d bytes left charged", budget.Used())
	}
}
