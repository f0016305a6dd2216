#!/usr/bin/env bash
# The benchmark: topspin against the raw-socket floor and tonic, tarpc, capnp-rpc and Thrift,
# side by side on this machine (crates/topspin-bench/README.md; workloads, method and the JSON
# report: docs/benchmarks.md).
#
#   scripts/bench.sh                 --quick (under 90 s quiet, then the same loaded): tables on
#                                    stdout, bench-out/quick.json and quick-loaded.json, PNG plots
#                                    (quiet run) in bench-out/
#   scripts/bench.sh --full          every workload and size (~12 min): bench-out/full.json
#   scripts/bench.sh --smoke         every system and workload returns correct data (CI)
#   scripts/bench.sh --callgrind     instructions per call of topspin's hot paths (valgrind)
#   scripts/bench.sh --syscalls      syscalls and writes per call of every system (strace)
#   scripts/bench.sh --quick --systems raw,topspin,tarpc   (any topspin-bench option passes on)
#
# Each peer is its own Cargo package, built by its own `cargo build -p` so that Cargo never
# unifies one peer's dependency features into another's. Output directory: BENCH_OUT (default
# bench-out/); target directory: CARGO_TARGET_DIR (default target/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
./scripts/setup.sh compilers fonts

mode=--quick
args=()
for a in "$@"; do
    case "$a" in
        --quick|--full|--smoke|--callgrind|--syscalls) mode="$a" ;;
        *) args+=("$a") ;;
    esac
done

# Only the peers this run uses: the quick and full runs' default systems, or those named with
# --systems; --smoke runs every system. (TLS, WebSocket and the gRPC rows run only when
# named, so a first run does not build them, nor needs Go.)
systems=""
prev=""
for a in "${args[@]}"; do
    case "$a" in
        --systems=*) systems="${a#--systems=}" ;;
        *) [ "$prev" = --systems ] && systems="$a" ;;
    esac
    prev="$a"
done
peer_package() {
    case "$1" in
        raw|raw-uds|raw-shm|topspin|topspin-uds|topspin-shm) echo topspin-bench ;;
        tonic) echo topspin-bench-tonic ;;
        tonic-tls) echo topspin-bench-tonic-tls ;;
        topspin-grpc|topspin-grpc-client) echo topspin-bench-topspin-grpc ;;
        # Go's rows: the Go peer (go build, below), and the Rust peer that calls its server.
        grpc-go) echo grpc-go ;;
        grpc-go-server) echo "topspin-bench-tonic grpc-go" ;;
        topspin-grpc-client-go) echo "topspin-bench-topspin-grpc grpc-go" ;;
        raw-tls|raw-ws|topspin-tls|topspin-ws) echo topspin-bench-layered ;;
        tarpc|capnp|thrift) echo "topspin-bench-$1" ;;
        *) echo "bench.sh: unknown system '$1' (topspin-bench --help lists them)" >&2; exit 2 ;;
    esac
}
packages=(topspin-bench)
if [ "$mode" = --smoke ]; then
    packages+=(topspin-bench-tonic topspin-bench-tarpc topspin-bench-capnp topspin-bench-thrift
               topspin-bench-layered topspin-bench-tonic-tls topspin-bench-topspin-grpc grpc-go)
elif [ "$mode" != --callgrind ]; then
    IFS=, read -r -a wanted <<< "${systems:-raw,topspin,tonic,tarpc,capnp,thrift}"
    for s in "${wanted[@]}"; do
        ps="$(peer_package "$s")"
        for p in $ps; do
            [[ " ${packages[*]} " == *" $p "* ]] || packages+=("$p")
        done
    done
fi
# Each peer is built by a cargo of its own (see above); cargo shows what it compiles.
i=0
for p in "${packages[@]}"; do
    i=$((i + 1))
    if [ "$p" = grpc-go ]; then
        # The grpc-go peer (crates/topspin-bench/peers/grpc-go, a Go module): Go from
        # scripts/setup-go.sh, grpc-go from the Go module proxy; the binary goes beside the
        # Rust peers, where they and the driver look for it.
        echo "== [$i/${#packages[@]}] building topspin-bench-grpc-go (go build) ==" >&2
        ./scripts/setup-go.sh --toolchain-only
        PATH="$PATH:/usr/local/go/bin" go build -C crates/topspin-bench/peers/grpc-go \
            -o "$(realpath -m "${CARGO_TARGET_DIR:-target}")/release/topspin-bench-grpc-go" .
        continue
    fi
    echo "== [$i/${#packages[@]}] building $p (release) ==" >&2
    if [ "$p" = topspin-bench ]; then
        # Its harness and the raw and topspin peers; not topspin-bench-endpoints (a separate
        # command, README "Other commands"), which no mode of this script runs.
        cargo build --release --locked -p "$p" \
            --bin topspin-bench --bin topspin-bench-raw --bin topspin-bench-topspin
    else
        cargo build --release --locked -p "$p"
    fi
done
bin="${CARGO_TARGET_DIR:-$root/target}/release"
out="${BENCH_OUT:-$root/bench-out}"
mkdir -p "$out"

case "$mode" in
    --smoke) exec "$bin/topspin-bench" --smoke "${args[@]}" ;;
    # Instruction counts without the connection's spin before sleeping (its yields would make
    # them vary run to run under valgrind's serialised threads); its cost shows as CPU per call
    # in the timed runs.
    --callgrind) TOPSPIN_SPIN=0 exec "$bin/topspin-bench" "$mode" "${args[@]}" ;;
    --syscalls) exec "$bin/topspin-bench" "$mode" "${args[@]}" ;;
    --full) name=full ;;
    *) name=quick ;;
esac
if [ "$name" = quick ] && [ -z "${BENCH_QUIET_ONLY:-}" ]; then
    # The main job: the quiet tables, then the same under a background load the benchmark
    # makes itself (one busy thread per CPU at normal priority): services share machines.
    # BENCH_QUIET_ONLY=1 skips the loaded half.
    "$bin/topspin-bench" "$mode" --json "$out/$name.json" --plots "$out" "${args[@]}"
    echo
    echo "== the same, loaded: one busy thread per CPU, started by the benchmark =="
    exec "$bin/topspin-bench" "$mode" --loaded --json "$out/$name-loaded.json" "${args[@]}"
fi
exec "$bin/topspin-bench" "$mode" --json "$out/$name.json" --plots "$out" "${args[@]}"
