#!/usr/bin/env bash
# Every check of bindings/typescript: set-up, tsc --strict, eslint, the vector runner, compression
# negotiation (§15) and the memory budget for split messages (§9), keep-alive (§5.9), Node
# client ↔ Node server (TCP, Unix, ws://), interop with the Rust kvstore-server and the Rust
# `topspin` CLI over TCP, Unix sockets and ws:// (the CLI calling the Node server's WebSocket
# listener), the npm package as a user installs it (pack/check.sh: npm pack, the tarball in a
# fresh project, codegen for a small .proto, a Node server called), the browser test (Chromium,
# WebSocket, and the README's web page with bidi streaming) when the Rust server speaks ws://,
# and a short run of both benchmarks (every system answers; the figures of a short run mean
# nothing).
#
# KVSTORE_SERVER / TOPSPIN_CLI may name prebuilt binaries; otherwise they are built here.
# KVSTORE_SERVER_WS may name a kvstore-server built with the WebSocket transport for the
# browser test (default: KVSTORE_SERVER).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup-typescript.sh"
# grpcurl calls the Node server's gRPC face (test/grpc-tools.test.ts): required here.
"$root/scripts/setup-grpcurl.sh"
export GRPCURL="$root/target/grpc-tools/grpcurl" TOPSPIN_INTEROP=1

step() { printf '\n== typescript: %s\n' "$*"; }

if [ -z "${KVSTORE_SERVER:-}" ] || [ -z "${TOPSPIN_CLI:-}" ]; then
  step "building the Rust peers (kvstore-server, topspin CLI)"
  (cd "$root" && cargo build -q --locked -p kvstore --bin kvstore-server -p topspin-cli)
  target="${CARGO_TARGET_DIR:-$root/target}"
  export KVSTORE_SERVER="${KVSTORE_SERVER:-$target/debug/kvstore-server}"
  export TOPSPIN_CLI="${TOPSPIN_CLI:-$target/debug/topspin}"
fi

cd "$root/bindings/typescript"
step "tsc --strict (no emit) and eslint"
npx --no-install tsc -p tsconfig.json --noEmit
npx --no-install eslint .

step "build"
rm -rf dist
npx --no-install tsc -p tsconfig.json

step "node --test: vectors, node ↔ node, interop with Rust"
node --test --test-timeout=120000 dist/test/

step "npm pack: the tarball installed in a fresh project, code generated for a .proto, a Node server called"
pack/check.sh

step "client runtime size (min+gzip)"
node dist/bench/size.js

# The browser test: a Rust server that accepts ws:// (protocol.md §14.2; the kvstore server
# does, with the topspin crate's default features). A server that refuses ws:// fails the run.
ws_server="${KVSTORE_SERVER_WS:-$KVSTORE_SERVER}"
if ! node dist/browser/ws-support.js "$ws_server"; then
  echo "$ws_server does not accept ws:// addresses: the browser test cannot run" >&2
  exit 1
fi
step "browser: Node over ws://, then a Chromium page → Rust server over ws://"
KVSTORE_SERVER="$ws_server" node dist/browser/run.js
step "benchmarks, short runs (Node: topspin, grpc-js, connect-es; Chromium: topspin vs connect-web)"
node dist/bench/bench.js --quick
node dist/bench/browser.js --quick
step "all run checks passed"
