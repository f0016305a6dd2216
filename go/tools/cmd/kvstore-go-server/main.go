// Command kvstore-go-server serves the kvstore example (examples/kvstore/proto/kv/v1/kv.proto)
// with the Go runtime: kvstore-go-server [tcp://127.0.0.1:50051 | unix:///path]. It prints
// "listening on ADDRESS" once ready and stops gracefully on SIGINT or SIGTERM. Native
// topspin and gRPC clients share the port; it serves grpc.health.v1 (kv.v1.Store and ""
// SERVING) and reflection (topspin.reflection.v1, grpc.reflection.v1 and v1alpha).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/topspin-rpc/topspin/go/examples/kvstore"
	"github.com/topspin-rpc/topspin/go/examples/kvstore/kvpb"
	"github.com/topspin-rpc/topspin/go/reflection"
	"github.com/topspin-rpc/topspin/go/topspin"
)

func main() {
	target := "tcp://127.0.0.1:50051"
	if len(os.Args) > 1 {
		target = os.Args[1]
	}
	l, err := topspin.Listen(target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvstore-go-server:", err)
		os.Exit(1)
	}
	s := topspin.NewServer()
	kvpb.RegisterStoreServer(s, kvstore.NewStore())
	s.EnableHealth().SetServingStatus("kv.v1.Store", topspin.HealthServing)
	reflection.Register(s)
	fmt.Printf("listening on %s://%s\n", l.Addr().Network(), l.Addr().String())
	stopped := make(chan struct{}) // a signal: closed, never sent on, so it holds nothing
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		s.GracefulStop()
		close(stopped)
	}()
	if err := s.Serve(l); err != nil {
		fmt.Fprintln(os.Stderr, "kvstore-go-server:", err)
		os.Exit(1)
	}
	<-stopped
}
