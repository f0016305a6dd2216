// Command protoc-gen-go-topspin is a protoc plugin that writes the topspin service code of
// each .proto file with services: the same <name>_topspin.pb.go that topspin-gen writes (a
// server interface, a Register function, a typed client). The messages are protoc-gen-go's:
// run both plugins into the same directory with the same options.
//
// With buf (buf.gen.yaml; both plugins on PATH):
//
//	version: v2
//	plugins:
//	  - local: protoc-gen-go
//	    out: gen
//	    opt: paths=source_relative
//	  - local: protoc-gen-go-topspin
//	    out: gen
//	    opt: paths=source_relative
//
// With protoc:
//
//	protoc -I proto --go_out=gen --go_opt=paths=source_relative \
//	  --go-topspin_out=gen --go-topspin_opt=paths=source_relative kv/v1/kv.proto
//
// It takes protoc-gen-go's options for output paths and import paths (paths=, module=,
// M<file>=<import path>), and no others.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/topspin-rpc/topspin/go/gen/internal/servicegen"
	"google.golang.org/protobuf/cmd/protoc-gen-go/internal_gengo"
	"google.golang.org/protobuf/compiler/protogen"
)

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "--help") {
		fmt.Printf("%s: a protoc plugin writing topspin service code next to protoc-gen-go's messages\n",
			filepath.Base(os.Args[0]))
		return
	}
	protogen.Options{}.Run(generate)
}

// generate writes the service code of every file to generate that has services.
func generate(gen *protogen.Plugin) error {
	// What protoc-gen-go supports, since the files are also its.
	gen.SupportedFeatures = internal_gengo.SupportedFeatures
	gen.SupportedEditionsMinimum = internal_gengo.SupportedEditionsMinimum
	gen.SupportedEditionsMaximum = internal_gengo.SupportedEditionsMaximum
	for _, f := range gen.Files {
		if f.Generate && len(f.Services) > 0 {
			servicegen.Generate(gen, f, "protoc-gen-go-topspin")
		}
	}
	return nil
}
