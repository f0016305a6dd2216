package main

import (
	"testing"

	"github.com/topspin-rpc/topspin/go/internal/readmetest"
)

// TestInterceptors runs the README's interceptor example, which must be this directory's
// main.go word for word, and checks what it prints.
func TestInterceptors(t *testing.T) {
	readmetest.HoldsFile(t, "../../README.md", "main.go")
	want := "server: /kv.v1.Store/Put OK\nclient: put: OK\nserver: /kv.v1.Store/Get UNAUTHENTICATED\nclient without a token: get: UNAUTHENTICATED\n"
	if out := readmetest.Stdout(main); out != want {
		t.Fatalf("the example printed %q, want %q", out, want)
	}
}
