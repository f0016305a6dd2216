#!/usr/bin/env bash
# The main job: a 20-byte unary echo over TCP and a Unix socket, beside a raw blocking-socket
# echo measured in the same run, with latency percentiles.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo run --release --locked -q -p topspin --example latency
