package topspin_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/topspin-rpc/topspin/go/topspin"
	"github.com/topspin-rpc/topspin/go/wire"
)

// countingListener counts the bytes its connections read (what the client sent).
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, l.n}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.n.Add(int64(n))
	return n, err
}

// compressServer echoes requests (unary Echo, bidi Bidi) and reports the request's
// topspin-encoding through a header; opts configure it (WithCompression).
func compressServer(t *testing.T, read *atomic.Int64, opts ...topspin.Option) string {
	t.Helper()
	s := topspin.NewServer(opts...)
	s.Handle("/t.S/Echo", topspin.UnaryRaw(func(ctx context.Context, md topspin.Metadata, req []byte) ([]byte, error) {
		e, _ := md.Get("topspin-encoding")
		topspin.ServerStreamFrom(ctx).SetTrailer(topspin.MD("saw-encoding", e))
		return req, nil
	}), topspin.CodecRaw)
	s.Handle("/t.S/Bidi", func(ss *topspin.ServerStream) error {
		for {
			m, err := ss.Recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if err := ss.Send(m); err != nil {
				return err
			}
		}
	}, topspin.CodecRaw)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if read == nil {
		read = new(atomic.Int64)
	}
	go func() { _ = s.Serve(countingListener{l, read}) }()
	t.Cleanup(s.Stop)
	return "tcp://" + l.Addr().String()
}

var bigMsg = []byte(strings.Repeat("a compressible message ", 5000)) // 115 000 bytes

// A zstd client and a gzip server: requests go compressed (fewer bytes on the wire than
// the message), responses come back gzip'ed (announced in HEADERS), every call kind.
func TestCompressionNegotiated(t *testing.T) {
	var read atomic.Int64
	target := compressServer(t, &read, topspin.WithCompression("gzip"))
	cc := dial(t, target, topspin.WithCompression("zstd"))
	var hdr, tr topspin.Metadata
	resp, err := cc.InvokeRaw(ctx10(t), "/t.S/Echo", bigMsg, raw, topspin.Header(&hdr), topspin.Trailer(&tr))
	if err != nil || !bytes.Equal(resp, bigMsg) {
		t.Fatalf("echo: %d bytes, %v", len(resp), err)
	}
	if e, _ := tr.Get("saw-encoding"); e != "zstd" {
		t.Fatalf("the server saw request encoding %q", e)
	}
	if e, _ := hdr.Get("topspin-encoding"); e != "gzip" {
		t.Fatalf("response headers %v lack topspin-encoding: gzip", hdr)
	}
	if n := read.Load(); n > int64(len(bigMsg))/10 {
		t.Fatalf("the server read %d bytes for a %d-byte message: not compressed", n, len(bigMsg))
	}
	// Per call: identity overrides the connection's zstd; small messages round-trip too.
	resp, err = cc.InvokeRaw(ctx10(t), "/t.S/Echo", []byte("small"), raw, topspin.CallCompression("gzip"))
	if err != nil || string(resp) != "small" {
		t.Fatalf("small: %q %v", resp, err)
	}
	before := read.Load()
	tr = nil
	resp, err = cc.InvokeRaw(ctx10(t), "/t.S/Echo", bigMsg, raw, topspin.CallCompression("identity"), topspin.Trailer(&tr))
	if err != nil || !bytes.Equal(resp, bigMsg) || read.Load()-before < int64(len(bigMsg)) {
		t.Fatalf("identity call: %v, %d bytes read", err, read.Load()-before)
	}
	if e, _ := tr.Get("saw-encoding"); e != "" {
		t.Fatalf("identity call sent encoding %q", e)
	}
	cs, err := cc.NewStream(ctx10(t), "/t.S/Bidi", raw)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		msg := append([]byte{byte(i)}, bigMsg[:1000*(i+1)]...)
		if err := cs.Send(msg); err != nil {
			t.Fatal(err)
		}
		got, err := cs.Recv()
		if err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("bidi %d: %v", i, err)
		}
	}
	_ = cs.CloseSend()
	if _, err := cs.Recv(); err != io.EOF {
		t.Fatalf("bidi end: %v", err)
	}
	if _, err := topspin.Dial(ctx10(t), target, topspin.WithCompression("br")); err == nil {
		t.Fatal("dial with an unknown compression succeeded")
	}
}

// A server compresses only for clients that accept its encoding: a plain client gets
// plain responses and no topspin-encoding header.
func TestCompressionOnlyWhenAccepted(t *testing.T) {
	target := compressServer(t, nil, topspin.WithCompression("zstd"))
	cc := dial(t, target)
	var hdr topspin.Metadata
	resp, err := cc.InvokeRaw(ctx10(t), "/t.S/Echo", bigMsg, raw, topspin.Header(&hdr))
	if err != nil || !bytes.Equal(resp, bigMsg) {
		t.Fatalf("echo: %v", err)
	}
	if _, ok := hdr.Get("topspin-encoding"); ok {
		t.Fatalf("a client that accepts nothing got %v", hdr)
	}
}

// An unknown request encoding ends UNIMPLEMENTED naming the accepted ones (message and
// trailers); a corrupt body is INTERNAL; a bomb past MAX_MESSAGE_SIZE is RESOURCE_EXHAUSTED
// on the server and on the client.
func TestCompressionErrors(t *testing.T) {
	target := compressServer(t, nil, topspin.WithMaxMessageSize(64<<10), topspin.WithCompression("zstd"))
	cc := dial(t, target)
	ctx := topspin.WithOutgoingMetadata(ctx10(t), topspin.MD("topspin-encoding", "br"))
	_, err := cc.InvokeRaw(ctx, "/t.S/Echo", []byte("x"), raw)
	st := topspin.StatusOf(err)
	if st == nil || st.Code != topspin.Unimplemented || !strings.Contains(st.Message, "zstd,gzip") {
		t.Fatalf("unknown encoding: %v", err)
	}
	if a, _ := st.Trailers.Get("topspin-accept-encoding"); a != "zstd,gzip" {
		t.Fatalf("trailers %v", st.Trailers)
	}
	ctx = topspin.WithOutgoingMetadata(ctx10(t), topspin.MD("topspin-encoding", "zstd"))
	_, err = cc.InvokeRaw(ctx, "/t.S/Echo", []byte{1, 0xde, 0xad, 0xbe, 0xef}, raw)
	if topspin.CodeOf(err) != topspin.Internal {
		t.Fatalf("corrupt body: %v", err)
	}
	_, err = cc.InvokeRaw(ctx, "/t.S/Echo", []byte{7, 1, 2}, raw)
	if topspin.CodeOf(err) != topspin.Internal {
		t.Fatalf("unknown flag: %v", err)
	}
	bomb, err := wire.Compress("zstd", make([]byte, 1<<20)) // 1 MiB of zeros, a few dozen bytes
	if err != nil || len(bomb) > 1024 {
		t.Fatalf("bomb: %d bytes, %v", len(bomb), err)
	}
	_, err = cc.InvokeRaw(ctx, "/t.S/Echo", bomb, raw)
	if topspin.CodeOf(err) != topspin.ResourceExhausted {
		t.Fatalf("server-side bomb: %v", err)
	}
	// The client's own limit bounds what it decompresses.
	small := dial(t, target, topspin.WithCompression("zstd"), topspin.WithMaxMessageSize(32<<10))
	_, err = small.InvokeRaw(ctx10(t), "/t.S/Echo", bigMsg[:60<<10], raw)
	if topspin.CodeOf(err) != topspin.ResourceExhausted {
		t.Fatalf("client-side limit: %v", err)
	}
}
