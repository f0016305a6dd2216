// Package matrixpb is the Go code generated from testdata/matrix/matrix.proto, the service of
// the cross-language matrix (testdata/matrix/README.md): messages, the MatrixServer
// interface and the MatrixClient.
package matrixpb

//go:generate go run ../../cmd/topspin-gen -I ../../../testdata/matrix -o ../.. -module github.com/topspin-rpc/topspin/go -M matrix.proto=github.com/topspin-rpc/topspin/go/internal/matrixpb matrix.proto
