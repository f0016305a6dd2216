#!/usr/bin/env bash
# Installs what scripts/test-grpc.sh needs; idempotent: says what it will install, and installs
# nothing that is there:
#   - Go, when missing (apt golang-go: grpc-go's client is built here)
#   - grpcurl, pinned, into target/grpc-tools/ (scripts/setup-grpcurl.sh)
#   - a venv bindings/python/.venv-grpc with grpcio, grpcio-tools (stubs from the .proto) and
#     grpcio-status (reads a status's details the way grpcio applications do)
# Python >= 3.11 (PYTHON, default python3) and Go are checked before anything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
VENV=bindings/python/.venv-grpc
PY=${PYTHON:-python3}
want=(grpcio grpcio-tools grpcio-status)

go_path
check_go "$(go_min crates/topspin/tests/grpc-go-*/go.mod)"
./scripts/setup-grpcurl.sh
go_path
check_venv "$VENV" "$PY" "${want[@]}"

plan_show setup-grpc || exit 0
apt_pkgs=()
[ -z "$go_apt" ] || apt_pkgs+=("$go_apt")
[ -z "$venv_apt" ] || apt_pkgs+=("$venv_apt")
apt_install "${apt_pkgs[@]}"
go_path
[ -z "$new_venv" ] || "$PY" -m venv "$VENV"
[ ${#venv_missing[@]} -eq 0 ] || "$VENV/bin/python" -m pip install -q "${venv_missing[@]}"
