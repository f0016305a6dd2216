package topspin

import (
	"context"
	"encoding/binary"
	"io"

	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// A gzip request on the gRPC face is charged to the server's memory budget as it inflates,
// as a zstd one (grpczstd.go). grpc-go takes one per-server decompressor, zstd's; its own
// gzip would inflate a message up to the max message size, uncharged, before the handler
// takes it. So the bridge reads a gzip call's messages from grpc-go's stream itself (as
// grpc-go's own parser does: a 5-byte prefix, then the message) and inflates them with
// grpcCharged. Where the stream does not offer these reads (another grpc-go), grpc-go
// decodes gzip as before.

// grpcRawStream is what grpc-go's stream under a call offers (its ServerTransportStream):
// the request's encoding and the request messages' bytes, window updates done as they are
// read.
type grpcRawStream interface {
	RecvCompress() string
	ReadMessageHeader(header []byte) error
	Read(n int) (mem.BufferSlice, error)
}

// grpcGzip reads and inflates a gzip call's request messages.
type grpcGzip struct {
	s grpcRawStream
	d grpcCharged
}

// gzipReader is the reader of a call whose requests are gzip (nil for any other call).
func (s *Server) gzipReader(ctx context.Context) *grpcGzip {
	rs, ok := grpc.ServerTransportStreamFromContext(ctx).(grpcRawStream)
	if !ok || rs.RecvCompress() != wire.EncodingGzip {
		return nil
	}
	return &grpcGzip{s: rs, d: grpcCharged{enc: wire.EncodingGzip, budget: s.opts.memoryBudget(), limit: grpcMaxRecv(&s.opts)}}
}

// recv reads the next request message into m (its charge with it), with the errors grpc-go's
// RecvMsg gives: io.EOF at the end of the requests, else a status error.
func (r *grpcGzip) recv(m *grpcMsg) error {
	var prefix [5]byte
	if err := r.s.ReadMessageHeader(prefix[:]); err != nil {
		return rawErr(err)
	}
	n := binary.BigEndian.Uint32(prefix[1:])
	if n > r.d.limit { // refused from its prefix, before any byte is read
		return status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", n, r.d.limit)
	}
	data, err := r.s.Read(int(n))
	if err != nil {
		return rawErr(err)
	}
	defer data.Free()
	switch prefix[0] {
	case 0:
		m.b = data.Materialize()
		return nil
	case 1:
	default:
		return status.Errorf(codes.Internal, "grpc: received unexpected payload format %d", prefix[0])
	}
	body := data.Materialize()
	if len(data) == 1 { // read in place: freed once inflated
		body = data[0].ReadOnlyData()
	}
	if m.b, m.charge, err = r.d.inflate(body); err != nil {
		return status.Errorf(codes.Internal, "grpc: failed to decompress the received message: %v", err)
	}
	return nil
}

// rawErr is an error of grpc-go's stream as its RecvMsg gives it.
func rawErr(err error) error {
	if err == io.ErrUnexpectedEOF {
		return status.Error(codes.Internal, err.Error())
	}
	return err
}
