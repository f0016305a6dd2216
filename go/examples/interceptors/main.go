// Command interceptors serves the kvstore example behind two server interceptors (one logs
// every call, one refuses calls without a token) and calls it with a client interceptor
// that adds the token.
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
	// Server: a unary chain, first = outermost (as in grpc-go); it runs on the native and
	// the gRPC face alike. StreamInterceptor / ChainStreamInterceptor do the same for streams.
	logCalls := func(ctx context.Context, req any, info *topspin.UnaryServerInfo, handler topspin.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		fmt.Printf("server: %s %s\n", info.FullMethod, topspin.CodeOf(err))
		return resp, err
	}
	auth := func(ctx context.Context, req any, info *topspin.UnaryServerInfo, handler topspin.UnaryHandler) (any, error) {
		if tok, _ := topspin.ServerStreamFrom(ctx).Metadata().Get("authorization"); tok != "Bearer s3cret" {
			return nil, topspin.Errorf(topspin.Unauthenticated, "no valid token") // the handler does not run
		}
		return handler(ctx, req)
	}
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := topspin.NewServer(topspin.ChainUnaryInterceptor(logCalls, auth))
	kvpb.RegisterStoreServer(srv, kvstore.NewStore())
	go srv.Serve(l)
	defer srv.GracefulStop()

	// Client: an interceptor adds the token to every unary call.
	withToken := func(ctx context.Context, method string, req, reply any, cc *topspin.ClientConn, invoker topspin.UnaryInvoker, opts ...topspin.CallOption) error {
		ctx = topspin.WithOutgoingMetadata(ctx, topspin.MD("authorization", "Bearer s3cret"))
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc, err := topspin.Dial(ctx, "tcp://"+l.Addr().String(), topspin.WithUnaryInterceptor(withToken))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	_, err = kvpb.NewStoreClient(cc).Put(ctx, &kvpb.PutRequest{Key: "a", Value: "1"})
	fmt.Println("client: put:", topspin.CodeOf(err))

	plain, err := topspin.Dial(ctx, "tcp://"+l.Addr().String()) // no interceptor, no token
	if err != nil {
		log.Fatal(err)
	}
	defer plain.Close()
	_, err = kvpb.NewStoreClient(plain).Get(ctx, &kvpb.GetRequest{Key: "a"})
	fmt.Println("client without a token: get:", topspin.CodeOf(err))
}
