#!/usr/bin/env bash
# gRPC's interop test cases both ways, with grpc-go's own interop programs (built here from the Go
# proxy's modules, pinned in examples/interop/grpc-go-client/go.mod), over h2c:
#   - grpc-go's interop client (google.golang.org/grpc/interop/client) against topspin's gRPC
#     face serving the interop TestService (examples/interop, `topspin-interop-server`): every
#     case of that client that needs no cloud credentials, no xDS and no ORCA (17);
#   - topspin's grpc:// client (`topspin-interop-client`) against grpc-go's interop server
#     (google.golang.org/grpc/interop/server): its 13 cases.
# Each client exits non-zero on any failure; this script fails naming the cases that failed.
# scripts/test-grpc.sh runs it.
#
#   scripts/test-interop.sh [CASE...]     (default: all of grpc-go's client's cases)
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
go_server="$CARGO_TARGET_DIR/grpc-go-interop/server"
mkdir -p "$(dirname "$client")"
(cd examples/interop/grpc-go-client &&
  go build -o "$client" google.golang.org/grpc/interop/client &&
  go build -o "$go_server" google.golang.org/grpc/interop/server)
cargo build -q -p topspin-interop --bins
server_bin="$CARGO_TARGET_DIR/debug/topspin-interop-server"
topspin_client="$CARGO_TARGET_DIR/debug/topspin-interop-client"

work=$(mktemp -d)
server_pid="" go_pid=""
stop() { if [ -n "$1" ]; then kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; fi; }
cleanup() {
  stop "$server_pid"
  stop "$go_pid"
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
stop "$server_pid"; server_pid=""

# The other way: topspin's grpc:// client against grpc-go's interop server, on a free port.
go_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$go_server" -port "$go_port" > "$work/go-server.out" 2>&1 &
go_pid=$!
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$go_port") 2>/dev/null && break
  sleep 0.1
done
if ! timeout 600 "$topspin_client" --server_port="$go_port" --test_case=all; then
  echo "test-interop: topspin's grpc:// client failed cases against grpc-go's interop server" >&2
  cat "$work/go-server.out" >&2
  exit 1
fi
echo "test-interop: topspin's grpc:// client passed every case against grpc-go's interop server"
