package wire

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/topspin-rpc/topspin/go/internal/heapgate"
)

// Message compression (protocol.md §15): the flag byte, gzip and zstd.

// The encodings of §15 and their metadata keys.
const (
	EncodingIdentity = "identity"
	EncodingGzip     = "gzip"
	EncodingZstd     = "zstd"
	// KeyEncoding names the encoding of a direction's messages (CALL or HEADERS metadata).
	KeyEncoding = "topspin-encoding"
	// KeyAcceptEncoding lists the encodings a peer decodes, comma-separated.
	KeyAcceptEncoding = "topspin-accept-encoding"
	// AcceptedEncodings is what this implementation decodes, as sent in KeyAcceptEncoding.
	AcceptedEncodings = "zstd,gzip"
	// CompressMin is the message size below which Compress sends flag 0 (§15: 1 KiB).
	CompressMin = 1024
)

// SupportedEncoding reports whether name is an encoding this implementation decodes.
func SupportedEncoding(name string) bool {
	return name == EncodingGzip || name == EncodingZstd || name == EncodingIdentity
}

// zstdMaxWindow bounds the window a zstd frame may ask for (the decoder's memory).
const zstdMaxWindow = 8 << 20

var zstdDecoders = sync.Pool{New: func() any {
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(zstdMaxWindow))
	if err != nil {
		panic(err) // only bad options fail
	}
	return d
}}

var zstdEncoders = sync.Pool{New: func() any {
	e, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(1<<20))
	if err != nil {
		panic(err)
	}
	return e
}}

var gzipReaders sync.Pool // *gzip.Reader
var gzipWriters = sync.Pool{New: func() any { return gzip.NewWriter(nil) }}

// Decompress decodes one message payload of a direction whose encoding is enc (flag byte
// first) for a receiver whose MAX_MESSAGE_SIZE is limit. It never allocates more than
// limit+1 bytes of output. Errors are *CallError: INTERNAL for a missing or unknown flag,
// an unknown encoding or a body that does not decode; RESOURCE_EXHAUSTED past limit or for
// a zstd frame asking for a window over 8 MiB (protocol.md §15).
// With flag 0 the result aliases payload.
func Decompress(enc string, payload []byte, limit uint32) ([]byte, error) {
	out, _, err := DecompressCharged(enc, payload, limit, nil)
	return out, err
}

// NoRoomReason starts the message of the RESOURCE_EXHAUSTED status of a message that found
// no room in the memory budget to be decompressed.
const NoRoomReason = "no room in the memory budget to decompress"

// DecompressCharged is Decompress charging the decompressed buffer to budget (nil: none):
// it grows only by what budget.TryReserve grants (a refusal ends RESOURCE_EXHAUSTED,
// NoRoomReason, nothing left charged). It returns the bytes charged, which the caller gives
// back with budget.Release once it is done with the message (0 for flag 0: nothing new is
// held).
func DecompressCharged(enc string, payload []byte, limit uint32, budget *MemoryBudget) ([]byte, int64, error) {
	if len(payload) == 0 {
		return nil, 0, &CallError{Code: Internal, Message: "compressed message without its flag byte"}
	}
	body := payload[1:]
	switch payload[0] {
	case 0:
		if uint64(len(body)) > uint64(limit) {
			return nil, 0, &CallError{Code: ResourceExhausted, Message: fmt.Sprintf("message over MAX_MESSAGE_SIZE %d", limit)}
		}
		return body, 0, nil
	case 1:
	default:
		return nil, 0, &CallError{Code: Internal, Message: fmt.Sprintf("unknown compression flag %d", payload[0])}
	}
	return InflateCharged(enc, body, limit, budget)
}

// InflateCharged decompresses body (a message's bytes after its flag byte 1) as
// DecompressCharged does.
func InflateCharged(enc string, body []byte, limit uint32, budget *MemoryBudget) ([]byte, int64, error) {
	var r io.Reader
	switch enc {
	case EncodingZstd:
		d := zstdDecoders.Get().(*zstd.Decoder)
		if err := d.Reset(bytes.NewReader(body)); err != nil {
			zstdDecoders.Put(d)
			return nil, 0, &CallError{Code: Internal, Message: "zstd: " + err.Error()}
		}
		defer func() { _ = d.Reset(nil); zstdDecoders.Put(d) }()
		r = d
	case EncodingGzip:
		g, _ := gzipReaders.Get().(*gzip.Reader)
		var err error
		if g == nil {
			g, err = gzip.NewReader(bytes.NewReader(body))
		} else {
			err = g.Reset(bytes.NewReader(body))
		}
		if err != nil {
			return nil, 0, &CallError{Code: Internal, Message: "gzip: " + err.Error()}
		}
		g.Multistream(false)
		defer gzipReaders.Put(g)
		r = g
	default:
		return nil, 0, &CallError{Code: Internal, Message: fmt.Sprintf("message compressed with unknown encoding %q", enc)}
	}
	return readBounded(r, enc, limit, budget)
}

// inflateChunk is the size of the pieces a message is decompressed into before it is put
// together in one buffer of its exact size: a 60 MiB message allocates 60 MiB of pieces
// and its 60 MiB, not the 180 MiB of a buffer grown by half again and again. At most
// inflateChunksKept pieces (16 MiB) are kept for the next messages, the others left to the
// collector (a pool of every piece of a burst would hold the burst's size, uncharged).
const (
	inflateChunk      = 256 << 10
	inflateChunksKept = 64
)

var inflateChunks = make(chan *[]byte, inflateChunksKept)

// inflating holds a place for each message being decompressed past its first piece: at most
// one per CPU the Go scheduler runs (GOMAXPROCS at start) at once, the others wait for a
// place before their second piece. Decompressing is work for a CPU and nothing else (the
// whole compressed message is at hand), so more at once would go no faster, and each holds
// what it has decompressed so far: 20 bombs of 60 MiB on 20 connections, all inflating at
// once on 2 CPUs, held up to the whole memory budget between them, and the collector's
// garbage on top (VmHWM up to 1,141 MiB for a 1 GiB budget); one at a time per CPU, each is
// done and handed on before the next grows.
var inflating = make(chan struct{}, max(runtime.GOMAXPROCS(0), 1))

func getChunk() *[]byte {
	select {
	case c := <-inflateChunks:
		return c
	default:
		b := make([]byte, inflateChunk)
		return &b
	}
}

func putChunk(c *[]byte) {
	select {
	case inflateChunks <- c:
	default:
	}
}

// readBounded reads r to its end, never past limit+1 bytes, every byte charged to budget
// (if not nil) before it is read: into pooled chunks, then into one buffer of the message's
// exact size. It returns the bytes charged (the message's length); on error nothing stays
// charged.
func readBounded(r io.Reader, enc string, limit uint32, budget *MemoryBudget) (out []byte, _ int64, err error) {
	most := int64(limit) + 1
	var chunks []*[]byte
	var charged int64
	defer func() {
		for _, c := range chunks {
			putChunk(c)
		}
		if err != nil {
			budget.Release(charged)
		}
	}()
	var total int64
	for fill := 0; ; {
		if len(chunks) == 0 || fill == inflateChunk {
			allocated := func() {}
			if len(chunks) == 1 {
				inflating <- struct{}{}
				defer func() { <-inflating }()
			}
			if len(chunks) > 0 {
				allocated = heapgate.Wait(inflateChunk)
			}
			chunks, fill = append(chunks, getChunk()), 0
			allocated()
		}
		want := min(int64(inflateChunk-fill), most-total)
		if want == 0 {
			return nil, 0, &CallError{Code: ResourceExhausted, Message: fmt.Sprintf("decompressed message over MAX_MESSAGE_SIZE %d", limit)}
		}
		if budget != nil {
			if !budget.TryReserve(want) {
				return nil, 0, noRoom(enc, budget)
			}
			charged += want
		}
		n, rerr := r.Read((*chunks[len(chunks)-1])[fill : fill+int(want)])
		fill += n
		total += int64(n)
		if budget != nil {
			budget.Release(want - int64(n))
			charged -= want - int64(n)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return nil, 0, inflateErr(enc, rerr)
		}
	}
	if total > int64(limit) {
		return nil, 0, &CallError{Code: ResourceExhausted, Message: fmt.Sprintf("decompressed message over MAX_MESSAGE_SIZE %d", limit)}
	}
	if len(chunks) == 1 { // a small message (an empty one too: not nil)
		out = make([]byte, total)
		copy(out, *chunks[0])
		return out, charged, nil
	}
	// The pieces and the buffer they go to are both held while they are copied: both charged.
	if budget != nil {
		if !budget.TryReserve(total) {
			return nil, 0, noRoom(enc, budget)
		}
		charged += total
	}
	allocated := heapgate.Wait(total)
	out = make([]byte, 0, total)
	allocated()
	for _, c := range chunks {
		out = append(out, (*c)[:min(int64(inflateChunk), total-int64(len(out)))]...)
	}
	if budget != nil {
		budget.Release(total)
		charged -= total
	}
	return out, charged, nil
}

// noRoom is the error of a message the budget has no room to decompress.
func noRoom(enc string, budget *MemoryBudget) error {
	return &CallError{Code: ResourceExhausted, Message: fmt.Sprintf("%s a %s message (%d of %d bytes in use)", NoRoomReason, enc, budget.Used(), budget.Limit())}
}

// inflateErr is the error of a body that does not decompress.
func inflateErr(enc string, err error) error {
	if errors.Is(err, zstd.ErrWindowSizeExceeded) || errors.Is(err, zstd.ErrDecoderSizeExceeded) {
		// protocol.md §15: a window over 8 MiB, or a declared size over the limit.
		return &CallError{Code: ResourceExhausted, Message: enc + " body asks for too much memory: " + err.Error()}
	}
	return &CallError{Code: Internal, Message: enc + " body does not decode: " + err.Error()}
}

// Compress makes the payload of msg on a direction whose encoding is enc: flag 0 and msg
// for identity, a message under CompressMin or one that would not shrink; else flag 1
// and the compressed bytes.
func Compress(enc string, msg []byte) ([]byte, error) {
	if enc == "" || enc == EncodingIdentity {
		return msg, nil
	}
	if len(msg) >= CompressMin {
		out := make([]byte, 1, len(msg)/2+64)
		out[0] = 1
		switch enc {
		case EncodingZstd:
			e := zstdEncoders.Get().(*zstd.Encoder)
			out = e.EncodeAll(msg, out)
			zstdEncoders.Put(e)
		case EncodingGzip:
			w := gzipWriters.Get().(*gzip.Writer)
			b := bytes.NewBuffer(out)
			w.Reset(b)
			_, err := w.Write(msg)
			if err == nil {
				err = w.Close()
			}
			gzipWriters.Put(w)
			if err != nil {
				return nil, err
			}
			out = b.Bytes()
		default:
			return nil, errors.New("unknown encoding " + enc)
		}
		if len(out) < len(msg)+1 {
			return out, nil
		}
	} else if !SupportedEncoding(enc) {
		return nil, errors.New("unknown encoding " + enc)
	}
	out := make([]byte, len(msg)+1)
	copy(out[1:], msg)
	return out, nil
}
