// Command matrix-client is the Go client of the cross-language matrix
// (testdata/matrix/README.md): it runs the matrix checks in order against --target
// (tcp://host:port, unix:///path, or tls://host:port trusting the CA certificates of
// --ca FILE instead of the system's), printing "ok NAME", "FAIL NAME: why" or
// "skip NAME: why" for each, and exits 0 if none failed, 1 otherwise.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"os"

	"github.com/topspin-rpc/topspin/go/topspin"

	"github.com/topspin-rpc/topspin/go/tools/internal/matrix"
)

func main() {
	target := flag.String("target", "", "the server: tcp://host:port, unix:///path or tls://host:port")
	caFile := flag.String("ca", "", "the CA certificates (PEM) a tls:// server's certificate must chain to")
	flag.Parse()
	if *target == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: matrix-client [--ca FILE] --target ADDR")
		os.Exit(2)
	}
	var opts []topspin.Option
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "matrix-client: --ca: %v\n", err)
			os.Exit(2)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			fmt.Fprintf(os.Stderr, "matrix-client: --ca %s: no PEM certificate in it\n", *caFile)
			os.Exit(2)
		}
		opts = append(opts, topspin.WithTLS(&tls.Config{RootCAs: roots}))
	}
	// os.Stdout is unbuffered: each line goes out as its check ends.
	ok := matrix.Run(*target, fmt.Sprintf("go-%d", os.Getpid()), os.Stdout, opts...)
	if !ok {
		os.Exit(1)
	}
}
