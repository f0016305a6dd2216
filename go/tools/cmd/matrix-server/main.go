// Command matrix-server is the Go server of the cross-language matrix
// (testdata/matrix/README.md): it serves matrix.v1.Matrix on every --listen address
// (tcp://host:port, unix:///path, and with --tls-cert FILE --tls-key FILE tls://host:port;
// the Go runtime has no WebSocket), prints "listening ADDR" for each with its real address,
// and runs until SIGTERM (then stops gracefully, exit 0). Its calls are traced with
// OpenTelemetry (the trace check: Unary answers the header x-trace-id).
package main

import (
	"bufio"
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/topspin-rpc/topspin/go/tools/internal/matrix"
	"github.com/topspin-rpc/topspin/go/tools/internal/matrixpb"
	"github.com/topspin-rpc/topspin/go/topspin"
)

// stopGrace is how long GracefulStop may wait for open calls (a held stream never ends by
// itself) before Stop closes them: SIGTERM must end the process within 2 s.
const stopGrace = time.Second

// addrList is a repeatable flag.
type addrList []string

func (a *addrList) String() string     { return strings.Join(*a, ",") }
func (a *addrList) Set(v string) error { *a = append(*a, v); return nil }

func main() {
	var addrs addrList
	flag.Var(&addrs, "listen", "address to serve on: tcp://host:port, unix:///path or (with --tls-cert) tls://host:port (repeatable)")
	certFile := flag.String("tls-cert", "", "the certificate chain (PEM, leaf first) of tls:// listeners")
	keyFile := flag.String("tls-key", "", "the certificate's private key (PEM)")
	flag.Parse()
	if len(addrs) == 0 || flag.NArg() > 0 || (*certFile == "") != (*keyFile == "") {
		fmt.Fprintln(os.Stderr, "usage: matrix-server [--tls-cert FILE --tls-key FILE] --listen ADDR [--listen ADDR...]")
		os.Exit(2)
	}
	var opts []topspin.Option
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "matrix-server: --tls-cert %s --tls-key %s: %v\n", *certFile, *keyFile, err)
			os.Exit(1)
		}
		opts = append(opts, topspin.WithTLS(&tls.Config{Certificates: []tls.Certificate{cert}}))
	}
	// Taken before listening: a SIGTERM right after the "listening" lines is not lost.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	os.Exit(serve(addrs, sig, opts...))
}

// serve listens on every address (opts: the TLS settings of tls:// ones), prints them, serves
// until a signal and stops.
func serve(addrs []string, sig <-chan os.Signal, opts ...topspin.Option) int {
	var listeners []net.Listener
	for _, a := range addrs {
		l, err := topspin.Listen(a, opts...)
		if err != nil {
			fmt.Fprintf(os.Stderr, "matrix-server: listen %s: %v\n", a, err)
			for _, l := range listeners {
				_ = l.Close()
			}
			return 1
		}
		listeners = append(listeners, l)
	}
	srv := topspin.NewServer(matrix.ServerOptions()...) // with OpenTelemetry, for the trace check
	matrixpb.RegisterMatrixServer(srv, matrix.NewService())
	out := bufio.NewWriter(os.Stdout)
	for i, l := range listeners {
		go func() {
			if err := srv.Serve(l); err != nil {
				fmt.Fprintf(os.Stderr, "matrix-server: serve %s: %v\n", addrs[i], err)
			}
		}()
		fmt.Fprintf(out, "listening %s\n", realAddr(addrs[i], l))
	}
	if err := out.Flush(); err != nil {
		fmt.Fprintf(os.Stderr, "matrix-server: stdout: %v\n", err)
	}
	<-sig
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(stopGrace):
		srv.Stop()
	}
	return 0
}

// realAddr is the address clients dial: a TCP or TLS port resolved, a Unix socket's path.
func realAddr(target string, l net.Listener) string {
	network, _, _ := topspin.ParseTarget(target)
	a := l.Addr().String()
	switch {
	case network == "tcp":
		return "tcp://" + a
	case network == "tls":
		return "tls://" + a
	case network == "unix" && strings.HasPrefix(a, "/"):
		return "unix://" + a
	}
	return target
}
