package topspin_test

import (
	"context"
	"errors"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
	"github.com/topspin-rpc/topspin/go/wire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The send bound counts answers before they are encoded: a client that pipelines 500 calls
// in one write, each answered by a typed handler whose response encodes to 1 MiB of its own
// (as kvstore's Get of a 1 MiB value), and never reads makes the server hold the send buffer
// and one message of encoded answers, not one per call: the calls of that one read are all
// dispatched before any answer is queued, so holding only the calls that arrive once the
// buffer is full leaves every handler of the read keeping its encoded answer while it waits.
// The well-behaved client is served throughout.
func TestAPipelineOfLargeAnswersIsHeldToTheSendBufferAndOneMessage(t *testing.T) {
	const calls = 500
	maxSend := topspin.DefaultMaxSendBuffer
	h := startHostile(t)
	done := h.probe(t)
	var b []byte
	for id := uint32(1); id < 2*calls; id += 2 {
		b = callFrame(b, id, "/h.S/Value")
		b = wire.Append(b, &wire.Frame{Type: wire.TypeMessage, Flags: wire.FlagEndStream, CallID: id})
	}
	runtime.GC()
	base := heapObjects()
	peakOf := sampleHeap(30 * time.Second)
	nc := h.attacker(t, b) // one write: the calls arrive in one or two reads
	h.settle(t, "the send buffer full", func(g topspin.Gauges) bool { return g.UnsentBytes >= maxSend })
	time.Sleep(time.Second) // every handler that starts has reached its answer
	g := h.s.Gauges()
	peak := peakOf() - base
	runtime.GC()
	live := heapObjects() - base
	t.Logf("%d pipelined calls for 1 MiB answers, never read: unsent %d, heap +%.1f MiB live (peak +%.1f MiB), %d handlers run, %d calls open",
		calls, g.UnsentBytes, float64(live)/mib, float64(peak)/mib, h.valRuns.Load(), g.OpenCalls)
	if bound := int64(maxSend + mib + 8*mib); live > bound {
		t.Errorf("the server holds %.1f MiB of heap for a client that reads nothing; want at most the send buffer (%d MiB), one message and 8 MiB",
			float64(live)/mib, maxSend/mib)
	}
	if bound := int64(maxSend + mib + 48*mib); peak > bound {
		t.Errorf("the heap peaked %.1f MiB above where it was; want at most the send buffer, one message and 48 MiB", float64(peak)/mib)
	}
	h.served(t, "during")
	done()
	_ = nc.Close()
	h.after(t)
}

// Answers that take their room before they are encoded still all go out when each is larger
// than the send buffer, compressed or not, unary or streamed past the client's credit: 16
// callers of each kind at once, a 16 KiB send buffer, 256 KiB answers.
func TestLargeTypedAnswersPastASmallSendBufferAreServed(t *testing.T) {
	const callers, streamed = 16, 8
	value := strings.Repeat("0123456789abcdef", 16<<10)
	for _, enc := range []string{"", wire.EncodingGzip, wire.EncodingZstd} {
		t.Run("encoding="+enc, func(t *testing.T) {
			opts := []topspin.Option{topspin.WithMaxSendBuffer(16 << 10)}
			if enc != "" {
				opts = append(opts, topspin.WithCompression(enc))
			}
			s := topspin.NewServer(opts...)
			s.Handle("/t.L/One", topspin.Unary(func(context.Context, *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
				return wrapperspb.String(value), nil
			}))
			s.Handle("/t.L/Many", topspin.ServerStreaming(func(_ context.Context, _ *wrapperspb.StringValue, st topspin.ServerStreamingServer[wrapperspb.StringValue]) error {
				for range streamed {
					if err := st.Send(wrapperspb.String(value)); err != nil {
						return err
					}
				}
				return nil
			}))
			l, err := topspin.Listen("tcp://127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = s.Serve(l) }()
			t.Cleanup(s.Stop)
			var copts []topspin.Option
			if enc != "" {
				copts = append(copts, topspin.WithCompression(enc))
			}
			cc := dial(t, "tcp://"+l.Addr().String(), copts...)
			errs := make(chan error, 2*callers)
			var wg sync.WaitGroup
			for range callers {
				wg.Add(2)
				go func() { defer wg.Done(); errs <- callOne(cc, len(value)) }()
				go func() { defer wg.Done(); errs <- callMany(cc, len(value), streamed) }()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func callOne(cc *topspin.ClientConn, want int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out wrapperspb.StringValue
	if err := cc.Invoke(ctx, "/t.L/One", wrapperspb.String("q"), &out); err != nil {
		return err
	}
	if len(out.GetValue()) != want {
		return errors.New("unary answer of the wrong size")
	}
	return nil
}

func callMany(cc *topspin.ClientConn, want, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := cc.NewStream(ctx, "/t.L/Many")
	if err != nil {
		return err
	}
	if err := cs.SendMsg(wrapperspb.String("q")); err != nil {
		return err
	}
	if err := cs.CloseSend(); err != nil {
		return err
	}
	for got := 0; ; got++ {
		b, err := cs.Recv()
		if err == io.EOF && got == n {
			return nil
		}
		if err != nil {
			return err
		}
		var out wrapperspb.StringValue
		if err := proto.Unmarshal(b, &out); err != nil || len(out.GetValue()) != want || got >= n {
			return errors.New("streamed answer of the wrong size, or too many")
		}
	}
}
