// Package matrixpb is the Go code generated from testdata/matrix/matrix.proto, the service of
// the cross-language matrix (testdata/matrix/README.md): messages, the MatrixServer
// interface and the MatrixClient.
package matrixpb

//go:generate go -C ../../../gen run ./cmd/topspin-gen -I ../../testdata/matrix -o ../tools -module github.com/topspin-rpc/topspin/go/tools -M matrix.proto=github.com/topspin-rpc/topspin/go/tools/internal/matrixpb matrix.proto
