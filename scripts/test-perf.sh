#!/usr/bin/env bash
# The benchmark's placement modes return correct data: every TCP / Unix-socket system with its
# server in a process of its own (--separate-processes), smoke mode (few calls, no timings).
set -euo pipefail
cd "$(dirname "$0")/.."
exec ./scripts/bench.sh --smoke --separate-processes \
    --systems raw,raw-uds,topspin,topspin-uds,tonic,tarpc,capnp,thrift
