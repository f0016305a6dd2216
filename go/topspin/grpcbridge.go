package topspin

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync"

	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	_ "google.golang.org/grpc/encoding/gzip" // the gRPC face decodes and answers gzip
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	spb "google.golang.org/genproto/googleapis/rpc/status"
)

// KeyStatusDetails is the trailer that carries a status's details (an encoded
// google.rpc.Status, protocol.md §5.1); the gRPC face sends it as grpc-status-details-bin.
const KeyStatusDetails = "topspin-status-details-bin"

// bridge serves every gRPC call the grpc-go server has no service for: it finds the method's
// Handler and runs it on a ServerStream whose face is the gRPC stream.
func (s *Server) bridge(_ any, gs grpc.ServerStream) error {
	ctx := gs.Context()
	method, _ := grpc.MethodFromServerStream(gs)
	entry, ok := s.handlers[method]
	if !ok {
		return status.Errorf(codes.Unimplemented, "unknown method %s", method)
	}
	in, _ := metadata.FromIncomingContext(ctx)
	if codec := grpcCodec(in); !acceptsCodec(entry.codecs, codec) {
		return status.Errorf(codes.Unimplemented, "codec %d not supported by %s", codec, method)
	}
	if s.opts.memoryBudget().Spent() {
		return status.Error(codes.ResourceExhausted, "process memory budget for incoming messages exhausted")
	}
	md := fromGRPCMetadata(in)
	if n, most := md.Size(), int(s.opts.settings.MaxMetadataSize); n > most {
		return status.Errorf(codes.ResourceExhausted, "request metadata of %d bytes exceeds this server's limit of %d bytes (max_metadata_size)", n, most)
	}
	s.compressFor(ctx)
	g := &grpcCall{gs: gs, ctx: ctx, budget: s.opts.memoryBudget()}
	g.gzip = s.gzipReader(ctx)
	ss := &ServerStream{method: method, md: md, g: g, srv: s, kind: entry.kind}
	ss.deadline, ss.hasDL = ctx.Deadline()
	s.grpcCalls.Add(1)
	defer s.grpcCalls.Add(-1)
	return g.finish(callHandler(entry.h, ss))
}

// compressFor compresses a gRPC call's responses with the server's WithCompression encoding
// when the client lists it in grpc-accept-encoding (otherwise grpc-go answers in the
// request's encoding, if any).
func (s *Server) compressFor(ctx context.Context) {
	want := s.opts.compress
	if want == "" || want == wire.EncodingIdentity {
		return
	}
	if accepted, err := grpc.ClientSupportedCompressors(ctx); err == nil {
		for _, a := range accepted {
			if a == want {
				_ = grpc.SetSendCompressor(ctx, want)
				return
			}
		}
	}
}

// callHandler runs h, turning a panic into INTERNAL.
func callHandler(h Handler, ss *ServerStream) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &Status{Code: Internal, Message: fmt.Sprint("handler panicked: ", r)}
		}
	}()
	return runHandler(h, ss)
}

// grpcCodec is the topspin codec of a gRPC call's content-type.
func grpcCodec(md metadata.MD) uint8 {
	ct := ""
	if v := md.Get("content-type"); len(v) > 0 {
		ct = v[0]
	}
	switch {
	case strings.HasSuffix(ct, "+json"):
		return CodecJSON
	case strings.HasSuffix(ct, "+raw"):
		return CodecRaw
	}
	return CodecProto
}

// acceptsCodec: a handler takes its codecs, and a raw one takes any bytes.
func acceptsCodec(codecs []uint8, k uint8) bool {
	for _, c := range codecs {
		if c == k || c == CodecRaw {
			return true
		}
	}
	return false
}

// fromGRPCMetadata is a gRPC call's request metadata in topspin's form (keys sorted; the
// HTTP/2 pseudo-headers and content-type left out).
func fromGRPCMetadata(md metadata.MD) Metadata {
	keys := make([]string, 0, len(md))
	for k := range md {
		if !strings.HasPrefix(k, ":") && k != "content-type" && k != "te" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out Metadata
	for _, k := range keys {
		for _, v := range md[k] {
			out = append(out, MD(k, v)...)
		}
	}
	return out
}

// toGRPCMetadata is topspin metadata for gRPC: the reserved topspin-* keys are left out, and
// the status details returned apart.
func toGRPCMetadata(md Metadata) (out metadata.MD, details []byte) {
	for _, e := range md {
		switch {
		case e.Key == KeyStatusDetails:
			details = []byte(e.Value)
		case strings.HasPrefix(e.Key, "topspin-"):
		default:
			if out == nil {
				out = metadata.MD{}
			}
			out[e.Key] = append(out[e.Key], e.Value)
		}
	}
	return out, details
}

// grpcCall is a ServerStream's gRPC side.
type grpcCall struct {
	gs  grpc.ServerStream
	ctx context.Context

	// The request message the handler took last is charged to the memory budget until the
	// next one arrives or the handler returns (a decompressed one with what its decompression
	// reserved, see grpcCharged).
	budget *wire.MemoryBudget
	held   int64
	gzip   *grpcGzip // reads the request messages of a gzip call (nil: grpc-go does)

	mu      sync.Mutex
	trailer Metadata
}

func (g *grpcCall) recv() ([]byte, error) {
	var m grpcMsg
	var err error
	if g.gzip != nil {
		err = g.gzip.recv(&m)
	} else {
		err = g.gs.RecvMsg(&m)
	}
	if err != nil {
		if err == io.EOF {
			return nil, io.EOF
		}
		return nil, fromGRPCError(err)
	}
	g.release()
	if m.charge.refused != "" {
		return nil, &Status{Code: ResourceExhausted, Message: m.charge.refused}
	}
	if m.charge.n > 0 && m.charge.budget == g.budget {
		g.held = m.charge.n // reserved while it was decompressed
	} else {
		m.charge.budget.Release(m.charge.n)
		g.held = int64(len(m.b))
		g.budget.Charge(g.held)
	}
	return m.b, nil
}

// grpcMsg is a request message for the bridge, with the charge of its decompression.
type grpcMsg struct {
	b      []byte
	charge grpcCharge
}

// release gives back the charge of the message the handler held.
func (g *grpcCall) release() {
	if g.held > 0 {
		g.budget.Release(g.held)
		g.held = 0
	}
}

func (g *grpcCall) send(msg []byte) error {
	if err := g.gs.SendMsg(&msg); err != nil {
		return fromGRPCError(err)
	}
	return nil
}

func (g *grpcCall) setHeader(md Metadata) {
	if m, _ := toGRPCMetadata(md); len(m) > 0 {
		_ = g.gs.SetHeader(m)
	}
}

func (g *grpcCall) setTrailer(md Metadata) {
	g.mu.Lock()
	g.trailer = append(g.trailer, md...)
	g.mu.Unlock()
}

func (g *grpcCall) peer() net.Addr {
	if p, ok := peer.FromContext(g.ctx); ok {
		return p.Addr
	}
	return nil
}

func (g *grpcCall) tls() *tls.ConnectionState {
	if p, ok := peer.FromContext(g.ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			return &ti.State
		}
	}
	return nil
}

// finish turns a handler's result into the gRPC status and trailers.
func (g *grpcCall) finish(err error) error {
	g.release()
	st := StatusOf(err)
	g.mu.Lock()
	trailers := g.trailer
	g.mu.Unlock()
	if st != nil {
		trailers = append(trailers[:len(trailers):len(trailers)], st.Trailers...)
	}
	md, details := toGRPCMetadata(trailers)
	if len(md) > 0 {
		g.gs.SetTrailer(md)
	}
	if st == nil || st.Code == OK {
		return nil
	}
	if len(st.Headers) > 0 {
		// A failing status's headers (protocol.md §5.4): grpc-go sends headers set and not
		// sent yet in a HEADERS frame before the trailers (no trailers-only response).
		g.setHeader(st.Headers)
	}
	gst := status.New(codes.Code(st.Code), st.Message)
	if details != nil {
		p := new(spb.Status)
		if proto.Unmarshal(details, p) == nil {
			p.Code, p.Message = int32(st.Code), st.Message
			gst = status.FromProto(p)
		}
	}
	return gst.Err()
}

// fromGRPCError is a grpc-go error as a *Status.
func fromGRPCError(err error) error {
	if st, ok := status.FromError(err); ok {
		return &Status{Code: Code(st.Code()), Message: st.Message()}
	}
	return StatusOf(err)
}

// bridgeCodec carries raw bytes for the bridge and protobuf messages for the services
// registered on the gRPC face itself (RegisterGRPCService).
type bridgeCodec struct{}

func (bridgeCodec) Name() string { return "proto" }

func (bridgeCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *[]byte:
		return mem.BufferSlice{mem.SliceBuffer(*m)}, nil
	case proto.Message:
		b, err := proto.Marshal(m)
		return mem.BufferSlice{mem.SliceBuffer(b)}, err
	}
	return nil, fmt.Errorf("topspin: cannot marshal %T", v)
}

func (bridgeCodec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *grpcMsg:
		if len(data) == 1 {
			if sb, ok := data[0].(mem.SliceBuffer); ok {
				if m.charge = takeCharge(sb); m.charge != (grpcCharge{}) {
					// grpcCharged's output: taken as it is, with its charge.
					m.b = sb[:len(sb):len(sb)]
					return nil
				}
			}
		}
		m.b = data.Materialize()
		return nil
	case *[]byte:
		*m = data.Materialize()
		releaseCharge(data)
		return nil
	case proto.Message:
		if c := releaseCharge(data); c.refused != "" {
			return status.Error(codes.ResourceExhausted, c.refused)
		}
		return proto.Unmarshal(data.Materialize(), m)
	}
	return fmt.Errorf("topspin: cannot unmarshal into %T", v)
}

// releaseCharge gives back the charge of a decompressed message that is copied, and
// returns it.
func releaseCharge(data mem.BufferSlice) grpcCharge {
	var c grpcCharge
	if len(data) == 1 {
		if sb, ok := data[0].(mem.SliceBuffer); ok {
			c = takeCharge(sb)
			c.budget.Release(c.n)
		}
	}
	return c
}
