// Package kvstore holds the Go code generated from examples/kvstore/proto/kv/v1/kv.proto
// (package kvpb) and a Go implementation of its Store service.
package kvstore

//go:generate go -C ../../gen run ./cmd/topspin-gen -I ../../examples/kvstore/proto -o .. -module github.com/topspin-rpc/topspin/go -M kv/v1/kv.proto=github.com/topspin-rpc/topspin/go/examples/kvstore/kvpb kv/v1/kv.proto
