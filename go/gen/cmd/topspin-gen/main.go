// Command topspin-gen compiles .proto files without protoc (github.com/bufbuild/protocompile)
// and writes, for each, the protobuf messages (protoc-gen-go's own generator) and the
// topspin service code: a server interface, a Register function and a typed client.
//
//	topspin-gen -I proto -o . -module example.com/m -M kv/v1/kv.proto=example.com/m/kvpb kv/v1/kv.proto
//
// -M maps a .proto file to its Go import path (like protoc-gen-go's M option) for files
// without a go_package option. Output paths are relative to the import path's last
// element unless -source_relative is given.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/bufbuild/protocompile"
	"github.com/topspin-rpc/topspin/go/gen/internal/servicegen"
	"google.golang.org/protobuf/cmd/protoc-gen-go/internal_gengo"
	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	var includes, mappings multi
	flag.Var(&includes, "I", "import path (repeatable)")
	flag.Var(&mappings, "M", "file.proto=go/import/path (repeatable)")
	out := flag.String("o", ".", "output directory")
	sourceRelative := flag.Bool("source_relative", false, "write files next to their .proto path")
	module := flag.String("module", "", "strip this Go module path from output paths (as protoc-gen-go's module=)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: topspin-gen [-I dir]... [-M file=path]... [-o dir] file.proto...")
		os.Exit(2)
	}
	if err := run(includes, mappings, *out, *sourceRelative, *module, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "topspin-gen:", err)
		os.Exit(1)
	}
}

func run(includes, mappings []string, out string, sourceRelative bool, module string, files []string) error {
	if len(includes) == 0 {
		includes = []string{"."}
	}
	comp := protocompile.Compiler{
		Resolver:       protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: includes}),
		SourceInfoMode: protocompile.SourceInfoStandard,
	}
	compiled, err := comp.Compile(context.Background(), files...)
	if err != nil {
		return err
	}
	// Every file and its dependencies, dependencies first.
	var all []*descriptorpb.FileDescriptorProto
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := 0; i < imports.Len(); i++ {
			add(imports.Get(i).FileDescriptor)
		}
		all = append(all, protodesc.ToFileDescriptorProto(fd))
	}
	for _, f := range compiled {
		add(f)
	}
	params := mappings
	if sourceRelative {
		params = append(params, "paths=source_relative")
	}
	if module != "" {
		params = append(params, "module="+module)
	}
	for i := range params {
		if !strings.HasPrefix(params[i], "paths=") && !strings.HasPrefix(params[i], "module=") {
			params[i] = "M" + params[i]
		}
	}
	req := &pluginpb.CodeGeneratorRequest{FileToGenerate: files, ProtoFile: all,
		Parameter: proto.String(strings.Join(params, ","))}
	plugin, err := protogen.Options{}.New(req)
	if err != nil {
		return err
	}
	plugin.SupportedFeatures = internal_gengo.SupportedFeatures
	for _, f := range plugin.Files {
		if !f.Generate {
			continue
		}
		internal_gengo.GenerateFile(plugin, f)
		if len(f.Services) > 0 {
			servicegen.Generate(plugin, f, "topspin-gen")
		}
	}
	resp := plugin.Response()
	if resp.Error != nil {
		return fmt.Errorf("%s", resp.GetError())
	}
	for _, rf := range resp.File {
		path := filepath.Join(out, rf.GetName())
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(rf.GetContent()), 0o644); err != nil {
			return err
		}
	}
	return nil
}
