#!/usr/bin/env bash
# Soak test: a topspin server and several clients in one process making mixed calls (unary and
# streaming, dropped calls, short deadlines, oversize messages, killed connections) for a given
# time, printing RSS and the server's gauges every second; fails unless the server ends quiet
# (no open call, no reserved byte) and every call that should have succeeded did.
#
#   scripts/soak.sh                       60 s, 4 clients, CSV in bench-out/soak.csv
#   scripts/soak.sh --seconds 600 --clients 8 --csv /tmp/soak.csv
#
# The driver is crates/topspin/examples/soak.rs (built in release). Only loopback addresses.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

seconds=60
clients=4
csv="bench-out/soak.csv"
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) seconds="$2"; shift ;;
        --seconds=*) seconds="${1#--seconds=}" ;;
        --clients) clients="$2"; shift ;;
        --clients=*) clients="${1#--clients=}" ;;
        --csv) csv="$2"; shift ;;
        --csv=*) csv="${1#--csv=}" ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$(dirname "$csv")"
cargo build --release -q -p topspin --example soak
exec "${CARGO_TARGET_DIR:-target}/release/examples/soak" \
    --seconds "$seconds" --clients "$clients" --csv "$csv"
