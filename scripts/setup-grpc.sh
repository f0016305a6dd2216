#!/usr/bin/env bash
# Installs what scripts/test-grpc.sh needs; idempotent: says what it will install, and installs
# nothing that is there:
#   - Go, when missing (apt golang-go: grpc-go's client is built here)
#   - grpcurl, pinned, built with `go install` from the Go module proxy into target/grpc-tools/
#   - a venv bindings/python/.venv-grpc with grpcio, grpcio-tools (stubs from the .proto) and
#     grpcio-status (reads a status's details the way grpcio applications do)
# Python >= 3.11 (PYTHON, default python3) and Go are checked before anything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
GRPCURL_VERSION=v1.9.3
TOOLS=$PWD/target/grpc-tools
VENV=bindings/python/.venv-grpc
PY=${PYTHON:-python3}
want=(grpcio grpcio-tools grpcio-status)

go_path
check_go "$(go_min crates/topspin/tests/grpc-go-*/go.mod)"
# (`go install` builds say "dev build" for -version: a stamp file records the version.)
grpcurl=""
if [ ! -x "$TOOLS/grpcurl" ] || [ "$(cat "$TOOLS/grpcurl.version" 2>/dev/null)" != "$GRPCURL_VERSION" ]; then
  grpcurl=1
  plan "grpcurl $GRPCURL_VERSION (go install, into target/grpc-tools/)"
fi
check_venv "$VENV" "$PY" "${want[@]}"

plan_show setup-grpc || exit 0
apt_pkgs=()
[ -z "$go_apt" ] || apt_pkgs+=("$go_apt")
[ -z "$venv_apt" ] || apt_pkgs+=("$venv_apt")
apt_install "${apt_pkgs[@]}"
go_path
if [ -n "$grpcurl" ]; then
  mkdir -p "$TOOLS"
  GOBIN="$TOOLS" go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
  echo "$GRPCURL_VERSION" > "$TOOLS/grpcurl.version"
fi
[ -z "$new_venv" ] || "$PY" -m venv "$VENV"
[ ${#venv_missing[@]} -eq 0 ] || "$VENV/bin/python" -m pip install -q "${venv_missing[@]}"
