#!/usr/bin/env bash
# Every test of every language: formatting, lints, unit/integration/property/doc tests, test
# vectors, and a build of the fuzz targets. Installs what it needs first.
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
if [ -x scripts/fuzz.sh ] && rustup toolchain list | grep -q '^nightly'; then
  step "fuzz targets build"
  ./scripts/fuzz.sh --build-only
fi
step "all tests passed"
