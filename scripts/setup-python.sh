#!/usr/bin/env bash
# Sets up the Python binding's venv (bindings/python/.venv): the build tool (maturin), the test
# and lint tools, protobuf, mypy-protobuf (the generated stubs), OpenTelemetry's API and SDK
# (topspin.otel and its tests), and grpcio + grpcio-tools (only for the benchmark's grpcio peer),
# then builds and installs the `topspin` extension into it (cargo rebuilds only what changed).
# Idempotent: says what it will install, and installs nothing that is there.
#
# Needs Python >= 3.11 (PYTHON, default python3), checked before anything is installed; on
# Debian, python3-venv comes from apt (through sudo when not root) when `-m venv` lacks it.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
VENV=bindings/python/.venv
PY=${PYTHON:-python3}
want=(maturin pytest mypy ruff protobuf grpcio grpcio-tools types-protobuf cryptography
  opentelemetry-api opentelemetry-sdk mypy-protobuf)

check_venv "$VENV" "$PY" "${want[@]}"

plan_show setup-python || true
[ -z "$venv_apt" ] || apt_install "$venv_apt"
[ -z "$new_venv" ] || "$PY" -m venv "$VENV"
[ ${#venv_missing[@]} -eq 0 ] || "$VENV/bin/python" -m pip install -q "${venv_missing[@]}"
# The distribution was named `topspin` before `topspin-rpc` (`topspin` on PyPI is another
# project): a venv made then has its record (a .pth file), which `maturin develop` leaves.
if "$VENV/bin/python" -m pip show -q topspin >/dev/null 2>&1; then
  echo "setup-python: removing the distribution's old name (topspin) from the venv"
  "$VENV/bin/python" -m pip uninstall -q -y topspin
fi
# protobuf's wheel for scripts/test-python.sh's check of the built wheel in a fresh venv
# (installed there with --no-index): the version in this venv, downloaded once.
pb=$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("protobuf"))')
if ! compgen -G "$VENV/wheelhouse/protobuf-$pb-*.whl" >/dev/null; then
  echo "setup-python: protobuf $pb's wheel into $VENV/wheelhouse (pip download)"
  "$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: -d "$VENV/wheelhouse" "protobuf==$pb"
fi
# Build the extension (release, abi3) and install it into the venv; cargo rebuilds only what
# changed. The root target directory is shared so dependencies are not compiled twice.
echo "setup-python: the topspin extension (maturin develop --release)"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
(cd bindings/python && VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" \
  .venv/bin/maturin develop --release -q)
