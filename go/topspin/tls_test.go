package topspin_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"testing"

	"github.com/topspin-rpc/topspin/go/internal/testcert"
	"github.com/topspin-rpc/topspin/go/topspin"
)

func tlsPair(t *testing.T) (server, client *tls.Config, ca *testcert.CA) {
	t.Helper()
	ca, err := testcert.NewCA("topspin test CA")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Server()
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}}, &tls.Config{RootCAs: ca.Pool()}, ca
}

// TLS with ALPN topspin/1: every call kind works, and the server selected topspin/1.
func TestTLS(t *testing.T) {
	srvCfg, cliCfg, _ := tlsPair(t)
	_, target := testServer(t, "tls", topspin.WithTLS(srvCfg))
	if !strings.HasPrefix(target, "tls://") {
		t.Fatalf("target %q", target)
	}
	cc := dial(t, target, topspin.WithTLS(cliCfg))
	resp, err := cc.InvokeRaw(ctx10(t), "/t.S/Echo", []byte("over tls"), raw)
	if err != nil || string(resp) != "over tls" {
		t.Fatalf("echo: %q %v", resp, err)
	}
	cs, err := cc.NewStream(ctx10(t), "/t.S/Bidi", raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"a", "b"} {
		if err := cs.Send([]byte(m)); err != nil {
			t.Fatal(err)
		}
		got, err := cs.Recv()
		if err != nil || string(got) != "re:"+m {
			t.Fatalf("bidi: %q %v", got, err)
		}
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}

	// A raw TLS client sees ALPN topspin/1 selected (h2 when it offers only that: the gRPC
	// face); one offering only another protocol is refused with no_application_protocol, as
	// is one offering only h2 when the gRPC face is off; one offering none is served.
	addr := strings.TrimPrefix(target, "tls://")
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: cliCfg.RootCAs, NextProtos: []string{"h2", topspin.ALPN}})
	if err != nil {
		t.Fatal(err)
	}
	if p := c.ConnectionState().NegotiatedProtocol; p != topspin.ALPN {
		t.Fatalf("negotiated %q", p)
	}
	_ = c.Close()
	c, err = tls.Dial("tcp", addr, &tls.Config{RootCAs: cliCfg.RootCAs, NextProtos: []string{"h2"}})
	if err != nil || c.ConnectionState().NegotiatedProtocol != "h2" {
		t.Fatalf("a client offering h2 only: %v", err)
	}
	_ = c.Close()
	refused := func(addr string, protos ...string) {
		t.Helper()
		if c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: cliCfg.RootCAs, NextProtos: protos}); err == nil {
			_ = c.Close()
			t.Fatalf("a handshake offering ALPN %v succeeded", protos)
		} else if !strings.Contains(err.Error(), "no application protocol") {
			t.Fatalf("want no_application_protocol alert, got %v", err)
		}
	}
	refused(addr, "foo/1")
	_, noGRPC := testServer(t, "tls", topspin.WithTLS(srvCfg), topspin.WithGRPC(false))
	refused(strings.TrimPrefix(noGRPC, "tls://"), "h2")
	c, err = tls.Dial("tcp", addr, &tls.Config{RootCAs: cliCfg.RootCAs})
	if err != nil {
		t.Fatalf("a client without ALPN: %v", err)
	}
	_ = c.Close()
}

// A client that does not trust the server's CA fails with UNAVAILABLE naming TLS.
func TestTLSWrongCA(t *testing.T) {
	srvCfg, _, _ := tlsPair(t)
	_, otherCli, _ := tlsPair(t)
	_, target := testServer(t, "tls", topspin.WithTLS(srvCfg))
	_, err := topspin.Dial(ctx10(t), target, topspin.WithTLS(otherCli))
	if topspin.CodeOf(err) != topspin.Unavailable {
		t.Fatalf("want UNAVAILABLE, got %v", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "TLS") || !strings.Contains(msg, "unknown authority") {
		t.Fatalf("message does not name the TLS problem: %q", msg)
	}
	// Wrong name: the certificate is for localhost/127.0.0.1, not this override.
	srv2, cli2, _ := tlsPair(t)
	_, target2 := testServer(t, "tls", topspin.WithTLS(srv2))
	cli2.ServerName = "example.org"
	_, err = topspin.Dial(ctx10(t), target2, topspin.WithTLS(cli2))
	var st *topspin.Status
	if !errors.As(err, &st) || st.Code != topspin.Unavailable || !strings.Contains(st.Message, "TLS") ||
		!strings.Contains(st.Message, "example.org") {
		t.Fatalf("wrong name: %v", err)
	}
	// Listening on tls:// without a certificate is an error, not a plain-text port.
	if _, err := topspin.Listen("tls://127.0.0.1:0"); err == nil {
		t.Fatal("tls:// listen without a certificate succeeded")
	}
}

// Mutual TLS: a server that requires a client certificate refuses a client without one
// (UNAVAILABLE naming TLS) and sees the verified certificate of one that has it.
func TestMutualTLS(t *testing.T) {
	srvCfg, cliCfg, ca := tlsPair(t)
	srvCfg.ClientAuth, srvCfg.ClientCAs = tls.RequireAndVerifyClientCert, ca.Pool()
	s := topspin.NewServer()
	s.Handle("/t.S/Who", topspin.UnaryRaw(func(ctx context.Context, _ topspin.Metadata, _ []byte) ([]byte, error) {
		st := topspin.ServerStreamFrom(ctx).TLS()
		if st == nil || len(st.PeerCertificates) == 0 {
			return nil, topspin.Errorf(topspin.Unauthenticated, "no client certificate")
		}
		return []byte(st.PeerCertificates[0].Subject.CommonName), nil
	}), topspin.CodecRaw)
	l, err := topspin.Listen("tls://127.0.0.1:0", topspin.WithTLS(srvCfg))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	target := "tls://" + l.Addr().String()

	cert, err := ca.Client("ann")
	if err != nil {
		t.Fatal(err)
	}
	withCert := cliCfg.Clone()
	withCert.Certificates = []tls.Certificate{cert}
	cc := dial(t, target, topspin.WithTLS(withCert))
	who, err := cc.InvokeRaw(ctx10(t), "/t.S/Who", nil, raw)
	if err != nil || string(who) != "ann" {
		t.Fatalf("who: %q %v", who, err)
	}

	// Without a certificate: with TLS 1.3 the server's alert comes after the client's
	// handshake, so the failure shows at Dial or at the first call.
	bare, err := topspin.Dial(ctx10(t), target, topspin.WithTLS(cliCfg))
	if err == nil {
		defer bare.Close()
		_, err = bare.InvokeRaw(ctx10(t), "/t.S/Who", nil, raw)
	}
	if topspin.CodeOf(err) != topspin.Unavailable || !strings.Contains(err.Error(), "tls") {
		t.Fatalf("want UNAVAILABLE naming TLS, got %v", err)
	}
	if testing.Verbose() {
		t.Logf("without a client certificate: %v", err)
	}
}
