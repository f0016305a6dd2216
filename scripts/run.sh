#!/usr/bin/env bash
# The main job: the quick side-by-side benchmark — topspin against the raw-socket floor and
# tonic, tarpc, capnp-rpc and Thrift, measured in the same run (table on stdout, JSON and PNG
# plots in bench-out/). Options pass on to scripts/bench.sh (e.g. --full).
set -euo pipefail
cd "$(dirname "$0")/.."
exec ./scripts/bench.sh "$@"
