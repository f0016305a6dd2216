package readme

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// step is one fenced block of the section, in reading order.
type step struct {
	lang string // "sh", "go", "proto", "" (output)
	text string
}

// section returns the fenced blocks of the README section titled heading.
func section(t *testing.T, readme, heading string) []step {
	t.Helper()
	start := strings.Index(readme, "\n## "+heading+"\n")
	if start < 0 {
		t.Fatalf("README has no section %q", heading)
	}
	body := readme[start+1:]
	if end := strings.Index(body[3:], "\n## "); end >= 0 {
		body = body[:end+3]
	}
	var steps []step
	for _, m := range regexp.MustCompile("(?s)\n```([a-z]*)\n(.*?)\n```\n").FindAllStringSubmatch(body, -1) {
		steps = append(steps, step{lang: m[1], text: m[2] + "\n"})
	}
	return steps
}

// goTool is the go command (go test puts its GOROOT/bin first on PATH).
func goTool(t *testing.T) string {
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestYourOwnServiceAsWritten follows go/README.md's "Your own service" in a temporary
// directory: its sh blocks run in order with TOPSPIN set to this checkout (go mod init,
// the replace, go mod tidy, go tool topspin-gen, go build), the files it shows (the first
// line of each block names it) are written as they come, then the server and the client
// it builds run and the client must print what the README says. The one departure: they
// run on a Unix socket in the temporary directory (-addr), not on port 50051, which
// another program may hold. The go commands run with GOFLAGS=-mod=mod, GOPROXY as the
// environment has it, and the module cache as it is (what scripts/setup-go.sh fills).
func TestYourOwnServiceAsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module of its own (a few seconds with warm caches)")
	}
	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	checkout, err := filepath.Abs("../../../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env := append(os.Environ(), "TOPSPIN="+checkout, "GOWORK=off",
		"GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"),
		"PATH="+filepath.Dir(goTool(t))+string(os.PathListSeparator)+os.Getenv("PATH"))

	steps := section(t, string(readme), "Your own service")
	var run, output string
	files := 0
	for _, s := range steps {
		switch {
		case s.lang == "sh" && strings.Contains(s.text, "./bin/server"):
			run = s.text
		case s.lang == "sh":
			if run != "" {
				t.Fatalf("a sh block after the one that runs the server:\n%s", s.text)
			}
			t.Logf("$ %s", strings.ReplaceAll(strings.TrimSpace(s.text), "\n", "\n$ "))
			cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", s.text)
			cmd.Dir, cmd.Env = dir, env
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%v\n%s\nwhile running:\n%s", err, out, s.text)
			}
		case s.lang == "go" || s.lang == "proto":
			first, _, _ := strings.Cut(s.text, "\n")
			name, ok := strings.CutPrefix(first, "// ")
			if !ok || strings.ContainsAny(name, " \t") {
				t.Fatalf("a %s block whose first line does not name its file: %q", s.lang, first)
			}
			path := filepath.Join(dir, filepath.FromSlash(name))
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(s.text), 0o644); err != nil {
				t.Fatal(err)
			}
			files++
		case s.lang == "" && run != "":
			output = s.text
		}
	}
	if files != 3 || run != "./bin/server &\n./bin/client\n" || output == "" {
		t.Fatalf("the section changed shape: %d files, run block %q, output %q", files, run, output)
	}

	// ./bin/server & — wait for its first line; ./bin/client — its output.
	addr := "unix://" + filepath.Join(dir, "greet.sock")
	srv := exec.CommandContext(ctx, filepath.Join(dir, "bin", "server"), "-addr", addr)
	srv.Dir = dir
	srv.Stderr = os.Stderr
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "serving on "+addr+"\n" {
		t.Fatalf("server: %q, %v", line, err)
	}
	cli := exec.CommandContext(ctx, filepath.Join(dir, "bin", "client"), "-addr", addr)
	cli.Dir = dir
	var stderr bytes.Buffer
	cli.Stderr = &stderr
	got, err := cli.Output()
	if err != nil {
		t.Fatalf("client: %v\n%s%s", err, got, stderr.Bytes())
	}
	if string(got) != output {
		t.Fatalf("the client printed\n%s\nthe README says\n%s", got, output)
	}
}
