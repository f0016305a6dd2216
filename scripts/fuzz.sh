#!/usr/bin/env bash
# Fuzzes topspin-proto with cargo-fuzz (libFuzzer); see fuzz/README.md.
#
#   scripts/fuzz.sh                      seed from testdata/vectors, run every target 60 s
#   scripts/fuzz.sh --seconds 600 frame_decoder      one target (or several), 600 s each
#   FUZZ_SECONDS=30 scripts/fuzz.sh runtime_server
#   scripts/fuzz.sh --build-only         just build the targets (what CI runs)
#
# Installs cargo-fuzz (and a nightly toolchain, with rustup) when missing. Exits non-zero when
# a build fails or a target finds a crash; crashing inputs are left in fuzz/artifacts/<target>/.
# Environment: FUZZ_SECONDS (seconds per target, default 60; FUZZ_TIME is the old name),
# FUZZ_TOOLCHAIN (default nightly), FUZZ_ARGS (extra libFuzzer flags, e.g. "-jobs=2 -workers=2").
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

time_per_target="${FUZZ_SECONDS:-${FUZZ_TIME:-60}}"
toolchain="${FUZZ_TOOLCHAIN:-nightly}"
build_only=false
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --build-only) build_only=true ;;
        --seconds|--time) time_per_target="$2"; shift ;;
        --seconds=*|--time=*) time_per_target="${1#*=}" ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1") ;;
    esac
    shift
done

if ! cargo "+$toolchain" --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
        echo "fuzz.sh: installing the $toolchain toolchain (cargo-fuzz needs nightly)" >&2
        rustup toolchain install "$toolchain" --profile minimal
    else
        echo "fuzz.sh: cargo +$toolchain is not available and rustup is not installed" >&2
        exit 1
    fi
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

all_targets="$(cargo "+$toolchain" fuzz list)"
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets <<<"$all_targets"
fi
for t in "${targets[@]}"; do
    if ! grep -qx "$t" <<<"$all_targets"; then
        echo "fuzz.sh: no target $t (targets: ${all_targets//$'\n'/ })" >&2
        exit 2
    fi
done

if $build_only; then
    for t in "${targets[@]}"; do
        cargo "+$toolchain" fuzz build "$t"
    done
    exit 0
fi

"$root/fuzz/seed.sh"
# runtime_server reads connection_input's input layout: those seeds serve it as they are.
mkdir -p fuzz/corpus/runtime_server
cp -n fuzz/corpus/connection_input/* fuzz/corpus/runtime_server/ 2>/dev/null || true

failed=()
for t in "${targets[@]}"; do
    echo "fuzz.sh: $t for ${time_per_target}s" >&2
    mkdir -p "fuzz/corpus/$t"
    # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
    if ! cargo "+$toolchain" fuzz run "$t" "fuzz/corpus/$t" -- \
        -max_total_time="$time_per_target" -timeout=10 -print_final_stats=1 ${FUZZ_ARGS:-}; then
        failed+=("$t")
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz.sh: crashes in: ${failed[*]} (inputs in fuzz/artifacts/; reproduce with" \
        "cargo +$toolchain fuzz run <target> <file>)" >&2
    exit 1
fi
echo "fuzz.sh: no crashes" >&2
