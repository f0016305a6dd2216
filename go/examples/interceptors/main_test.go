package main

import (
	"io"
	"os"
	"strings"
	"testing"
)

// TestInterceptors runs the README's interceptor example, which must be this directory's
// main.go word for word, and checks what it prints.
func TestInterceptors(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```go\n"+string(src)+"```") {
		t.Fatal("go/README.md's interceptor example is not examples/interceptors/main.go as is")
	}
	r, w, _ := os.Pipe()
	stdout := os.Stdout
	os.Stdout = w
	main()
	os.Stdout = stdout
	_ = w.Close()
	out, _ := io.ReadAll(r)
	want := "server: /kv.v1.Store/Put OK\nclient: put: OK\nserver: /kv.v1.Store/Get UNAUTHENTICATED\nclient without a token: get: UNAUTHENTICATED\n"
	if string(out) != want {
		t.Fatalf("the example printed %q, want %q", out, want)
	}
}
