#!/usr/bin/env bash
# Sets up the Python binding's venv (bindings/python/.venv): the build tool (maturin), the test
# and lint tools, protobuf, and grpcio + grpcio-tools (only for the benchmark's grpcio peer),
# then builds and installs the `topspin` extension into it. Idempotent: skips what is present.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=bindings/python/.venv
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  # Debian's python3 needs python3-venv for `-m venv` (a pyenv or python.org build has it).
  if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1 && command -v apt-get >/dev/null; then
    apt-get update -q && apt-get install -y -q python3-venv
  fi
  "$PY" -m venv "$VENV"
fi
want="maturin pytest mypy ruff protobuf grpcio grpcio-tools types-protobuf cryptography"
missing=""
for p in $want; do
  "$VENV/bin/python" -m pip show -q "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q $missing
fi
# Build the extension (release, abi3) and install it into the venv; cargo rebuilds only what
# changed. The root target directory is shared so dependencies are not compiled twice.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
(cd bindings/python && VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" \
  .venv/bin/maturin develop --release -q)
