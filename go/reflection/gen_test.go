package reflection_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The .proto is a copy of the Rust crate's, and reflectionpb is what topspin-gen makes of it
// now (scripts/test-go.sh checks only the kvstore example's generated code).
func TestGeneratedCodeIsUpToDate(t *testing.T) {
	const proto = "topspin/reflection/v1/reflection.proto"
	ours, err := os.ReadFile(filepath.Join("proto", proto))
	if err != nil {
		t.Fatal(err)
	}
	crate, err := os.ReadFile(filepath.Join("..", "..", "crates", "topspin-reflection", "proto", proto))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ours, crate) {
		t.Fatalf("go/reflection/proto/%s differs from the crate's: copy it again and run go generate ./reflection", proto)
	}
	out := t.TempDir()
	// The generator is a module of its own (go/gen), run from there.
	cmd := exec.Command("go", "-C", "../gen", "run", "./cmd/topspin-gen", "-I", "../reflection/proto", "-o", out,
		"-module", "github.com/topspin-rpc/topspin/go",
		"-M", proto+"=github.com/topspin-rpc/topspin/go/reflection/reflectionpb", proto)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("topspin-gen: %v: %s", err, b)
	}
	for _, f := range []string{"reflection.pb.go", "reflection_topspin.pb.go"} {
		want, err := os.ReadFile(filepath.Join(out, "reflection", "reflectionpb", f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("reflectionpb", f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("reflectionpb/%s is out of date: run go generate ./reflection", f)
		}
	}
}
