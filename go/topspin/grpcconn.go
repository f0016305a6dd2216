package topspin

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/topspin-rpc/topspin/go/wire"
)

// Write bounds grpc-go's writes by the write timeout, as a native connection's (write.go):
// grpc-go has no write deadline of its own, so a client that stops reading would hold its
// connection, its calls and what they queued for as long as its socket stays open. The
// socket's write deadline is moved only when less than the timeout remains (to 1.25 × the
// timeout ahead); a write that reaches it having moved some bytes goes on with a fresh one,
// one that moved none fails and closes the socket, and grpc-go ends the connection's calls. So a
// client that takes nothing is cut 1 to 2.25 × the timeout after it took its last byte. TLS
// writes go in chunks of at most tlsWriteChunk (a timed-out TLS write cannot go on).
func (c *faceConn) Write(p []byte) (int, error) {
	if c.watch != nil {
		c.watch.out(p, time.Now())
	}
	wt := c.writeTimeout
	if wt <= 0 {
		return c.Conn.Write(p)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	chunk := len(p)
	if c.tls != nil {
		chunk = tlsWriteChunk
	}
	done := 0
	for done < len(p) {
		c.armWrite(wt)
		n, err := c.Conn.Write(p[done:min(len(p), done+chunk)])
		done += n
		switch {
		case err == nil:
		case n > 0 && c.tls == nil && errors.Is(err, os.ErrDeadlineExceeded):
			c.writeBy = time.Time{} // bytes moved before the deadline: a fresh one for the rest
		case errors.Is(err, os.ErrDeadlineExceeded):
			// grpc-go leaves a failed write to its reader, which waits on a client that
			// sends nothing: closing the socket ends that wait too.
			_ = c.Conn.Close()
			return done, fmt.Errorf("write timeout: the gRPC client took none of our bytes for %v: %w", wt, err)
		default:
			return done, err
		}
	}
	return done, nil
}

// armWrite makes sure the socket's write deadline is at least wt ahead (under wmu).
func (c *faceConn) armWrite(wt time.Duration) {
	if now := time.Now(); c.writeBy.Sub(now) < wt {
		c.writeBy = now.Add(wt + wt/4)
		_ = c.Conn.SetWriteDeadline(c.writeBy)
	}
}

// SetDeadline sets the socket's deadlines, keeping armWrite's note of the write deadline
// true (grpc-go clears both after its handshake).
func (c *faceConn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetWriteDeadline sets the socket's write deadline (see SetDeadline).
func (c *faceConn) SetWriteDeadline(t time.Time) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.writeBy = t
	return c.Conn.SetWriteDeadline(t)
}

// watchGRPC follows a gRPC connection's request messages under way (grpcwatch.go): charged
// to its share of the memory budget, and the connection cut when they pass it or one stalls
// for the frame timeout with its window open (looked at every quarter of it).
func (s *Server) watchGRPC(fc *faceConn) {
	b := s.opts.memoryBudget()
	fc.watch = newGRPCWatch(wire.ShareOf(b, max(b.Limit()/wire.ShareOfBudget, 1)),
		int64(grpcWindow(&s.opts)), s.opts.frameTimeout)
	d := s.opts.frameTimeout
	if d <= 0 {
		return
	}
	every := max(d/4, 10*time.Millisecond)
	var check func()
	check = func() {
		if fc.watch.stalled(time.Now()) != "" {
			fc.cut()
			return
		}
		if !fc.watch.isClosed() {
			time.AfterFunc(every, check)
		}
	}
	time.AfterFunc(every, check)
}

// cut closes the socket of a connection the watch gave up on: grpc-go's reader fails and
// it ends the connection and its calls.
func (c *faceConn) cut() { _ = c.Conn.Close() }
