package main

import (
	"io"
	"os"
	"strings"
	"testing"
)

// TestOtelExample runs the README's OpenTelemetry example, which must be this directory's
// main.go word for word, and checks what it prints.
func TestOtelExample(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```go\n"+string(src)+"```") {
		t.Fatal("go/README.md's OpenTelemetry example is not examples/otel/main.go as is")
	}
	r, w, _ := os.Pipe()
	stdout := os.Stdout
	os.Stdout = w
	main()
	os.Stdout = stdout
	_ = w.Close()
	out, _ := io.ReadAll(r)
	want := `server kv.v1.Store/Put: trace of root true, parent kv.v1.Store/Put (client)
client kv.v1.Store/Put: trace of root true, parent greet (internal)
internal greet: trace of root true, parent none
rpc.server.duration (ms): 1 call
rpc.client.duration (ms): 1 call
`
	if string(out) != want {
		t.Fatalf("the example printed %q, want %q", out, want)
	}
}
