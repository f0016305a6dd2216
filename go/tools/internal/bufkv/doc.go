// Package bufkv holds the kvstore example's Go code as `buf generate` writes it with
// protoc-gen-go and protoc-gen-go-topspin (buf.gen.yaml; package kvv1), and the tests that
// it is what buf (and protoc, when there is one) writes now and that its client calls the
// Rust kvstore-server.
//
// Regenerate, in go/tools/internal/bufkv, with both plugins on PATH:
//
//	go -C ../../../gen build -o "$PWD/bin/" google.golang.org/protobuf/cmd/protoc-gen-go ./cmd/protoc-gen-go-topspin
//	PATH="$PWD/bin:$PATH" buf generate ../../../../examples/kvstore/proto
package bufkv
