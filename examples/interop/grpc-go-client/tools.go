//go:build tools

// Package tools pins gRPC's own interop client (google.golang.org/grpc/interop/client) at the
// grpc-go version the other grpc-go programs here use; scripts/test-interop.sh builds it with
// `go build google.golang.org/grpc/interop/client` in this module.
package tools

import _ "google.golang.org/grpc/interop/client"
