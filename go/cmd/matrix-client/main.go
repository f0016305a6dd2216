// Command matrix-client is the Go client of the cross-language matrix
// (testdata/matrix/README.md): it runs the matrix checks in order against --target
// (tcp://host:port or unix:///path), printing "ok NAME", "FAIL NAME: why" or
// "skip NAME: why" for each, and exits 0 if none failed, 1 otherwise.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/topspin-rpc/topspin/go/internal/matrix"
)

func main() {
	target := flag.String("target", "", "the server: tcp://host:port or unix:///path")
	flag.Parse()
	if *target == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: matrix-client --target ADDR")
		os.Exit(2)
	}
	// os.Stdout is unbuffered: each line goes out as its check ends.
	ok := matrix.Run(*target, fmt.Sprintf("go-%d", os.Getpid()), os.Stdout)
	if !ok {
		os.Exit(1)
	}
}
