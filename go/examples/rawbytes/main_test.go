package main

import (
	"os"
	"strings"
	"testing"

	"github.com/topspin-rpc/topspin/go/internal/readmetest"
)

// TestWithoutGeneratedCode checks that go/README.md's "Without generated code" blocks are
// the bodies of register and call as written, then runs them.
func TestWithoutGeneratedCode(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	start := strings.Index(section, "### Without generated code")
	if start < 0 {
		t.Fatal(`go/README.md has no "### Without generated code" section`)
	}
	section = section[start:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	blocks := strings.Split(section, "```go\n")[1:]
	if len(blocks) != 2 {
		t.Fatalf("want 2 go blocks in the section, found %d", len(blocks))
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range blocks {
		code := b[:strings.Index(b, "```")]
		var indented strings.Builder
		for _, line := range strings.SplitAfter(code, "\n") {
			if strings.TrimSpace(line) != "" {
				indented.WriteString("\t")
			}
			indented.WriteString(line)
		}
		if !strings.Contains(string(src), indented.String()) {
			t.Fatalf("block %d of the README's section is not in main.go as written:\n%s", i+1, code)
		}
	}
	if out, want := readmetest.Stdout(main), "Say: hi\nChat: one\nChat: two\n"; out != want {
		t.Fatalf("printed %q, want %q", out, want)
	}
}
