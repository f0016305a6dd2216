#!/usr/bin/env bash
# Installs what scripts/test-grpc.sh needs, idempotently (skips what is present):
#   - grpcurl, pinned, built with `go install` from the Go module proxy into target/grpc-tools/
#   - a venv bindings/python/.venv-grpc with grpcio, grpcio-tools (stubs from the .proto) and
#     grpcio-status (reads a status's details the way grpcio applications do)
set -euo pipefail
cd "$(dirname "$0")/.."
GRPCURL_VERSION=v1.9.3
TOOLS=$PWD/target/grpc-tools
# (`go install` builds say "dev build" for -version: a stamp file records the version.)
if [ ! -x "$TOOLS/grpcurl" ] || [ "$(cat "$TOOLS/grpcurl.version" 2>/dev/null)" != "$GRPCURL_VERSION" ]; then
  command -v go >/dev/null || { echo "setup-grpc: Go is needed (scripts/setup-go.sh)" >&2; exit 1; }
  mkdir -p "$TOOLS"
  GOBIN="$TOOLS" go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
  echo "$GRPCURL_VERSION" > "$TOOLS/grpcurl.version"
fi
VENV=bindings/python/.venv-grpc
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1 && command -v apt-get >/dev/null; then
    apt-get update -q && apt-get install -y -q python3-venv
  fi
  "$PY" -m venv "$VENV"
fi
missing=""
for p in grpcio grpcio-tools grpcio-status; do
  "$VENV/bin/python" -m pip show -q "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q $missing
fi
