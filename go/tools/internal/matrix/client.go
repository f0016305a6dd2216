package matrix

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"

	"github.com/topspin-rpc/topspin/go/tools/internal/matrixpb"
	"github.com/topspin-rpc/topspin/go/topspin"
)

// The README's bounds: every check's own deadline, the WasCancelled poll, the whole run.
const (
	checkDeadline = 5 * time.Second
	pollFor       = 3 * time.Second
	pollEvery     = 50 * time.Millisecond
	runBudget     = 55 * time.Second // the README allows 60 s; what is left is for the exit
	checkGuard    = 10 * time.Second // a check that overstays this is reported and left behind
)

// SkipError is what a check returns when the client cannot express it: printed as
// "skip NAME: why".
type SkipError struct{ Why string }

func (e *SkipError) Error() string { return e.Why }

// client is one run's connection, its generated client and the prefix of its tags.
type client struct {
	cc     *topspin.ClientConn
	mc     *matrixpb.MatrixClient
	prefix string // "<client>-<pid>"
	target string
	opts   []topspin.Option // the connection's (TLS): the trace check dials its own
}

func (c *client) tag(check string) string { return c.prefix + "-" + check }

// check is one row of the README's table.
type check struct {
	name string
	run  func(c *client) error
}

// Checks are the README's checks, in order.
var checks = []check{
	{"unary", (*client).unary},
	{"large", (*client).large},
	{"server-stream", (*client).serverStream},
	{"quiet-stream", (*client).quietStream},
	{"client-stream", (*client).clientStream},
	{"bidi-open-then-send", (*client).bidiOpenThenSend},
	{"deadline", (*client).deadline},
	{"cancel", (*client).cancel},
	{"error-details", (*client).errorDetails},
	{"compression", (*client).compression},
	{"trace", (*client).trace},
}

// CheckNames are the names of the checks, in the order Run runs them.
func CheckNames() []string {
	names := make([]string, len(checks))
	for i, ch := range checks {
		names[i] = ch.name
	}
	return names
}

// Run connects to target and runs every check in order, writing one line per check to out
// ("ok NAME", "FAIL NAME: why" or "skip NAME: why"); tags are "<prefix>-<check>". It
// reports whether no check failed. It returns within about a minute whatever the server
// does. opts are the connection's options (WithTLS for a tls:// target).
func Run(target, prefix string, out io.Writer, opts ...topspin.Option) bool {
	if strings.HasPrefix(target, "ws://") || strings.HasPrefix(target, "wss://") {
		for _, ch := range checks {
			fmt.Fprintf(out, "skip %s: the Go runtime has no WebSocket transport\n", ch.name)
		}
		return true
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), checkDeadline)
	cc, err := topspin.Dial(ctx, target, opts...)
	cancel()
	if err != nil {
		for _, ch := range checks {
			fmt.Fprintf(out, "FAIL %s: dial %s: %v\n", ch.name, target, err)
		}
		return false
	}
	defer cc.Close()
	c := &client{cc: cc, mc: matrixpb.NewMatrixClient(cc), prefix: prefix, target: target, opts: opts}
	passed := true
	for _, ch := range checks {
		guard := min(checkGuard, runBudget-time.Since(start))
		err := guarded(guard, func() error { return ch.run(c) })
		var skip *SkipError
		switch {
		case err == nil:
			fmt.Fprintf(out, "ok %s\n", ch.name)
		case errors.As(err, &skip):
			fmt.Fprintf(out, "skip %s: %s\n", ch.name, skip.Why)
		default:
			passed = false
			fmt.Fprintf(out, "FAIL %s: %s\n", ch.name, oneLine(err.Error()))
		}
	}
	return passed
}

// guarded runs fn and waits for it at most d: a check whose calls ignore their deadlines
// fails instead of hanging the client (its goroutine is left behind).
func guarded(d time.Duration, fn func() error) error {
	if d <= 0 {
		return errors.New("not run: the whole run's 60 s are spent")
	}
	done := make(chan error, 1)
	go func() { done <- fn() }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("hung: no result after %v although every call had a deadline", d)
	}
}

// oneLine keeps a reason on its line and printable: control characters become spaces.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// within runs fn and fails if it does not return within d (a call that waits for the
// server where it must not).
func within[T any](d time.Duration, what string, fn func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := fn()
		done <- result{v, err}
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case r := <-done:
		return r.v, r.err
	case <-t.C:
		var zero T
		return zero, fmt.Errorf("%s did not return within %v: it waits for the server", what, d)
	}
}

// pollCancelled asks WasCancelled(tag) every 50 ms until it is true, for 3 s.
func (c *client) pollCancelled(tag string) error {
	end := time.Now().Add(pollFor)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		f, err := c.mc.WasCancelled(ctx, &matrixpb.Tag{Tag: tag})
		cancel()
		if err == nil && f.Value {
			return nil
		}
		if time.Now().After(end) {
			if err != nil {
				return fmt.Errorf("WasCancelled(%q): %v", tag, err)
			}
			return fmt.Errorf("WasCancelled(%q) still false after %v", tag, pollFor)
		}
		time.Sleep(pollEvery)
	}
}

// wantCode fails unless err carries code.
func wantCode(err error, code topspin.Code) error {
	if err == nil {
		return fmt.Errorf("the call succeeded, want %s", code)
	}
	if got := topspin.CodeOf(err); got != code {
		return fmt.Errorf("got %s (%v), want %s", got, err, code)
	}
	return nil
}
