package topspin_test

import (
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
)

// The header rule: a streaming call returns to its caller without waiting for response
// headers (the Go server sends them only with the first message, or the end). A bidi call
// that opens and then sends gets its echo; a call on a quiet server stream returns at once.
func TestStreamsReturnWithoutWaitingForHeaders(t *testing.T) {
	_, target := testServer(t, "tcp")
	cc := dial(t, target)
	opened := make(chan *topspin.ClientStream, 1)
	failed := make(chan error, 1)
	go func() {
		cs, err := cc.NewStream(ctx10(t), "/t.S/Bidi", raw)
		if err != nil {
			failed <- err
			return
		}
		opened <- cs
	}()
	var cs *topspin.ClientStream
	select {
	case cs = <-opened:
	case err := <-failed:
		t.Fatal(err)
	case <-time.After(5 * time.Second):
		t.Fatal("NewStream of a bidi call waited for the server (which answers only after a message)")
	}
	if err := cs.Send([]byte("a")); err != nil {
		t.Fatal(err)
	}
	if got, err := cs.Recv(); err != nil || string(got) != "re:a" {
		t.Fatalf("echo: %q, %v", got, err)
	}
	_ = cs.CloseSend()

	// A server stream whose handler sends nothing: opening, sending and half-closing return.
	quiet := make(chan error, 1)
	go func() {
		cs, err := cc.NewStream(ctx10(t), "/t.S/Wait", raw)
		if err == nil {
			err = cs.Send([]byte("subscribe"))
		}
		if err == nil {
			err = cs.CloseSend()
			cs.CancelCall()
		}
		quiet <- err
	}()
	select {
	case err := <-quiet:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("subscribing to a quiet server stream waited for the server")
	}
}
