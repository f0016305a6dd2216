#!/usr/bin/env bash
# Installs what the project needs on a fresh machine; safe to run again (it skips what is there).
set -euo pipefail
cd "$(dirname "$0")/.."

have() { command -v "$1" >/dev/null 2>&1; }

if ! have cargo; then
  echo "setup: cargo not found. Install Rust (rustup) first; this machine kind ships it." >&2
  exit 1
fi
# Lints used by the test command.
for c in rustfmt clippy; do
  rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
done
# Fuzzing needs a nightly toolchain (preinstalled on this machine kind) and cargo-fuzz (crates.io).
if rustup toolchain list | grep -q '^nightly'; then
  have cargo-fuzz || cargo install cargo-fuzz --locked --quiet
else
  echo "setup: no nightly toolchain; fuzz targets will not be built (cargo fuzz needs nightly)." >&2
fi
