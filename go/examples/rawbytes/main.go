// Command rawbytes serves and calls methods on raw bytes, without generated code. The
// bodies of register and call are go/README.md's "Without generated code" blocks as written
// (main_test.go checks it).
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
)

func main() {
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := topspin.NewServer()
	register(srv)
	go srv.Serve(l)
	defer srv.GracefulStop()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc, err := topspin.Dial(ctx, "tcp://"+l.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	if err := call(ctx, cc); err != nil {
		log.Fatal(err)
	}
}

func register(srv *topspin.Server) {
	srv.Handle("/echo.Echo/Say", topspin.UnaryRaw(func(ctx context.Context, md topspin.Metadata, req []byte) ([]byte, error) {
		return req, nil
	}), topspin.CodecRaw)
	srv.Handle("/echo.Echo/Chat", func(ss *topspin.ServerStream) error { // any kind: Recv until io.EOF, Send
		for {
			msg, err := ss.Recv()
			if err == io.EOF {
				return nil // END OK; return topspin.Errorf(code, ...) for another status
			}
			if err != nil {
				return err
			}
			if err := ss.Send(msg); err != nil {
				return err
			}
		}
	}, topspin.CodecRaw)
}

func call(ctx context.Context, cc *topspin.ClientConn) error {
	out, err := cc.InvokeRaw(ctx, "/echo.Echo/Say", []byte("hi"), topspin.WithCodec(topspin.CodecRaw))
	if err != nil {
		return err
	}
	cs, err := cc.NewStream(ctx, "/echo.Echo/Chat", topspin.WithCodec(topspin.CodecRaw)) // Send, CloseSend, Recv
	if err != nil {
		return err
	}
	fmt.Printf("Say: %s\n", out)
	for _, m := range []string{"one", "two"} {
		if err := cs.Send([]byte(m)); err != nil {
			return err
		}
	}
	if err := cs.CloseSend(); err != nil {
		return err
	}
	for {
		msg, err := cs.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		fmt.Printf("Chat: %s\n", msg)
	}
}
