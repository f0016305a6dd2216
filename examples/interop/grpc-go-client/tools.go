//go:build tools

// Package tools pins gRPC's own interop client and server (google.golang.org/grpc/interop/client
// and .../interop/server) at the grpc-go version the other grpc-go programs here use;
// scripts/test-interop.sh builds each with `go build` in this module.
package tools

import (
	_ "google.golang.org/grpc/interop/client"
	_ "google.golang.org/grpc/interop/server"
)
