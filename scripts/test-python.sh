#!/usr/bin/env bash
# The Python binding's tests: set-up (venv, extension), the Rust interop peers, ruff, mypy
# (the package, the generated code and the example), pytest. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-python.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
step() { printf '\n== %s\n' "$*"; }
step "Rust interop peers (kvstore-server, kvstore-client, topspin CLI)"
cargo build -q -p kvstore --bins -p topspin-cli
step "cargo fmt / clippy (the extension crate)"
(cd bindings/python && cargo fmt --check && cargo clippy -q --release --all-targets -- -D warnings)
cd bindings/python
PY=.venv/bin/python
step "generate the kv example's code (python -m topspin.gen)"
rm -rf tests/gen_out
$PY -m topspin.gen -I ../../examples/kvstore/proto kv/v1/kv.proto -o tests/gen_out >/dev/null
step "ruff"
$PY -m ruff check python tests examples bench
$PY -m ruff format --check python tests examples bench
step "mypy (package, generated code, example, tests)"
MYPYPATH=tests/gen_out $PY -m mypy python/topspin examples tests/gen_out bench tests/typed_use.py
step "pytest"
$PY -m pytest -q tests
step "python: all tests passed"
