#!/usr/bin/env bash
# Set-up of the network-namespace fault test (scripts/test-netns.sh): the `ip` command
# (iproute2, from apt). Idempotent: installs nothing when `ip` is there, and nothing when not
# root (the test needs root; without it, it skips or fails, see scripts/test-netns.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
if ! have ip && [ "$(id -u)" = 0 ]; then
  plan "apt: iproute2"
  plan_show setup-netns
  apt_install iproute2
fi
