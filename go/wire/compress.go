package wire

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"
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

// chargeStep is the least a charged decompression buffer grows by at once.
const chargeStep = 64 << 10

// readBounded reads r to its end into a buffer that never grows past limit+1 bytes, every
// byte of its capacity reserved in budget (if not nil) before it is allocated. It returns
// the bytes reserved; on error nothing stays reserved.
func readBounded(r io.Reader, enc string, limit uint32, budget *MemoryBudget) (out []byte, _ int64, err error) {
	var charged int64 // reserved so far
	most := int(limit) + 1
	defer func() {
		if err != nil {
			budget.Release(charged)
		}
	}()
	// grow makes a buffer of len(buf) bytes and a capacity of roomy (or, if the budget has
	// no room for that, just want) bytes.
	grow := func(buf []byte, want, roomy int) ([]byte, error) {
		size := roomy
		if budget != nil {
			switch {
			case budget.TryReserve(int64(roomy - cap(buf))):
			case want < roomy && budget.TryReserve(int64(want-cap(buf))):
				size = want
			default:
				return nil, &CallError{Code: ResourceExhausted, Message: fmt.Sprintf("%s a %s message (%d of %d bytes in use)", NoRoomReason, enc, budget.Used(), budget.Limit())}
			}
			charged += int64(size - cap(buf))
		}
		nb := make([]byte, len(buf), size)
		copy(nb, buf)
		return nb, nil
	}
	buf, err := grow(nil, min(most, 4096), min(most, 4096))
	if err != nil {
		return nil, 0, err
	}
	for {
		if len(buf) == cap(buf) {
			if len(buf) >= most {
				return nil, 0, &CallError{Code: ResourceExhausted, Message: fmt.Sprintf("decompressed message over MAX_MESSAGE_SIZE %d", limit)}
			}
			roomy := min(most, 2*cap(buf))
			if budget != nil {
				roomy = min(most, cap(buf)+max(chargeStep, cap(buf)/2))
			}
			if buf, err = grow(buf, min(most, cap(buf)+chargeStep), roomy); err != nil {
				return nil, 0, err
			}
		}
		n, rerr := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if rerr == io.EOF {
			break
		}
		if errors.Is(rerr, zstd.ErrWindowSizeExceeded) || errors.Is(rerr, zstd.ErrDecoderSizeExceeded) {
			// protocol.md §15: a window over 8 MiB, or a declared size over the limit.
			return nil, 0, &CallError{Code: ResourceExhausted, Message: enc + " body asks for too much memory: " + rerr.Error()}
		}
		if rerr != nil {
			return nil, 0, &CallError{Code: Internal, Message: enc + " body does not decode: " + rerr.Error()}
		}
	}
	if len(buf) > int(limit) {
		return nil, 0, &CallError{Code: ResourceExhausted, Message: fmt.Sprintf("decompressed message over MAX_MESSAGE_SIZE %d", limit)}
	}
	return buf, charged, nil
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
