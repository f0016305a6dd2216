package main

import (
	"testing"

	"github.com/topspin-rpc/topspin/go/internal/readmetest"
)

// TestQuickStart runs the README's quick start, which must be this directory's main.go
// word for word, and checks what it prints.
func TestQuickStart(t *testing.T) {
	readmetest.HoldsFile(t, "../../README.md", "main.go")
	want := "greeting = hello (version 1)\nstatus: NOT_FOUND\nwatch: greeting\n"
	if out := readmetest.Stdout(main); out != want {
		t.Fatalf("quick start printed %q, want %q", out, want)
	}
}
