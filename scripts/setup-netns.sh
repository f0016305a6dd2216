#!/usr/bin/env bash
# Set-up of the network-namespace fault test (scripts/test-netns.sh): the `ip` command
# (iproute2). Idempotent: installs nothing when `ip` is there, and nothing when not root
# (the test then skips with a message).
set -euo pipefail
if ! command -v ip >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get update
  apt-get install -y iproute2
fi
