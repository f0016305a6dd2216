#!/usr/bin/env bash
# topspin's gRPC client mode against servers no one here wrote: tonic (in-process, part of
# `cargo test -p topspin --test grpc_client`) and grpc-go (built here from
# crates/topspin/tests/grpc-go-server, modules from the Go proxy; the ignored grpc_go_* tests);
# and the generated kvstore client against a tonic kvstore.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-go.sh --toolchain-only
export PATH="$PATH:/usr/local/go/bin"
bin_dir="${CARGO_TARGET_DIR:-target}/grpc-go-server"
mkdir -p "$bin_dir"
bin_dir="$(realpath "$bin_dir")"
(cd crates/topspin/tests/grpc-go-server && go build -o "$bin_dir/server" .)
export GRPC_GO_SERVER="$bin_dir/server"
cargo test -p topspin --test grpc_client -- --include-ignored
cargo test -p kvstore --test grpc_tonic
