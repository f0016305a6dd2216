#!/usr/bin/env bash
# gRPC's own interop client (grpc-go's google.golang.org/grpc/interop/client, built here from the
# Go proxy's modules, pinned in examples/interop/grpc-go-client/go.mod) against topspin's gRPC face
# serving the interop TestService (examples/interop, `topspin-interop-server`), over h2c: every
# case of that client that needs no cloud credentials, no xDS and no ORCA. Each case is its own
# run of the client, which exits non-zero on any failure; this script fails naming the cases that
# failed. scripts/test-grpc.sh runs it.
#
#   scripts/test-interop.sh [CASE...]     (default: all of them)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
./scripts/setup-go.sh --toolchain-only
export PATH="$PATH:/usr/local/go/bin"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}

cases=(empty_unary large_unary client_streaming server_streaming ping_pong empty_stream
       timeout_on_sleeping_server cancel_after_begin cancel_after_first_response
       status_code_and_message special_status_message custom_metadata unimplemented_method
       unimplemented_service pick_first_unary rpc_soak channel_soak)
[ $# -eq 0 ] || cases=("$@")

client="$CARGO_TARGET_DIR/grpc-go-interop/client"
mkdir -p "$(dirname "$client")"
(cd examples/interop/grpc-go-client && go build -o "$client" google.golang.org/grpc/interop/client)
cargo build -q -p topspin-interop --bin topspin-interop-server
server_bin="$CARGO_TARGET_DIR/debug/topspin-interop-server"

work=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

"$server_bin" tcp://127.0.0.1:0 > "$work/server.out" 2>&1 &
server_pid=$!
port=""
for _ in $(seq 100); do
  port=$(sed -n 's|^listening on tcp://127.0.0.1:||p' "$work/server.out" | head -n1)
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { echo "test-interop: the server did not start:" >&2; cat "$work/server.out" >&2; exit 1; }

failed=()
for c in "${cases[@]}"; do
  if timeout 120 "$client" -server_host=127.0.0.1 -server_port="$port" -test_case="$c" \
      -soak_iterations=20 > "$work/$c.log" 2>&1; then
    echo "interop $c: ok"
  else
    echo "interop $c: FAILED" >&2
    tail -n 20 "$work/$c.log" >&2
    failed+=("$c")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "test-interop: ${#failed[@]} of ${#cases[@]} cases failed: ${failed[*]}" >&2
  exit 1
fi
echo "test-interop: all ${#cases[@]} cases of grpc-go's interop client passed against topspin's gRPC face"
