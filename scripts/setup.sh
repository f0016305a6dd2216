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
# The benchmark (crates/topspin-bench): its Cap'n Proto and Thrift peers generate code with the
# `capnp` and `thrift` compilers at build time, and its plots need a TrueType font.
bench_pkgs=()
have capnp || bench_pkgs+=(capnproto)
have thrift || bench_pkgs+=(thrift-compiler)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || bench_pkgs+=(fonts-dejavu-core)
if [ ${#bench_pkgs[@]} -gt 0 ]; then
  if have apt-get; then
    as_root=""; [ "$(id -u)" -eq 0 ] || as_root="sudo"
    $as_root apt-get update -qq
    $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${bench_pkgs[@]}"
  else
    echo "setup: please install ${bench_pkgs[*]} (needed by crates/topspin-bench)" >&2
  fi
fi
