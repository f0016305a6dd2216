#!/usr/bin/env bash
# The fault test of balanced channels across a real (simulated) network: four
# topspin servers in network namespaces of their own, a client in a fifth balancing over
# `dns:///svc.topspin.test:50051` under bounded load, and faults — a server not serving
# (health), a link cut on the server's side and restored, a server killed (SIGKILL) and
# restarted, delay and loss through the test's own TCP proxy (this kernel has no netem), a
# server's namespace removed. Prints calls succeeded/failed per phase and the failover time
# after each cut, and checks every call against the servers' execution logs (none lost that
# the policy forbids, none run twice). See crates/topspin-netns/README.md.
#
# Needs root (namespaces); without it, or without namespace support, it prints why and skips
# with exit status 77 (the automake convention scripts/test.sh reads as "skipped") — unless
# TOPSPIN_REQUIRE_NETNS=1, then that is a failure (exit 1). Bounded: the test ends
# itself after 150 s, this script kills it after 170 s; namespaces (prefix `tsn`) are removed
# at the start and at the end, also on failure. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
if [ "$(id -u)" != 0 ]; then
  if [ -n "${TOPSPIN_REQUIRE_NETNS:-}" ]; then
    echo "test-netns: FAILED: the netns fault test needs root (network namespaces), and TOPSPIN_REQUIRE_NETNS is set" >&2
    exit 1
  fi
  skip_part "needs root (network namespaces); TOPSPIN_REQUIRE_NETNS=1 makes this a failure"
fi
./scripts/setup-netns.sh
printf '\n== netns: build the replica server and the test\n'
cargo build -q -p topspin-netns --bin netns-server --bin netns-faults
BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug"
printf '\n== netns: fault test\n'
out=$(mktemp)
trap 'rm -f "$out"; lib_cleanup' EXIT
timeout --kill-after=5 170 "$BIN/netns-faults" | tee "$out"
# The test prints "SKIP netns fault test: WHY" and exits 0 when the machine cannot run it.
why=$(sed -n 's/^SKIP netns fault test: //p' "$out")
[ -z "$why" ] || skip_part "$why"
