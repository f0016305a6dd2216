package topspin

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// refuseGRPC tells a gRPC connection over max_connections why it is refused, as the native
// face does (bounds.go): it answers the client's first call with UNAVAILABLE naming the
// limit (a trailers-only response), sends GOAWAY and closes. No handler runs; at most
// refusalReadLimit bytes are read, for at most refusalWait.
func (s *Server) refuseGRPC(nc net.Conn) {
	defer func() {
		_ = nc.Close()
		s.mu.Lock()
		s.refusing--
		s.mu.Unlock()
	}()
	_ = nc.SetDeadline(time.Now().Add(refusalWait))
	lr := &io.LimitedReader{R: nc, N: refusalReadLimit}
	pre := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(lr, pre); err != nil || string(pre) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(nc, lr)
	if fr.WriteSettings() != nil {
		return
	}
	msg := fmt.Sprintf("max_connections (%d) reached: the server takes no more connections now; try again later", s.opts.maxConns)
	id := firstStream(fr)
	if id != 0 {
		var block bytes.Buffer
		enc := hpack.NewEncoder(&block)
		for _, f := range [][2]string{{":status", "200"}, {"content-type", "application/grpc"},
			{"grpc-status", fmt.Sprint(int(Unavailable))}, {"grpc-message", msg}} {
			_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(),
			EndStream: true, EndHeaders: true}) != nil {
			return
		}
	}
	if fr.WriteGoAway(id, http2.ErrCodeNo, []byte(msg)) != nil {
		return
	}
	// Closing with unread bytes would reset the connection, and the client might lose the
	// answer: read until it closes (or the bounds).
	_, _ = io.Copy(io.Discard, lr)
}

// firstStream reads frames until the client opens a stream and returns its id (0 if it
// does not), acknowledging its SETTINGS.
func firstStream(fr *http2.Framer) uint32 {
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return 0
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			return f.StreamID
		case *http2.SettingsFrame:
			if !f.IsAck() && fr.WriteSettingsAck() != nil {
				return 0
			}
		}
	}
}
