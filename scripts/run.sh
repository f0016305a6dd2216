#!/usr/bin/env bash
# The main job. For now: two protocol engines talking in memory, every frame printed.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo run --release --locked -q -p topspin-proto --example wire_demo
