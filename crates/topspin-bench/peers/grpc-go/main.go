// Command topspin-bench-grpc-go is topspin-bench's grpc-go peer (system `grpc-go`): the
// Bench service of proto/bench/v1/bench.proto served by grpc-go and called by grpc-go's
// generated client (protoc-gen-go + protoc-gen-go-grpc; benchpb/), default settings except
// the 64 MiB message limit every peer has. Like the Rust peers it prints `ready grpc-go`,
// then answers one JSON command per stdin line with one JSON line, until `quit` or EOF.
//
//	topspin-bench-grpc-go                        the peer: server and client in this process
//	topspin-bench-grpc-go --separate-processes   the peer, its server in a child process
//	topspin-bench-grpc-go --server-only          only the server: prints `listening ADDR`,
//	                                             serves until stdin closes (the Rust peers'
//	                                             grpc-go-server rows start it so)
//
// With --server-only, stdin takes the placement protocol of topspin-bench-common
// (placement.rs): `count on`, `count off` (allocation counting: runtime.MemStats' Mallocs and
// TotalAlloc), `allocs` (answers "ALLOCS BYTES").
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "topspin.bench/grpcgo/benchpb"
)

// maxMessage is 64 MiB, as every peer (grpc-go's default receive limit, 4 MiB, would refuse
// the 16 MiB workloads); the one non-default setting.
const maxMessage = 64 << 20

// conns is the number of client connections (throughput uses up to 4), as the Rust peers.
const conns = 4

type svc struct {
	pb.UnimplementedBenchServer
}

func (svc) Echo(_ context.Context, r *pb.EchoRequest) (*pb.EchoReply, error) {
	return &pb.EchoReply{Data: r.Data}, nil
}

func (svc) GetAnswer(_ context.Context, r *pb.AnswerRequest) (*pb.AnswerReply, error) {
	return &pb.AnswerReply{Answer: 41 + r.N}, nil
}

func (svc) GetBlob(_ context.Context, r *pb.BlobRequest) (*pb.BlobReply, error) {
	if r.Size > blobPoolSize {
		return nil, status.Error(codes.InvalidArgument, "blob too large")
	}
	return &pb.BlobReply{Data: blobPool()[:r.Size]}, nil
}

// GetStructs answers from the shared native data: protobuf-go messages are Go's native
// structs, and a Go server shares read-only ones rather than copying them.
func (svc) GetStructs(context.Context, *pb.StructsRequest) (*pb.StructsReply, error) {
	return &pb.StructsReply{Students: students()}, nil
}

func (svc) NymphUint32(_ context.Context, r *pb.Uint32Value) (*pb.Uint32Value, error) {
	return r, nil
}

func (svc) NymphDouble(_ context.Context, r *pb.DoubleValue) (*pb.DoubleValue, error) {
	return r, nil
}

func (svc) NymphArray(_ context.Context, r *pb.ArrayValue) (*pb.ArrayValue, error) {
	return r, nil
}

func (svc) NymphBlob(_ context.Context, r *pb.BlobValue) (*pb.BlobValue, error) {
	return r, nil
}

// startServer serves the Bench service on a loopback port and returns its address.
func startServer() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	s := grpc.NewServer(grpc.MaxRecvMsgSize(maxMessage), grpc.MaxSendMsgSize(maxMessage))
	pb.RegisterBenchServer(s, svc{})
	go func() { _ = s.Serve(l) }()
	return l.Addr().String(), nil
}

func main() {
	separate := flag.Bool("separate-processes", false, "the server in a child process of its own (this program with --server-only)")
	serverOnly := flag.Bool("server-only", false, "only the server: print `listening ADDR`, serve until stdin closes")
	flag.Parse()
	blobPool()
	students()
	var addr string
	var err error
	if *separate && !*serverOnly {
		addr, err = startServerProcess()
	} else {
		addr, err = startServer()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "topspin-bench-grpc-go:", err)
		os.Exit(1)
	}
	if *serverOnly {
		serveCounters(addr)
		return
	}
	var clients []pb.BenchClient
	for range conns {
		cc, err := grpc.NewClient(addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)))
		if err != nil {
			fmt.Fprintln(os.Stderr, "topspin-bench-grpc-go: client:", err)
			os.Exit(1)
		}
		// Connect before any timing (grpc.NewClient is lazy).
		cc.Connect()
		clients = append(clients, pb.NewBenchClient(cc))
	}
	serveCommands(clients)
}

// serveCommands is the peer's command loop: `ready grpc-go`, then one outcome per command.
func serveCommands(clients []pb.BenchClient) {
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready grpc-go")
	_ = out.Flush()
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 64<<10), 1<<20)
	for in.Scan() {
		line := bytes.TrimSpace(in.Bytes())
		if len(line) == 0 {
			continue
		}
		if string(line) == "quit" {
			break
		}
		var c cmd
		var o outcome
		if err := json.Unmarshal(line, &c); err != nil {
			o = failed(fmt.Errorf("bad command: %w", err))
		} else if call, err := callerOf(&c, clients); err != nil {
			o = failed(err)
		} else {
			o = run(&c, call, len(clients))
		}
		b, _ := json.Marshal(o)
		_, _ = out.Write(append(b, '\n'))
		_ = out.Flush()
	}
}

func check(what string, ok bool, got, want any) error {
	if ok {
		return nil
	}
	return fmt.Errorf("%s: got %v, want %v", what, got, want)
}

// checkBytes compares in full when full is set, else the length (touching the bytes once a
// page, as the Rust peers' touch()).
func checkBytes(what string, got, want []byte, full bool) error {
	if len(got) != len(want) {
		return fmt.Errorf("%s: got %d bytes, want %d", what, len(got), len(want))
	}
	if full && !bytes.Equal(got, want) {
		return fmt.Errorf("%s: bytes differ", what)
	}
	var s byte
	for i := 0; i < len(got); i += 4096 {
		s += got[i]
	}
	runtime.KeepAlive(s)
	return nil
}

// callerOf builds the series' input once and returns the call that uses it.
func callerOf(c *cmd, clients []pb.BenchClient) (caller, error) {
	ctx := context.Background()
	n := int(c.Size)
	if n > blobPoolSize {
		return nil, fmt.Errorf("size %d larger than 16 MiB", n)
	}
	echo := func(data []byte) caller {
		req := &pb.EchoRequest{Data: data}
		return func(i int, full bool) error {
			r, err := clients[i].Echo(ctx, req)
			if err != nil {
				return err
			}
			return checkBytes("echo", r.Data, data, full)
		}
	}
	switch c.Workload {
	case "echo":
		return echo(payload(n)), nil
	case "throughput", "burst", "allocs_echo":
		return echo(payload(20)), nil
	case "answer", "allocs_answer":
		req := &pb.AnswerRequest{N: 1}
		return func(i int, _ bool) error {
			r, err := clients[i].GetAnswer(ctx, req)
			if err != nil {
				return err
			}
			return check("answer", r.Answer == 42, r.Answer, 42)
		}, nil
	case "blob":
		req := &pb.BlobRequest{Size: uint32(n)}
		return func(i int, full bool) error {
			r, err := clients[i].GetBlob(ctx, req)
			if err != nil {
				return err
			}
			return checkBytes("blob", r.Data, blobPool()[:n], full)
		}, nil
	case "structs":
		return func(i int, full bool) error {
			r, err := clients[i].GetStructs(ctx, &pb.StructsRequest{})
			if err != nil {
				return err
			}
			if full {
				want := &pb.StructsReply{Students: students()}
				return check("structs", proto.Equal(r, want), "other students", "the ones sent")
			}
			return check("structs", len(r.Students) == k, len(r.Students), k)
		}, nil
	default:
		return nymphCaller(c, clients)
	}
}

// nymphCaller is callerOf for the NymphRPC workloads.
func nymphCaller(c *cmd, clients []pb.BenchClient) (caller, error) {
	ctx := context.Background()
	n := int(c.Size)
	switch c.Workload {
	case "nymph_uint32":
		req := &pb.Uint32Value{Value: 0xdeadbeef}
		return func(i int, _ bool) error {
			r, err := clients[i].NymphUint32(ctx, req)
			if err != nil {
				return err
			}
			return check("nymph_uint32", r.Value == req.Value, r.Value, req.Value)
		}, nil
	case "nymph_double":
		req := &pb.DoubleValue{Value: 3.141592653589793}
		return func(i int, _ bool) error {
			r, err := clients[i].NymphDouble(ctx, req)
			if err != nil {
				return err
			}
			return check("nymph_double", r.Value == req.Value, r.Value, req.Value)
		}, nil
	case "nymph_array":
		vals := make([]uint32, n)
		for i := range vals {
			vals[i] = uint32(i) * 2654435761
		}
		req := &pb.ArrayValue{Values: vals}
		return func(i int, _ bool) error {
			r, err := clients[i].NymphArray(ctx, req)
			if err != nil {
				return err
			}
			return check("nymph_array", slices.Equal(r.Values, vals), len(r.Values), len(vals))
		}, nil
	case "nymph_blob":
		data := payload(n)
		req := &pb.BlobValue{Data: data}
		return func(i int, full bool) error {
			r, err := clients[i].NymphBlob(ctx, req)
			if err != nil {
				return err
			}
			return checkBytes("nymph_blob", r.Data, data, full)
		}, nil
	}
	return nil, fmt.Errorf("unknown workload %s", c.Workload)
}
