// Package readmetest is for the tests that run a README's examples as written: whether the
// README holds a block of code word for word, and what a program prints.
package readmetest

import (
	"io"
	"os"
	"strings"
	"testing"
)

// Holds fails t unless the file at readme holds code as a ```go block, word for word.
func Holds(t *testing.T, readme, code, what string) {
	t.Helper()
	text, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(text), "```go\n"+code+"```") {
		t.Fatalf("%s is not in %s as written", what, readme)
	}
}

// HoldsFile is Holds for the whole of the file at src.
func HoldsFile(t *testing.T, readme, src string) {
	t.Helper()
	code, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	Holds(t, readme, string(code), src)
}

// Stdout runs f and returns what it printed to standard output.
func Stdout(f func()) string {
	r, w, _ := os.Pipe()
	stdout := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() {
		out, _ := io.ReadAll(r)
		done <- out
	}()
	f()
	os.Stdout = stdout
	_ = w.Close()
	return string(<-done)
}
