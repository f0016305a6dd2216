#!/usr/bin/env bash
# Installs what the Rust side needs; safe to run again (it installs nothing that is there, and
# says what it will install before it does). With names, only those pieces:
#
#   rustfmt     the rustfmt component (cargo fmt)
#   clippy      the clippy component
#   compilers   Debian's capnproto and thrift-compiler: the benchmark's Cap'n Proto and Thrift
#               peers generate code with them at build time (any build of the whole workspace)
#   fonts       a TrueType font for the benchmark's plots (fonts-dejavu-core)
#   fuzz        cargo-fuzz (crates.io), when a nightly toolchain is there
#
# No names: all of them. System packages come from apt, through sudo when not root.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

all=(rustfmt clippy compilers fonts fuzz)
want=("$@")
[ ${#want[@]} -gt 0 ] || want=("${all[@]}")
wants() { [[ " ${want[*]} " == *" $1 "* ]]; }
for w in "${want[@]}"; do
  [[ " ${all[*]} " == *" $w "* ]] || { echo "setup: no piece '$w' (pieces: ${all[*]})" >&2; exit 2; }
done

if ! have cargo; then
  echo "setup: cargo not found. Install Rust first: https://rustup.rs (this machine kind ships it)." >&2
  exit 1
fi
# The crates' rust-version (Cargo.toml's [workspace.package]), checked before anything is
# installed: an older toolchain fails later with errors that do not say so.
rust_min=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' Cargo.toml | head -n1)
cargo_v=$(cargo --version 2>/dev/null | awk '{print $2}')
need_version "Rust (cargo)" "${cargo_v%%-*}" "$rust_min" \
  "Update the toolchain: rustup update stable (or install a newer one: https://rustup.rs)." || exit 1
if have rustc; then
  rustc_v=$(rustc --version 2>/dev/null | awk '{print $2}')
  need_version "Rust (rustc)" "${rustc_v%%-*}" "$rust_min" \
    "Update the toolchain: rustup update stable (or install a newer one: https://rustup.rs)." || exit 1
fi

components=()
if wants rustfmt && ! cargo fmt --version >/dev/null 2>&1; then components+=(rustfmt); fi
if wants clippy && ! cargo clippy --version >/dev/null 2>&1; then components+=(clippy); fi
if [ ${#components[@]} -gt 0 ]; then
  have rustup || { echo "setup: cargo ${components[*]} is missing and there is no rustup to add it" >&2; exit 1; }
  plan "rustup components: ${components[*]}"
fi
apt_pkgs=()
if wants compilers; then
  have capnp || apt_pkgs+=(capnproto)
  have thrift || apt_pkgs+=(thrift-compiler)
fi
if wants fonts; then
  [ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || apt_pkgs+=(fonts-dejavu-core)
fi
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  have apt-get || { echo "setup: please install ${apt_pkgs[*]} (needed by crates/topspin-bench)" >&2; exit 1; }
  plan "apt: ${apt_pkgs[*]}"
fi
fuzz=""
if wants fuzz; then
  if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "setup: no nightly toolchain; fuzz targets will not be built (cargo fuzz needs nightly)." >&2
  elif ! have cargo-fuzz; then
    fuzz=1
    plan "cargo-fuzz (cargo install --locked, from crates.io)"
  fi
fi

plan_show "setup (${want[*]})" || exit 0
[ ${#components[@]} -eq 0 ] || rustup component add "${components[@]}"
apt_install "${apt_pkgs[@]}"
[ -z "$fuzz" ] || cargo install cargo-fuzz --locked --quiet
