package topspin

import (
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"
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
