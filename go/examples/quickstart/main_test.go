package main

import (
	"io"
	"os"
	"strings"
	"testing"
)

// TestQuickStart runs the README's quick start, which must be this directory's main.go
// word for word, and checks what it prints.
func TestQuickStart(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```go\n"+string(src)+"```") {
		t.Fatal("go/README.md's quick start is not examples/quickstart/main.go as is")
	}
	r, w, _ := os.Pipe()
	stdout := os.Stdout
	os.Stdout = w
	main()
	os.Stdout = stdout
	_ = w.Close()
	out, _ := io.ReadAll(r)
	want := "greeting = hello (version 1)\nstatus: NOT_FOUND\nwatch: greeting\n"
	if string(out) != want {
		t.Fatalf("quick start printed %q, want %q", out, want)
	}
}
