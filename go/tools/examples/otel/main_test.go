package main

import (
	"testing"

	"github.com/topspin-rpc/topspin/go/internal/readmetest"
)

// TestOtelExample runs the README's OpenTelemetry example, which must be this directory's
// main.go word for word, and checks what it prints.
func TestOtelExample(t *testing.T) {
	readmetest.HoldsFile(t, "../../../README.md", "main.go")
	want := `server kv.v1.Store/Put: trace of root true, parent kv.v1.Store/Put (client)
client kv.v1.Store/Put: trace of root true, parent greet (internal)
internal greet: trace of root true, parent none
rpc.server.duration (ms): 1 call
rpc.client.duration (ms): 1 call
`
	if out := readmetest.Stdout(main); out != want {
		t.Fatalf("the example printed %q, want %q", out, want)
	}
}
