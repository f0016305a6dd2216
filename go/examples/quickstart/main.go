// Command quickstart serves the kvstore example with the Go runtime and calls it with the
// generated client: one unary call, one server stream, metadata and an error status.
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/topspin-rpc/topspin/go/examples/kvstore"
	"github.com/topspin-rpc/topspin/go/examples/kvstore/kvpb"
	"github.com/topspin-rpc/topspin/go/topspin"
)

func main() {
	// Server: register the generated service and serve (tcp://host:port or unix:///path).
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := topspin.NewServer()
	kvpb.RegisterStoreServer(srv, kvstore.NewStore())
	go srv.Serve(l)
	defer srv.GracefulStop()

	// Client: one connection, every call multiplexed on it, reconnecting when lost.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // the deadline goes to the server
	defer cancel()
	cc, err := topspin.Dial(ctx, "tcp://"+l.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	kv := kvpb.NewStoreClient(cc)

	ctx = topspin.WithOutgoingMetadata(ctx, topspin.MD("user", "ann")) // request metadata
	if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: "greeting", Value: "hello"}); err != nil {
		log.Fatal(err)
	}
	entry, err := kv.Get(ctx, &kvpb.GetRequest{Key: "greeting"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s = %s (version %d)\n", entry.Key, entry.Value, entry.Version)

	_, err = kv.Get(ctx, &kvpb.GetRequest{Key: "nope"})
	fmt.Println("status:", topspin.CodeOf(err)) // NOT_FOUND: errors carry gRPC's codes

	// Server streaming: the current entries, then changes until we hang up.
	watch, err := kv.Watch(ctx, &kvpb.WatchRequest{IncludeExisting: true})
	if err != nil {
		log.Fatal(err)
	}
	ev, err := watch.Recv()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("watch:", ev.GetPut().GetKey())
	watch.CancelCall()
}
