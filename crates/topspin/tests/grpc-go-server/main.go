// A grpc-go server for topspin's gRPC client mode (tests/grpc_client.rs, the `grpc_go_*`
// tests, run by scripts/test-grpcclient.sh). It serves every method through grpc-go's
// unknown-service handler with a raw-bytes codec, so no generated code is needed. It prints
// "listening <port>" once it accepts connections.
package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	_ "google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// raw passes message bytes through as they are.
type raw struct{}

func (raw) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (raw) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (raw) Name() string { return "proto" }

var cancelled atomic.Int64

func handle(_ any, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	md, _ := metadata.FromIncomingContext(stream.Context())
	recv := func() ([]byte, error) {
		var m []byte
		err := stream.RecvMsg(&m)
		return m, err
	}
	send := func(m []byte) error { return stream.SendMsg(&m) }
	switch method {
	case "/test.T/Echo":
		m, err := recv()
		if err != nil {
			return err
		}
		out := metadata.MD{}
		if v := md.Get("x-user"); len(v) > 0 {
			out.Set("x-echo-user", v[0])
		}
		if v := md.Get("x-raw-bin"); len(v) > 0 {
			out.Set("x-echo-raw-bin", v[0])
		}
		if dl, ok := stream.Context().Deadline(); ok {
			// grpc-timeout, as grpc-go turned it into the handler's deadline.
			out.Set("x-deadline-ms", fmt.Sprint(time.Until(dl).Milliseconds()))
		}
		if err := stream.SetHeader(out); err != nil {
			return err
		}
		stream.SetTrailer(metadata.Pairs("x-trailer", "t"))
		return send(m)
	case "/test.T/Fail":
		if _, err := recv(); err != nil {
			return err
		}
		detail, _ := anypb.New(&spb.Status{Code: 7, Message: "inner"})
		st := &spb.Status{Code: int32(codes.NotFound), Message: "no key 🍎 (100% gone)", Details: []*anypb.Any{detail}}
		stream.SetTrailer(metadata.Pairs("x-why-bin", string([]byte{9, 0, 9})))
		return status.FromProto(st).Err()
	case "/test.T/Slow":
		if _, err := recv(); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			cancelled.Add(1)
			return stream.Context().Err()
		case <-time.After(30 * time.Second):
			return send([]byte("late"))
		}
	case "/test.T/Cancelled":
		if _, err := recv(); err != nil {
			return err
		}
		return send([]byte(fmt.Sprint(cancelled.Load())))
	case "/test.T/Count":
		m, err := recv()
		if err != nil {
			return err
		}
		n := 0
		if len(m) > 0 {
			n = int(m[0])
		}
		for i := 0; i < n; i++ {
			if err := send([]byte(fmt.Sprintf("m%d", i))); err != nil {
				return err
			}
		}
		return nil
	case "/test.T/Sum":
		var all bytes.Buffer
		for {
			m, err := recv()
			if err == io.EOF {
				return send(all.Bytes())
			}
			if err != nil {
				return err
			}
			all.Write(m)
		}
	case "/test.T/Chat":
		for {
			m, err := recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if err := send([]byte(strings.ToUpper(string(m)))); err != nil {
				return err
			}
		}
	}
	return status.Errorf(codes.Unimplemented, "no method %s", method)
}

func main() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s := grpc.NewServer(grpc.ForceServerCodec(raw{}), grpc.UnknownServiceHandler(handle),
		grpc.MaxRecvMsgSize(8<<20))
	fmt.Printf("listening %d\n", l.Addr().(*net.TCPAddr).Port)
	go func() {
		// Ends with the test: stdin closes when the parent goes.
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	if err := s.Serve(l); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
