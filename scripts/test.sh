#!/usr/bin/env bash
# Every test of every language: Rust (formatting, lints, unit/integration/property/doc tests,
# test vectors, benchmark smoke run, a build of the fuzz targets) and each other language's
# scripts/test-<lang>.sh (Go, Python, TypeScript). Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

step() { printf '\n== %s\n' "$*"; }

step "rustfmt"
cargo fmt --all -- --check
step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
step "cargo test (unit, integration, property, doc tests)"
cargo test --workspace --locked
if [ -f testdata/vectors/gen.py ]; then
  step "test vectors are up to date with their generator"
  python3 testdata/vectors/gen.py --check
fi
step "benchmark smoke run (every system returns correct data; no timings)"
# Debug builds are enough to check correctness and reuse what the tests compiled.
cargo build --workspace --bins --locked -q
"${CARGO_TARGET_DIR:-target}/debug/topspin-bench" --smoke
# The same with each TCP / Unix-socket system's server in a process of its own.
"${CARGO_TARGET_DIR:-target}/debug/topspin-bench" --smoke --separate-processes \
  --systems raw,raw-uds,topspin,topspin-uds,tonic,tarpc,capnp,thrift
# The other languages' suites — Go (go vet, staticcheck, go test -race), Python (ruff, mypy,
# pytest), TypeScript (tsc, eslint, node --test via npm, the Chromium test) — use the Rust
# peers just built (kvstore server and client, CLI). Then the suites against peers no one here
# wrote or across a network: grpc (grpcurl and Python grpcio against the server's gRPC face),
# grpcclient (topspin's gRPC client mode against grpc-go and a tonic kvstore) and netns
# (balancing across network namespaces with faults; needs root, and skips with a message
# without it unless TOPSPIN_REQUIRE_NETNS=1, which .ci/run sets).
bin="${CARGO_TARGET_DIR:-$PWD/target}/debug"
export KVSTORE_SERVER="$bin/kvstore-server" KVSTORE_CLIENT="$bin/kvstore-client" TOPSPIN_CLI="$bin/topspin"
for part in go python typescript grpc grpcclient netns; do
  step "$part (scripts/test-$part.sh)"
  "./scripts/test-$part.sh"
done
if [ -x scripts/fuzz.sh ] && rustup toolchain list | grep -q '^nightly'; then
  step "fuzz targets build"
  ./scripts/fuzz.sh --build-only
fi
step "all tests passed"
