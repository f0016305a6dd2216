#!/usr/bin/env bash
# Every test of the Go implementation (go/, its four modules: the runtime, topspinotel, gen,
# tools): formatting, tidy go.mod files (and none of the benchmark's, the generator's or
# OpenTelemetry's modules required or imported by the runtime), go vet, staticcheck, function and
# file lengths, the generated kvstore code is up to date, unit and vector tests with -race,
# a short bounded fuzz run of the decoder and the connection input, and interop with the
# Rust kvstore server and clients over TCP, TLS and Unix sockets (with compression and
# keep-alive), and protoc-gen-go-topspin under `buf generate` (buf from BUF, PATH or
# target/go-tools/, where scripts/setup-go.sh installs it). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-go.sh
# grpcurl calls the Go server's gRPC face in the interop tests.
./scripts/setup-grpcurl.sh
PATH="$PATH:/usr/local/go/bin"
PATH="$PATH:$(go env GOPATH)/bin"
export PATH
ROOT="$PWD"
step() { printf '\n== go: %s\n' "$*"; }

step "Rust peers for interop (kvstore-server, kvstore-client, topspin CLI)"
# Prebuilt peers can be given through KVSTORE_SERVER, KVSTORE_CLIENT and TOPSPIN_CLI.
if [ -x "${KVSTORE_SERVER:-}" ] && [ -x "${KVSTORE_CLIENT:-}" ] && [ -x "${TOPSPIN_CLI:-}" ]; then
  echo "using $KVSTORE_SERVER, $KVSTORE_CLIENT, $TOPSPIN_CLI"
else
  cargo build -q -p kvstore -p topspin-cli --bin kvstore-server --bin kvstore-client --bin topspin
  BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug"
  export KVSTORE_SERVER="$BIN/kvstore-server" KVSTORE_CLIENT="$BIN/kvstore-client" TOPSPIN_CLI="$BIN/topspin"
fi
export KV_PROTO_DIR="$ROOT/examples/kvstore/proto" TOPSPIN_INTEROP=1
# buf for the test of protoc-gen-go-topspin (go/tools/internal/bufkv), as setup-go.sh put it.
[ -x "${BUF:-}" ] || BUF="$ROOT/target/go-tools/buf"
export BUF

cd go
# The modules under go/: the runtime (.), then the nested ones (README.md: "Nested modules").
MODULES=". topspinotel gen tools"
each() { for m in $MODULES; do (cd "$m" && "$@") || { echo "in go/$m: $* failed"; return 1; }; done; }
step "gofmt"
unformatted="$(gofmt -l .)"
if [ -n "$unformatted" ]; then echo "not gofmt'ed: $unformatted"; exit 1; fi
step "go.mod files tidy (each module)"
each go mod tidy -diff
step "the runtime (go/go.mod, its packages and their tests) uses none of the benchmark's, the generator's or OpenTelemetry's modules"
# (go list -m all still shows OpenTelemetry's: grpc-go's go.mod requires it for packages of
# its own that the runtime does not import.)
if grep -E 'storj\.io/drpc|github\.com/bufbuild/protocompile|go\.opentelemetry\.io/' go.mod ||
  go list -deps -test ./... | grep -E '^(storj\.io/drpc|github\.com/bufbuild/protocompile|go\.opentelemetry\.io/)'; then
  echo "the runtime requires or imports the modules above: they belong in a nested module (go/tools, go/gen, go/topspinotel)"
  exit 1
fi
step "go vet (each module)"
each go vet ./...
step "staticcheck (each module)"
each staticcheck ./...
step "function and file lengths (no function over 80 lines, no file over 600; tests, generated code and gen/cmd, tools/cmd excepted)"
(cd tools && go run ./internal/funlen -max 80 -file-max 600 -skip gen/cmd,tools/cmd ..)
step "generated code is up to date (topspin-gen)"
go generate ./examples/kvstore
if ! git diff --quiet -- examples/kvstore/kvpb; then
  git --no-pager diff --stat -- examples/kvstore/kvpb
  echo "go/examples/kvstore/kvpb is out of date: run 'go generate ./examples/kvstore' in go/"
  exit 1
fi
(cd tools && go generate ./internal/matrixpb) && git diff --quiet -- tools/internal/matrixpb || { echo "go/tools/internal/matrixpb is out of date: run 'go generate ./internal/matrixpb' in go/tools"; exit 1; }
step "go test -race (vectors, runtime, generator and plugin, interop, buf generate, README quick start and 'Your own service')"
each go test -race -count=1 ./...
step "fuzz (bounded: 15 s per target)"
go test ./wire -run '^$' -fuzz '^FuzzDecode$' -fuzztime 15s
go test ./wire -run '^$' -fuzz '^FuzzConn$' -fuzztime 15s
step "bench smoke run (every system returns correct data; no timings)"
(cd tools && go run ./cmd/topspin-go-bench -smoke)
step "all tests passed"
