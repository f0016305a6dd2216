// Command funlen checks the size of the Go library's code: it fails, listing each one, when
// a function (or a function literal) is longer than -max lines, or a file longer than
// -file-max lines, in the non-test Go files under the given directories.
//
// A function's length counts from its func keyword to its closing brace; a file's, all its
// lines. Test files (*_test.go), generated files (a "Code generated … DO NOT EDIT." line,
// as go generate writes them) and testdata directories are not checked; nor are the
// directories named by -skip (relative to the walked root, e.g. "gen/cmd").
//
//	go run ./internal/funlen -max 80 -file-max 600 -skip gen/cmd,tools/cmd ..   (in go/tools)
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

func main() {
	maxFunc := flag.Int("max", 80, "longest function allowed, in lines")
	maxFile := flag.Int("file-max", 0, "longest file allowed, in lines (0: no limit)")
	skip := flag.String("skip", "", "comma-separated directories (relative to each root) not to check")
	verbose := flag.Bool("v", false, "list the longest functions and files even when all are within the limits")
	flag.Parse()
	roots := flag.Args()
	if len(roots) == 0 {
		roots = []string{"."}
	}
	var skips []string
	if *skip != "" {
		skips = strings.Split(*skip, ",")
	}
	var all []Size
	for _, root := range roots {
		sizes, err := Measure(root, skips)
		if err != nil {
			fmt.Fprintln(os.Stderr, "funlen:", err)
			os.Exit(2)
		}
		all = append(all, sizes...)
	}
	over := Over(all, *maxFunc, *maxFile)
	if *verbose {
		for _, s := range Longest(all, 10) {
			fmt.Println(s)
		}
	}
	if len(over) > 0 {
		fmt.Fprintf(os.Stderr, "funlen: %d over the limits (functions %d lines, files %d lines):\n", len(over), *maxFunc, *maxFile)
		for _, s := range over {
			fmt.Fprintln(os.Stderr, "  "+s.String())
		}
		os.Exit(1)
	}
	fmt.Printf("funlen: %d functions and files checked, none over %d lines (functions) / %d lines (files)\n", len(all), *maxFunc, *maxFile)
}
