module github.com/topspin-rpc/topspin/go/gen

go 1.23.0

require (
	github.com/bufbuild/protocompile v0.14.1
	google.golang.org/protobuf v1.36.12
)

require golang.org/x/sync v0.8.0 // indirect
