package topspin

import (
	"errors"
	"io"
	"sync"
	"unsafe"

	"github.com/klauspost/compress/zstd"
	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/grpc/encoding"
)

// The gRPC face decodes and answers zstd as well as gzip: a "zstd" compressor is registered
// with grpc-go (process-wide, unless the program registered one already). Its decoder takes
// no window over 8 MiB (as the native face, protocol.md §15) and runs without goroutines;
// grpc-go stops reading a message at its MaxRecvMsgSize.
func init() {
	if encoding.GetCompressor(grpcZstd{}.Name()) == nil {
		encoding.RegisterCompressor(grpcZstd{})
	}
}

const grpcZstdMaxWindow = 8 << 20

var grpcZstdDecoders = sync.Pool{New: func() any {
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(grpcZstdMaxWindow))
	if err != nil {
		panic(err) // only bad options fail
	}
	return d
}}

var grpcZstdEncoders = sync.Pool{New: func() any {
	e, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(1<<20))
	if err != nil {
		panic(err)
	}
	return e
}}

type grpcZstd struct{}

func (grpcZstd) Name() string { return "zstd" }

func (grpcZstd) Compress(w io.Writer) (io.WriteCloser, error) {
	e := grpcZstdEncoders.Get().(*zstd.Encoder)
	e.Reset(w)
	return &zstdWriter{e: e}, nil
}

func (grpcZstd) Decompress(r io.Reader) (io.Reader, error) {
	d := grpcZstdDecoders.Get().(*zstd.Decoder)
	if err := d.Reset(r); err != nil {
		grpcZstdDecoders.Put(d)
		return nil, err
	}
	return &zstdReader{d: d}, nil
}

// zstdWriter returns its encoder to the pool once closed.
type zstdWriter struct{ e *zstd.Encoder }

func (w *zstdWriter) Write(p []byte) (int, error) { return w.e.Write(p) }

func (w *zstdWriter) Close() error {
	err := w.e.Close()
	w.e.Reset(nil)
	grpcZstdEncoders.Put(w.e)
	return err
}

// zstdReader returns its decoder to the pool at the end of the message (a reader left
// unfinished, past the size limit, leaves its decoder to the garbage collector).
type zstdReader struct{ d *zstd.Decoder }

func (r *zstdReader) Read(p []byte) (int, error) {
	if r.d == nil {
		return 0, io.EOF
	}
	n, err := r.d.Read(p)
	if err != nil {
		_ = r.d.Reset(nil)
		grpcZstdDecoders.Put(r.d)
		r.d = nil
	}
	return n, err
}

// grpcCharged decodes the gRPC face's requests in one encoding for one server: the output
// is capped at the server's MAX_MESSAGE_SIZE and charged to its memory budget as it grows (a
// request that finds no room fails, and the bridge ends it RESOURCE_EXHAUSTED). The charge
// is handed to the call with the message and given back when the handler is done with it.
// zstd's is grpc-go's per-server decompressor (grpc.RPCDecompressor, which grpc-go prefers
// to the registered compressor); gzip's is used by the bridge itself (grpcgzip.go), as
// grpc-go takes one per-server decompressor only.
type grpcCharged struct {
	enc    string
	budget *wire.MemoryBudget
	limit  uint32
}

func (d grpcCharged) Type() string { return d.enc }

// Do decodes a message for grpc-go, its charge kept by the output's first byte
// (grpcCharges) until bridgeCodec.Unmarshal takes it.
func (d grpcCharged) Do(r io.Reader) ([]byte, error) {
	body, err := io.ReadAll(r) // the compressed message: within MaxRecvMsgSize already
	if err != nil {
		return nil, err
	}
	out, c, err := d.inflate(body)
	if err == nil && c != (grpcCharge{}) {
		grpcCharges.Store(unsafe.SliceData(out), c)
	}
	return out, err
}

// inflate decodes body: the message and its charge, or a one-byte mark and the refusal of a
// message that found no room or passed the limit (grpc-go would end the call INTERNAL with
// a decompressor's error: the mark carries the refusal to the bridge, which ends the call
// RESOURCE_EXHAUSTED).
func (d grpcCharged) inflate(body []byte) ([]byte, grpcCharge, error) {
	out, charged, err := wire.InflateCharged(d.enc, body, d.limit, d.budget)
	var ce *wire.CallError
	if errors.As(err, &ce) && ce.Code == wire.ResourceExhausted {
		return make([]byte, 1), grpcCharge{refused: ce.Message}, nil
	}
	if err != nil {
		return nil, grpcCharge{}, err
	}
	if charged > 0 && len(out) == 0 { // nothing to hold the charge by
		d.budget.Release(charged)
		charged = 0
	}
	if charged == 0 {
		return out, grpcCharge{}, nil
	}
	return out, grpcCharge{budget: d.budget, n: charged}, nil
}

// grpcCharge is the memory budget charge of a decompressed gRPC message, from its
// decompression until bridgeCodec.Unmarshal takes it (by the message's first byte).
type grpcCharge struct {
	budget  *wire.MemoryBudget
	n       int64
	refused string // not a message: the RESOURCE_EXHAUSTED reason it was refused for
}

var grpcCharges sync.Map // *byte -> grpcCharge

// takeCharge removes and returns the charge of the decompressed message b (zero: none).
func takeCharge(b []byte) grpcCharge {
	if len(b) == 0 {
		return grpcCharge{}
	}
	if v, ok := grpcCharges.LoadAndDelete(unsafe.SliceData(b)); ok {
		return v.(grpcCharge)
	}
	return grpcCharge{}
}
