#!/usr/bin/env bash
# The Python binding's tests: set-up (venv, extension, grpcurl), the Rust interop peers, ruff,
# mypy (the package, the generated code and the example), pytest, then the lifecycle tests again
# with SIGINT ignored (how `nohup ./scripts/test.sh &` starts everything: the tests must not
# depend on it). Exits non-zero on any failure.
#
# KVSTORE_SERVER, KVSTORE_CLIENT and TOPSPIN_CLI may name prebuilt peers; otherwise they are
# built here.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh rustfmt clippy
./scripts/setup-python.sh
# grpcurl calls the Python server's gRPC face (tests/test_health_reflection.py): required here.
./scripts/setup-grpcurl.sh
export GRPCURL="$PWD/target/grpc-tools/grpcurl" TOPSPIN_INTEROP=1
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
step() { printf '\n== %s\n' "$*"; }
step "Rust interop peers (kvstore-server, kvstore-client, topspin CLI)"
if [ -n "${KVSTORE_SERVER:-}" ] && [ -n "${KVSTORE_CLIENT:-}" ] && [ -n "${TOPSPIN_CLI:-}" ]; then
  echo "using $KVSTORE_SERVER, $KVSTORE_CLIENT, $TOPSPIN_CLI"
else
  cargo build -q -p kvstore --bins -p topspin-cli
  export KVSTORE_SERVER="${KVSTORE_SERVER:-$CARGO_TARGET_DIR/debug/kvstore-server}"
  export KVSTORE_CLIENT="${KVSTORE_CLIENT:-$CARGO_TARGET_DIR/debug/kvstore-client}"
  export TOPSPIN_CLI="${TOPSPIN_CLI:-$CARGO_TARGET_DIR/debug/topspin}"
fi
step "cargo fmt / clippy (the extension crate)"
(cd bindings/python && cargo fmt --check && cargo clippy -q --release --all-targets -- -D warnings)
cd bindings/python
PY=.venv/bin/python
step "generate the kv example's code (python -m topspin.gen)"
rm -rf tests/gen_out
$PY -m topspin.gen -I ../../examples/kvstore/proto kv/v1/kv.proto -o tests/gen_out >/dev/null
$PY bench/bench.py --generate
step "ruff"
$PY -m ruff check python tests examples bench matrix
$PY -m ruff format --check python tests examples bench matrix
step "mypy (package, generated code, example, tests)"
MYPYPATH=tests/gen_out:bench/gen_out:examples:tests $PY -m mypy python/topspin examples tests/gen_out bench tests/typed_use.py \
  tests/test_tls.py tests/test_config.py tests/test_stream_trailers.py tests/test_interceptors.py \
  tests/test_otel.py tests/test_typing.py tests/test_health_reflection.py
step "pytest"
$PY -m pytest -q tests
step "pytest: the lifecycle tests (Ctrl-C, SIGINT) with SIGINT ignored, as in a background job"
# `trap '' INT` makes SIGINT ignored for this subshell and what it runs, as a non-interactive
# shell does for `cmd &`; the first command checks that it is.
(
  trap '' INT
  $PY -c 'import signal, sys; sys.exit(signal.getsignal(signal.SIGINT) is not signal.SIG_IGN)'
  $PY -m pytest -q -p no:cacheprovider tests/test_lifecycle.py
)
step "benchmark smoke run (0.1 s per workload; no timings checked)"
$PY bench/bench.py --seconds 0.1 >/dev/null
cd ../..
step "the wheel (topspin-rpc): maturin build, pip install into a fresh venv offline, topspin-gen, a call"
# What a user of the published wheel gets: no checkout on sys.path, no build tools, only the
# wheel and protobuf (its wheel saved by setup-python.sh; --no-index, so nothing is fetched).
t0=$SECONDS
wheel_dir=$(mktemp -d)
trap 'rm -rf "$wheel_dir"' EXIT
(cd bindings/python && VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" \
  .venv/bin/maturin build --release -q -o "$wheel_dir")
wheels=("$wheel_dir"/topspin_rpc-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || { echo "expected one topspin_rpc wheel: ${wheels[*]}" >&2; exit 1; }
WHEEL=${wheels[0]}
echo "$(basename "$WHEEL"): $(du -k "$WHEEL" | cut -f1) KiB"
bindings/python/.venv/bin/python -m venv "$wheel_dir/venv"
"$wheel_dir/venv/bin/python" -m pip install -q --no-index \
  --find-links bindings/python/.venv/wheelhouse "$WHEEL"
cp bindings/python/tests/wheel/hello.proto bindings/python/tests/wheel/hello.py "$wheel_dir/"
(cd "$wheel_dir" && env -u PYTHONPATH venv/bin/topspin-gen -I . hello.proto -o gen \
  && env -u PYTHONPATH timeout 60 venv/bin/python hello.py)
echo "wheel check: $((SECONDS - t0)) s"
# A CPython 3.9 if the machine has one (plain, or installed by pyenv).
PY39=""
if python3.9 -c '' >/dev/null 2>&1; then
  PY39=python3.9
elif command -v pyenv >/dev/null 2>&1; then
  v=$(pyenv versions --bare 2>/dev/null | grep -m1 '^3\.9\.' || true)
  [ -n "$v" ] && PY39="$(pyenv root)/versions/$v/bin/python3.9"
fi
if [ -n "$PY39" ]; then
  step "the abi3 wheel on CPython 3.9 (the oldest supported)"
  V39=bindings/python/.venv39
  [ -x "$V39/bin/python" ] || "$PY39" -m venv "$V39"
  # The distribution's old name (before topspin-rpc) out first: it owns the same files.
  "$V39/bin/python" -m pip uninstall -q -y topspin >/dev/null 2>&1 || true
  "$V39/bin/python" -m pip install -q --force-reinstall --no-deps "$WHEEL"
  "$V39/bin/python" -m pip show -q pytest protobuf >/dev/null 2>&1 || "$V39/bin/python" -m pip install -q pytest protobuf
  (cd bindings/python && .venv39/bin/python -m pytest -q -p no:cacheprovider \
    tests/test_client_kvstore.py tests/test_server.py tests/test_lifecycle.py tests/test_readme.py \
    tests/test_config.py tests/test_stream_trailers.py)
fi
step "python: all tests passed"
