#!/usr/bin/env bash
# Every test of every language, part by part; what CI runs (.ci/run). Every selected part runs
# even when an earlier one failed; a summary table (passed / FAILED / skipped, and how long
# each took) ends the output, and the exit status is non-zero when any part failed.
#
#   scripts/test.sh                 every part
#   scripts/test.sh rust python     only these parts (`rust` = every Rust part)
#   scripts/test.sh --help          the parts
#
# Each part installs what it needs first (scripts/setup*.sh: they list what they will install,
# and install nothing when it is there; system packages through apt, with sudo when not root).
# A part is skipped only for a reason it prints (e.g. netns without root, unless
# TOPSPIN_REQUIRE_NETNS=1, which .ci/run sets: then that is a failure).
#
# The Go, Python, TypeScript and grpc parts talk to the Rust peers (kvstore-server,
# kvstore-client, the topspin CLI): built here (debug) unless KVSTORE_SERVER, KVSTORE_CLIENT
# and TOPSPIN_CLI name prebuilt ones.
# shellcheck disable=SC2317 # (the part_* functions are called through run_part)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

rust_parts=(rustfmt clippy features packages cargo-test vectors bench-smoke fuzz-build)
all_parts=("${rust_parts[@]}" go python typescript matrix grpc grpcclient netns)
describe() {
  case "$1" in
    rustfmt) echo "cargo fmt --check of the workspace" ;;
    clippy) echo "cargo clippy of the workspace, all targets, warnings are errors (functions of the runtime ≤ 80 lines); no import circles in the runtime (scripts/no-circles.py)" ;;
    features) echo "the runtime builds with each of its features alone (the workspace build unifies them; the benchmark's peers do not)" ;;
    packages) echo "cargo package of every public crate: each builds from its packaged sources alone, as crates.io would get it" ;;
    cargo-test) echo "cargo test of the workspace (unit, integration, property, doc tests)" ;;
    vectors) echo "testdata/vectors are what their generator writes" ;;
    bench-smoke) echo "every benchmark system (the grpc-go peer's too) returns correct data (debug, shared and separate processes)" ;;
    fuzz-build) echo "the cargo-fuzz targets build (needs a nightly toolchain, else skipped)" ;;
    go) echo "scripts/test-go.sh: gofmt, vet, staticcheck, function and file lengths, go test -race (the README followed as written), fuzz, interop" ;;
    python) echo "scripts/test-python.sh: ruff, mypy, clippy, pytest (also with SIGINT ignored; grpcurl and the topspin CLI against a Python server with health and reflection), the wheel installed with pip in a fresh venv, bench smoke" ;;
    typescript) echo "scripts/test-typescript.sh: tsc, eslint, node --test, Chromium, npm pack installed into a fresh project, bench smoke" ;;
    matrix) echo "scripts/test-matrix.sh: every client × server × transport (Rust, Go, Node, Chromium, Python)" ;;
    grpc) echo "scripts/test-grpc.sh: grpcurl, grpcio, grpc-go and gRPC's interop client (17 cases) against the gRPC face; the README's terminal commands as written (grpcurl, topspin, the echo example)" ;;
    grpcclient) echo "scripts/test-grpcclient.sh: topspin's gRPC client against tonic and grpc-go" ;;
    netns) echo "scripts/test-netns.sh: balancing across network namespaces with faults (root)" ;;
    peers) echo "build the Rust peers of the other languages' tests (kvstore-server, kvstore-client, topspin CLI)" ;;
  esac
}
usage() {
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  echo
  echo "Parts, in the order they run:"
  local p
  for p in "${all_parts[@]}"; do printf '  %-12s %s\n' "$p" "$(describe "$p")"; done
  printf '  %-12s %s\n' rust "= ${rust_parts[*]}"
}

selected=()
for a in "$@"; do
  case "$a" in
    -h|--help) usage; exit 0 ;;
    rust) selected+=("${rust_parts[@]}") ;;
    all) selected+=("${all_parts[@]}") ;;
    *)
      if [[ " ${all_parts[*]} " != *" $a "* ]]; then
        echo "test.sh: no part '$a' (parts: ${all_parts[*]} rust; see --help)" >&2
        exit 2
      fi
      selected+=("$a") ;;
  esac
done
[ ${#selected[@]} -gt 0 ] || selected=("${all_parts[@]}")
# In the canonical order, each once.
parts=()
for p in "${all_parts[@]}"; do
  for s in "${selected[@]}"; do
    if [ "$s" = "$p" ]; then parts+=("$p"); break; fi
  done
done

target="${CARGO_TARGET_DIR:-$root/target}"

bin="$target/debug"

# The set-up each part runs first, one script (and its arguments) a line. The Rust parts run
# it from here; the other parts' scripts run theirs themselves (this says what they run, for
# the set-up check below).
setup_of() {
  case "$1" in
    rustfmt) echo "setup.sh rustfmt" ;;
    # The benchmark's peers compile Cap'n Proto and Thrift schemas in their build scripts.
    clippy) echo "setup.sh clippy compilers" ;;
    features|packages) echo "setup.sh compilers" ;;
    cargo-test) echo "setup.sh compilers" ;;
    # The grpc-go peer (crates/topspin-bench/peers/grpc-go) is a Go program.
    bench-smoke) echo "setup.sh compilers"; echo "setup-go.sh --toolchain-only" ;;
    fuzz-build) echo "setup.sh fuzz" ;;
    go) echo "setup-go.sh"; echo "setup-grpcurl.sh" ;;
    python) echo "setup.sh rustfmt clippy"; echo "setup-python.sh"; echo "setup-grpcurl.sh" ;;
    typescript) echo "setup-typescript.sh"; echo "setup-grpcurl.sh" ;;
    # After the python and typescript parts: it uses their venv and build (dist/).
    matrix) echo "setup-go.sh"; echo "setup-python.sh"; echo "setup-typescript.sh" ;;
    grpc) echo "setup-grpc.sh" ;;
    grpcclient) echo "setup-go.sh --toolchain-only" ;;
    netns) echo "setup-netns.sh" ;;
  esac
}
setup_part() {
  local s
  while read -r s; do
    # shellcheck disable=SC2086 # a script and its arguments
    [ -z "$s" ] || ./scripts/$s
  done < <(setup_of "$1")
}

part_rustfmt() {
  setup_part rustfmt
  cargo fmt --all -- --check
}
part_clippy() {
  setup_part clippy
  cargo clippy --workspace --all-targets --locked -- -D warnings
  # No two files of the runtime import each other.
  python3 scripts/no-circles.py
}
part_features() {
  setup_part features
  local f
  for f in "" prost tls websocket grpc metrics otel; do
    echo "cargo check -p topspin --no-default-features${f:+ --features $f}"
    RUSTFLAGS="${RUSTFLAGS:-} -D warnings" cargo check -q --locked -p topspin --no-default-features ${f:+--features "$f"}
  done
}
part_packages() {
  setup_part packages
  # The workspace's crates depend on each other by version: cargo packages them together
  # (through a local registry) and builds each from its tarball. `--allow-dirty`: a checkout
  # with uncommitted changes is tested as it is (CI's clean clone has none).
  # cargo extracts the packaged crates it verifies the others against into
  # $CARGO_HOME/registry/src/-<hash of this checkout's path>/ and never again once they are there:
  # an extraction left by an earlier run in the same path (an older topspin-proto) would be built
  # instead of this one. Nor does cargo rebuild a registry crate it built before (a registry's
  # crates never change): the verifying builds' artifacts of the workspace's crates in
  # $target/debug (where cargo verifies) would be linked instead of new ones. Both are removed
  # first (in a fresh clone's CI run neither exists, and the cargo-test part builds after this).
  local home="${CARGO_HOME:-$HOME/.cargo}" c
  for c in topspin-proto topspin topspin-build topspin-health topspin-reflection topspin-cli; do
    rm -rf "$home"/registry/src/-*/"$c"-[0-9]*
  done
  rm -rf "$target/package/tmp-registry" "$target"/debug/.fingerprint/topspin*-* \
    "$target"/debug/deps/*topspin* "$target"/debug/build/topspin*-*
  cargo package --locked --allow-dirty -p topspin-proto -p topspin -p topspin-build \
    -p topspin-health -p topspin-reflection -p topspin-cli
}
part_cargo_test() {
  setup_part cargo-test
  cargo test --workspace --locked
}
part_vectors() {
  [ -f testdata/vectors/gen.py ] || skip_part "no testdata/vectors/gen.py"
  python3 testdata/vectors/gen.py --check
}
part_bench_smoke() {
  setup_part bench-smoke
  # Debug builds are enough to check correctness and reuse what the tests compiled.
  cargo build --workspace --bins --locked -q
  # The grpc-go peer, beside the Rust peers (its modules from the Go module proxy); gofmt'ed
  # and vetted.
  go_path
  local unformatted
  unformatted="$(gofmt -l crates/topspin-bench/peers/grpc-go)"
  [ -z "$unformatted" ] || { echo "not gofmt'ed: $unformatted"; return 1; }
  go vet -C crates/topspin-bench/peers/grpc-go ./...
  go build -C crates/topspin-bench/peers/grpc-go -o "$(realpath -m "$bin")/topspin-bench-grpc-go" .
  "$bin/topspin-bench" --smoke
  # The same with each TCP / Unix-socket system's server in a process of its own.
  "$bin/topspin-bench" --smoke --separate-processes \
    --systems raw,raw-uds,topspin,topspin-uds,tonic,tarpc,capnp,thrift,grpc-go
}
part_fuzz_build() {
  if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    skip_part "no nightly Rust toolchain (cargo fuzz needs one: rustup toolchain install nightly)"
  fi
  setup_part fuzz-build
  ./scripts/fuzz.sh --build-only
}
part_peers() {
  cargo build -q --locked -p kvstore --bins -p topspin-cli
}
part_go() { ./scripts/test-go.sh; }
part_python() { ./scripts/test-python.sh; }
part_typescript() { ./scripts/test-typescript.sh; }
part_matrix() {
  setup_part matrix
  ./scripts/test-matrix.sh
}
part_grpc() { ./scripts/test-grpc.sh; }
part_grpcclient() { ./scripts/test-grpcclient.sh; }
part_netns() { ./scripts/test-netns.sh; }

runs=$(mktemp -d)
trap 'rm -rf "$runs"; lib_cleanup' EXIT
interrupted=""
trap 'interrupted=1' INT
names=() results=() times=() notes=()

# run_part NAME: runs part_NAME in a subshell with `set -euo pipefail` (not in a condition, so
# that errexit holds inside), records its result and duration.
run_part() {
  local name=$1 rc start note=""
  printf '\n======== %s: %s\n' "$name" "$(describe "$name")"
  start=$SECONDS
  export TOPSPIN_SKIP_FILE="$runs/$name.skip"
  set +e
  (set -euo pipefail; "part_${name//-/_}")
  rc=$?
  set -e
  unset TOPSPIN_SKIP_FILE
  case "$rc" in
    0) result=passed ;;
    77) result=skipped; note=$(cat "$runs/$name.skip" 2>/dev/null || echo "no reason given") ;;
    *) result=FAILED; note="exit status $rc" ;;
  esac
  if [ -n "$interrupted" ]; then result=FAILED; note="interrupted"; fi
  names+=("$name") results+=("$result") times+=($((SECONDS - start))) notes+=("$note")
  printf -- '-------- %s: %s (%ss)%s\n' "$name" "$result" "$((SECONDS - start))" "${note:+: $note}"
}
record_skip() {
  names+=("$1") results+=(skipped) times+=(0) notes+=("$2")
  printf '\n======== %s: skipped: %s\n' "$1" "$2"
}
fmt_time() { if [ "$1" -ge 60 ]; then printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); else printf '%ds' "$1"; fi; }
summary() {
  local i failed=0 passed=0 skipped=0
  printf '\n======== summary\n'
  printf '%-12s %-8s %8s  %s\n' part result time note
  for i in "${!names[@]}"; do
    printf '%-12s %-8s %8s  %s\n' "${names[$i]}" "${results[$i]}" "$(fmt_time "${times[$i]}")" "${notes[$i]}"
    case "${results[$i]}" in passed) passed=$((passed + 1)) ;; skipped) skipped=$((skipped + 1)) ;; *) failed=$((failed + 1)) ;; esac
  done
  printf '%d passed, %d failed, %d skipped in %s\n' "$passed" "$failed" "$skipped" "$(fmt_time "$SECONDS")"
  [ "$failed" -eq 0 ]
}

# The Rust peers of the other languages' tests, once, before the first part that needs them.
peers=""
ensure_peers() {
  [ -z "$peers" ] || return 0
  if [ -n "${KVSTORE_SERVER:-}" ] && [ -n "${KVSTORE_CLIENT:-}" ] && [ -n "${TOPSPIN_CLI:-}" ]; then
    peers=given
    echo "Rust peers (given): $KVSTORE_SERVER $KVSTORE_CLIENT $TOPSPIN_CLI"
  else
    run_part peers
    peers=${results[${#results[@]}-1]}
    export KVSTORE_SERVER="${KVSTORE_SERVER:-$bin/kvstore-server}"
    export KVSTORE_CLIENT="${KVSTORE_CLIENT:-$bin/kvstore-client}"
    export TOPSPIN_CLI="${TOPSPIN_CLI:-$bin/topspin}"
  fi
}

# Every selected part's set-up, checked before any part installs anything: each set-up
# script, in dry-run mode, checks the tool versions and says what it will install. A part whose
# check fails is not run (it counts as failed); the others are.
printf '\n======== set-up check (what the parts will install; nothing is installed yet)\n'
declare -A checked=()
setup_failed=" "
for p in "${parts[@]}"; do
  [ -z "$interrupted" ] || break
  while read -r s; do
    [ -n "$s" ] || continue
    if [ -z "${checked[$s]:-}" ]; then
      # shellcheck disable=SC2086 # a script and its arguments
      if TOPSPIN_SETUP_DRY_RUN=1 ./scripts/$s; then checked[$s]=ok; else checked[$s]=failed; fi
    fi
    [ "${checked[$s]}" = ok ] || setup_failed+="$p "
  done < <(setup_of "$p")
done

for p in "${parts[@]}"; do
  [ -z "$interrupted" ] || break
  if [[ "$setup_failed" == *" $p "* ]]; then
    names+=("$p") results+=(FAILED) times+=(0) notes+=("its set-up check failed (see the set-up check)")
    printf '\n======== %s: FAILED: its set-up check failed (see above)\n' "$p"
    continue
  fi
  case "$p" in
    go|python|typescript|grpc)
      ensure_peers
      if [ "$peers" = FAILED ]; then record_skip "$p" "the Rust peers did not build"; continue; fi ;;
  esac
  [ -z "$interrupted" ] || break
  run_part "$p"
done

if summary; then exit 0; fi
[ -n "$interrupted" ] && exit 130
exit 1
