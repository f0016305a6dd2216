// A grpc-go client of a topspin server's gRPC face (run by scripts/test-grpc.sh against
// examples/kvstore's server). The message types are built at run time from kv.proto
// (protocompile + dynamicpb), and calls go through grpc.ClientConn.Invoke / NewStream with
// grpc-go's own proto codec, so there is no generated code and no protoc.
//
// Usage: grpc-go-client HOST:PORT PROTO_DIR   (PROTO_DIR holds kv/v1/kv.proto)
//
// Every check prints one line; the program exits 1 if any fails.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/bufbuild/protocompile"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
)

// T bounds every call that is not about deadlines.
const T = 10 * time.Second

var (
	conn  *grpc.ClientConn
	types = map[string]protoreflect.MessageType{}
	// payloads records the sizes grpc-go saw on the wire (for the compression check).
	payloads = &sizes{}
	failed   int
)

// sizes is a stats.Handler that keeps the last payload sizes, compressed and not.
type sizes struct {
	outLen, outWire, inLen, inWire int
}

func (s *sizes) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (s *sizes) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (s *sizes) HandleConn(context.Context, stats.ConnStats)                       {}
func (s *sizes) HandleRPC(_ context.Context, st stats.RPCStats) {
	switch p := st.(type) {
	case *stats.OutPayload:
		s.outLen, s.outWire = p.Length, p.WireLength
	case *stats.InPayload:
		s.inLen, s.inWire = p.Length, p.CompressedLength
	}
}

// msg builds a kv.v1 message from field name/value pairs (a nested message as a proto.Message).
func msg(name string, kv ...any) *dynamicpb.Message {
	m := dynamicpb.NewMessage(types[name].Descriptor())
	for i := 0; i < len(kv); i += 2 {
		f := m.Descriptor().Fields().ByName(protoreflect.Name(kv[i].(string)))
		if f == nil {
			panic("no field " + kv[i].(string) + " in " + name)
		}
		switch v := kv[i+1].(type) {
		case proto.Message:
			m.Set(f, protoreflect.ValueOfMessage(v.ProtoReflect()))
		default:
			m.Set(f, protoreflect.ValueOf(v))
		}
	}
	return m
}

func empty(name string) *dynamicpb.Message { return dynamicpb.NewMessage(types[name].Descriptor()) }

// get reads a field of a message ("" for unset strings, 0 for numbers).
func get(m proto.Message, field string) protoreflect.Value {
	r := m.ProtoReflect()
	return r.Get(r.Descriptor().Fields().ByName(protoreflect.Name(field)))
}

func str(m proto.Message, field string) string { return get(m, field).String() }

func method(name string) string { return "/kv.v1.Store/" + name }

// check runs one check and prints its line.
func check(name string, f func() error) {
	if err := f(); err != nil {
		failed++
		fmt.Printf("FAIL: %s: %v\n", name, err)
		return
	}
	fmt.Printf("ok: grpc-go %s\n", name)
}

func ctxT() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), T)
}

func put(ctx context.Context, key, value string, opts ...grpc.CallOption) (uint64, error) {
	resp := empty("kv.v1.PutResponse")
	err := conn.Invoke(ctx, method("Put"), msg("kv.v1.PutRequest", "key", key, "value", value), resp, opts...)
	return get(resp, "version").Uint(), err
}

func getKey(ctx context.Context, key string, opts ...grpc.CallOption) (proto.Message, error) {
	resp := empty("kv.v1.Entry")
	err := conn.Invoke(ctx, method("Get"), msg("kv.v1.GetRequest", "key", key), resp, opts...)
	return resp, err
}

// wantCode checks that err is a gRPC status with code c.
func wantCode(err error, c codes.Code) error {
	if err == nil {
		return fmt.Errorf("no error, want %v", c)
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != c {
		return fmt.Errorf("got %v, want %v", err, c)
	}
	return nil
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: grpc-go-client HOST:PORT PROTO_DIR")
		os.Exit(2)
	}
	target, protoDir := os.Args[1], os.Args[2]
	compiler := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{protoDir}}),
	}
	files, err := compiler.Compile(context.Background(), "kv/v1/kv.proto")
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpc-go-client: compiling kv.proto:", err)
		os.Exit(2)
	}
	msgs := files[0].Messages()
	for i := 0; i < msgs.Len(); i++ {
		mt := dynamicpb.NewMessageType(msgs.Get(i))
		types[string(msgs.Get(i).FullName())] = mt
		// Registered so that status.Details() can unpack a kv.v1.Entry detail.
		if err := protoregistry.GlobalTypes.RegisterMessage(mt); err != nil {
			fmt.Fprintln(os.Stderr, "grpc-go-client:", err)
			os.Exit(2)
		}
	}
	conn, err = grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(payloads))
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpc-go-client:", err)
		os.Exit(2)
	}
	defer conn.Close()

	check("unary Put then Get", func() error {
		ctx, cancel := ctxT()
		defer cancel()
		v, err := put(ctx, "go", "1")
		if err != nil || v != 1 {
			return fmt.Errorf("Put: version %d, %v", v, err)
		}
		e, err := getKey(ctx, "go")
		if err != nil || str(e, "value") != "1" || get(e, "version").Uint() != 1 {
			return fmt.Errorf("Get: %v, %v", e, err)
		}
		return nil
	})

	check("server streaming Watch (an existing entry, then a change made while watching)", func() error {
		ctx, cancel := ctxT()
		defer cancel()
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method("Watch"))
		if err != nil {
			return err
		}
		if err := s.SendMsg(msg("kv.v1.WatchRequest", "prefix", "go", "include_existing", true)); err != nil {
			return err
		}
		if err := s.CloseSend(); err != nil {
			return err
		}
		ev := empty("kv.v1.Event")
		if err := s.RecvMsg(ev); err != nil {
			return fmt.Errorf("first event: %w", err)
		}
		if p := get(ev, "put").Message().Interface(); str(p, "key") != "go" || str(p, "value") != "1" {
			return fmt.Errorf("first event %v", ev)
		}
		if _, err := put(ctx, "go2", "2"); err != nil {
			return err
		}
		ev = empty("kv.v1.Event")
		if err := s.RecvMsg(ev); err != nil {
			return fmt.Errorf("second event: %w", err)
		}
		if p := get(ev, "put").Message().Interface(); str(p, "key") != "go2" {
			return fmt.Errorf("second event %v", ev)
		}
		return nil
	})

	check("client streaming Apply", func() error {
		ctx, cancel := ctxT()
		defer cancel()
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, method("Apply"))
		if err != nil {
			return err
		}
		for _, m := range []proto.Message{
			msg("kv.v1.Mutation", "put", msg("kv.v1.PutRequest", "key", "goa", "value", "x")),
			msg("kv.v1.Mutation", "put", msg("kv.v1.PutRequest", "key", "gob", "value", "y")),
			msg("kv.v1.Mutation", "delete", msg("kv.v1.DeleteRequest", "key", "go2")),
			msg("kv.v1.Mutation", "delete", msg("kv.v1.DeleteRequest", "key", "go-absent")),
		} {
			if err := s.SendMsg(m); err != nil {
				return err
			}
		}
		if err := s.CloseSend(); err != nil {
			return err
		}
		sum := empty("kv.v1.ApplySummary")
		if err := s.RecvMsg(sum); err != nil {
			return err
		}
		if get(sum, "puts").Uint() != 2 || get(sum, "deletes").Uint() != 1 {
			return fmt.Errorf("summary %v, want puts 2, deletes 1", sum)
		}
		return nil
	})

	check("bidi streaming GetMany (each answer read before the next key is sent)", func() error {
		ctx, cancel := ctxT()
		defer cancel()
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method("GetMany"))
		if err != nil {
			return err
		}
		for _, kv := range [][2]string{{"go", "1"}, {"goa", "x"}, {"gob", "y"}} {
			if err := s.SendMsg(msg("kv.v1.GetRequest", "key", kv[0])); err != nil {
				return err
			}
			e := empty("kv.v1.Entry")
			if err := s.RecvMsg(e); err != nil {
				return fmt.Errorf("%s: %w", kv[0], err)
			}
			if str(e, "key") != kv[0] || str(e, "value") != kv[1] {
				return fmt.Errorf("entry %v, want %s=%s", e, kv[0], kv[1])
			}
		}
		if err := s.CloseSend(); err != nil {
			return err
		}
		if err := s.RecvMsg(empty("kv.v1.Entry")); err != io.EOF {
			return fmt.Errorf("after CloseSend: %v, want io.EOF (status OK)", err)
		}
		return nil
	})

	check("deadline: a Watch on which nothing happens ends DEADLINE_EXCEEDED", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method("Watch"))
		if err != nil {
			return wantCode(err, codes.DeadlineExceeded)
		}
		if err := s.SendMsg(msg("kv.v1.WatchRequest", "prefix", "go-nothing-here")); err != nil && err != io.EOF {
			return err
		}
		_ = s.CloseSend()
		err = s.RecvMsg(empty("kv.v1.Event"))
		if err := wantCode(err, codes.DeadlineExceeded); err != nil {
			return err
		}
		if d := time.Since(start); d > 5*time.Second {
			return fmt.Errorf("took %v", d)
		}
		return nil
	})

	check("NOT_FOUND with its message", func() error {
		ctx, cancel := ctxT()
		defer cancel()
		_, err := getKey(ctx, "go-missing")
		if err := wantCode(err, codes.NotFound); err != nil {
			return err
		}
		if m := status.Convert(err).Message(); m != `no key "go-missing"` {
			return fmt.Errorf("message %q", m)
		}
		return nil
	})

	check("FAILED_PRECONDITION with details (a kv.v1.Entry, via status.Details())", func() error {
		ctx, cancel := ctxT()
		defer cancel()
		req := msg("kv.v1.PutRequest", "key", "go", "value", "3", "expected_version", uint64(7))
		err := conn.Invoke(ctx, method("Put"), req, empty("kv.v1.PutResponse"))
		if err := wantCode(err, codes.FailedPrecondition); err != nil {
			return err
		}
		st := status.Convert(err)
		if !strings.Contains(st.Message(), "version 1, not 7") {
			return fmt.Errorf("message %q", st.Message())
		}
		if n := len(st.Proto().GetDetails()); n != 1 {
			return fmt.Errorf("%d details in Proto().Details, want 1", n)
		}
		if u := st.Proto().GetDetails()[0].GetTypeUrl(); u != "type.googleapis.com/kv.v1.Entry" {
			return fmt.Errorf("detail type %q", u)
		}
		details := st.Details()
		if len(details) != 1 {
			return fmt.Errorf("details %v", details)
		}
		e, ok := details[0].(proto.Message)
		if !ok {
			return fmt.Errorf("detail not unpacked: %v", details[0])
		}
		if str(e, "key") != "go" || str(e, "value") != "1" || get(e, "version").Uint() != 1 {
			return fmt.Errorf("detail entry %v", e)
		}
		return nil
	})

	check("errors on streams: NOT_FOUND after a message (GetMany), details at the end of Apply", func() error {
		ctx, cancel := ctxT()
		defer cancel()
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method("GetMany"))
		if err != nil {
			return err
		}
		for _, k := range []string{"goa", "go-missing"} {
			if err := s.SendMsg(msg("kv.v1.GetRequest", "key", k)); err != nil && err != io.EOF {
				return err
			}
		}
		_ = s.CloseSend()
		e := empty("kv.v1.Entry")
		if err := s.RecvMsg(e); err != nil || str(e, "key") != "goa" {
			return fmt.Errorf("first answer %v, %v", e, err)
		}
		if err := wantCode(s.RecvMsg(empty("kv.v1.Entry")), codes.NotFound); err != nil {
			return fmt.Errorf("GetMany: %w", err)
		}
		a, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, method("Apply"))
		if err != nil {
			return err
		}
		stale := msg("kv.v1.PutRequest", "key", "goa", "value", "z", "expected_version", uint64(5))
		if err := a.SendMsg(msg("kv.v1.Mutation", "put", stale)); err != nil && err != io.EOF {
			return err
		}
		_ = a.CloseSend()
		err = a.RecvMsg(empty("kv.v1.ApplySummary"))
		if err := wantCode(err, codes.FailedPrecondition); err != nil {
			return fmt.Errorf("Apply: %w", err)
		}
		d := status.Convert(err).Details()
		if len(d) != 1 {
			return fmt.Errorf("Apply details %v", d)
		}
		if e, ok := d[0].(proto.Message); !ok || str(e, "key") != "goa" || str(e, "value") != "x" {
			return fmt.Errorf("Apply detail %v", d[0])
		}
		return nil
	})

	check("metadata out (ascii and -bin) and back (response header and trailer, unary and stream)", func() error {
		ctx, cancel := ctxT()
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "x-client", "grpc-go", "x-blob-bin", string([]byte{0, 1, 0xff}))
		var header, trailer metadata.MD
		if _, err := getKey(ctx, "go", grpc.Header(&header), grpc.Trailer(&trailer)); err != nil {
			return err
		}
		if ct := header.Get("content-type"); len(ct) != 1 || !strings.HasPrefix(ct[0], "application/grpc") {
			return fmt.Errorf("header content-type %v (header %v)", ct, header)
		}
		if ae := header.Get("grpc-accept-encoding"); len(ae) == 0 || !strings.Contains(ae[0], "gzip") {
			return fmt.Errorf("header grpc-accept-encoding %v (header %v)", ae, header)
		}
		if trailer == nil {
			return errors.New("no trailer delivered")
		}
		// A stream: Header() waits for the response headers, Trailer() is there after EOF.
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method("GetMany"))
		if err != nil {
			return err
		}
		if err := s.SendMsg(msg("kv.v1.GetRequest", "key", "go")); err != nil {
			return err
		}
		h, err := s.Header()
		if err != nil {
			return err
		}
		if ct := h.Get("content-type"); len(ct) != 1 || !strings.HasPrefix(ct[0], "application/grpc") {
			return fmt.Errorf("stream header %v", h)
		}
		_ = s.CloseSend()
		if err := s.RecvMsg(empty("kv.v1.Entry")); err != nil {
			return err
		}
		if err := s.RecvMsg(empty("kv.v1.Entry")); err != io.EOF {
			return fmt.Errorf("stream end: %v", err)
		}
		if s.Trailer() == nil {
			return errors.New("no stream trailer")
		}
		return nil
	})

	check("gzip: a compressed Put and Get of a 64 KiB value", func() error {
		ctx, cancel := ctxT()
		defer cancel()
		big := strings.Repeat("topspin gzip ", 64*1024/13)
		if _, err := put(ctx, "go-big", big, grpc.UseCompressor(gzip.Name)); err != nil {
			return err
		}
		reqLen, reqWire := payloads.outLen, payloads.outWire
		if reqWire >= reqLen/4 {
			return fmt.Errorf("request not compressed: %d bytes on the wire for %d", reqWire, reqLen)
		}
		e, err := getKey(ctx, "go-big", grpc.UseCompressor(gzip.Name))
		if err != nil {
			return err
		}
		if !bytes.Equal([]byte(str(e, "value")), []byte(big)) {
			return fmt.Errorf("value of %d bytes back, want %d", len(str(e, "value")), len(big))
		}
		// The server compresses responses only if its Config::compression says so.
		fmt.Printf("    (Put request %d bytes, %d on the wire; Get response %d bytes, %d on the wire)\n",
			reqLen, reqWire, payloads.inLen, payloads.inWire)
		return nil
	})

	check("flow control: a 3 MiB value up and back, 2000 GetMany keys sent while answers are read", func() error {
		ctx, cancel := ctxT()
		defer cancel()
		big := strings.Repeat("0123456789abcdef", 3<<20/16) // more than the 1 MiB stream window
		if _, err := put(ctx, "go-huge", big); err != nil {
			return err
		}
		e, err := getKey(ctx, "go-huge")
		if err != nil {
			return err
		}
		if str(e, "value") != big {
			return fmt.Errorf("value of %d bytes back, want %d", len(str(e, "value")), len(big))
		}
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method("GetMany"))
		if err != nil {
			return err
		}
		const n = 2000
		sent := make(chan error, 1)
		go func() {
			for i := 0; i < n; i++ {
				if err := s.SendMsg(msg("kv.v1.GetRequest", "key", "go")); err != nil {
					sent <- err
					return
				}
			}
			sent <- s.CloseSend()
		}()
		for i := 0; i < n; i++ {
			e := empty("kv.v1.Entry")
			if err := s.RecvMsg(e); err != nil {
				return fmt.Errorf("answer %d: %w", i, err)
			}
			if str(e, "key") != "go" {
				return fmt.Errorf("answer %d: %v", i, e)
			}
		}
		if err := s.RecvMsg(empty("kv.v1.Entry")); err != io.EOF {
			return fmt.Errorf("after %d answers: %v, want io.EOF", n, err)
		}
		return <-sent
	})

	check("cancellation: a Watch cancelled mid-stream ends CANCELED, the connection goes on", func() error {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method("Watch"))
		if err != nil {
			return err
		}
		if err := s.SendMsg(msg("kv.v1.WatchRequest", "prefix", "go", "include_existing", true)); err != nil {
			return err
		}
		_ = s.CloseSend()
		if err := s.RecvMsg(empty("kv.v1.Event")); err != nil {
			return fmt.Errorf("first event: %w", err)
		}
		done := make(chan error, 1)
		go func() {
			for {
				if err := s.RecvMsg(empty("kv.v1.Event")); err != nil {
					done <- err
					return
				}
			}
		}()
		time.Sleep(50 * time.Millisecond)
		cancel()
		select {
		case err := <-done:
			if err := wantCode(err, codes.Canceled); err != nil {
				return err
			}
		case <-time.After(T):
			return errors.New("RecvMsg did not return after cancel")
		}
		// The same connection still serves calls, and a change to a key the cancelled watch
		// covered is no trouble for the server.
		ctx2, cancel2 := ctxT()
		defer cancel2()
		if _, err := put(ctx2, "go", "after-cancel"); err != nil {
			return err
		}
		if e, err := getKey(ctx2, "go"); err != nil || str(e, "value") != "after-cancel" {
			return fmt.Errorf("after cancel: %v, %v", e, err)
		}
		return nil
	})

	if failed > 0 {
		fmt.Printf("grpc-go: %d check(s) failed\n", failed)
		os.Exit(1)
	}
	fmt.Println("grpc-go: every call kind, deadline, errors with details, metadata, gzip, cancellation: ok")
}
