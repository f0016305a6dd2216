#!/usr/bin/env bash
# The cross-language matrix (testdata/matrix/README.md): every client against every server, over
# every transport both have. Prints a table (rows: clients; columns: server × transport; a cell
# is `ok`, `FAIL(check,…)`, `skip(check,…)` when the client could not express some checks, `-`
# when the pair has no such transport, `missing` / `skip` when a program is missing / did not
# start), then every failing cell's FAIL lines with the pair and the transport. Exit status 1
# when any cell failed, a selected program is missing, or a server did not stop cleanly.
#
#   scripts/test-matrix.sh                                 everything
#   scripts/test-matrix.sh --clients rust,go --servers rust --transports tcp
#   scripts/test-matrix.sh --allow-missing                 missing programs are skipped, not failures
#
# Clients: rust go node chromium python-sync python-asyncio (`python`: both Python modes).
# Servers: rust go node python. Transports: tcp unix ws tls wss.
#
# TLS: at start the runner makes a throw-away CA and a server certificate for 127.0.0.1 and
# localhost (openssl, in a temporary directory removed at the end; without openssl the tls and
# wss columns are left out, saying so). A server listening on tls:// or wss:// gets
# `--tls-cert FILE --tls-key FILE`; a client in a tls or wss cell gets `--ca FILE`.
#
# The programs, at these paths (the runner says which is missing):
#   rust    $MATRIX_RUST_BIN/matrix-{server,client}, else built here (cargo build -p matrix)
#           into ${CARGO_TARGET_DIR:-target}/debug
#   go      target/matrix/go-matrix-{server,client}, built here from go/tools/cmd/matrix-{server,client}
#   node    node bindings/typescript/dist/matrix/{server,client}.js (npm run build when missing)
#   chromium node bindings/typescript/dist/matrix/browser.js (the TS client in Chromium; ws only)
#   python  bindings/python/.venv/bin/python bindings/python/matrix/{server,client}.py
#           (client: --mode sync|asyncio; the venv comes from scripts/setup-python.sh;
#           MATRIX_PYTHON names another interpreter, e.g. another checkout's venv)
#
# What each side has: rust and python tcp unix ws tls wss; go tcp unix tls; node servers tcp unix
# ws, node clients tcp unix ws wss (the Node runtime has no tls://, its server no TLS); chromium
# ws (the browser would have to trust the throw-away CA for wss). A server that cannot listen on
# ws or wss is started again without them. MATRIX_TRANSPORTS_<NAME> changes that, e.g.
# MATRIX_TRANSPORTS_PYTHON_SYNC="tcp unix".
#
# Each cell has a hard timeout of MATRIX_CELL_TIMEOUT seconds (90); a server has
# MATRIX_START_TIMEOUT seconds (30) to print its `listening` lines. Servers get SIGTERM at the
# end (and must be gone within 2 s, exit status 0). Logs of every cell and server: target/matrix/logs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

all_clients=(rust go node chromium python-sync python-asyncio)
all_servers=(rust go node python)
all_transports=(tcp unix ws tls wss)
checks=(unary large server-stream quiet-stream client-stream bidi-open-then-send deadline cancel error-details compression trace)

# The transports each side has (MATRIX_TRANSPORTS_<NAME>, e.g. MATRIX_TRANSPORTS_PYTHON_SYNC="tcp unix", overrides).
declare -A server_has=([rust]="tcp unix ws tls wss" [go]="tcp unix tls" [node]="tcp unix ws"
  [python]="tcp unix ws tls wss")
declare -A client_has=([rust]="tcp unix ws tls wss" [go]="tcp unix tls" [node]="tcp unix ws wss"
  [chromium]="ws" [python-sync]="tcp unix ws tls wss" [python-asyncio]="tcp unix ws tls wss")
override_transports() {
  local -n table=$1
  local k var
  for k in "${!table[@]}"; do
    var="MATRIX_TRANSPORTS_${k^^}"
    var=${var//-/_}
    if [ -n "${!var:-}" ]; then table[$k]=${!var}; fi
  done
}
override_transports server_has
override_transports client_has

usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }

# split LIST ALLOWED...: LIST's comma-separated names, each checked against ALLOWED.
split_list() {
  local list=$1 what=$2 x names
  shift 2
  names=" $* "
  local IFS=,
  for x in $list; do
    [ -n "$x" ] || continue
    if [ "$what" = client ] && [ "$x" = python ]; then printf '%s\n' python-sync python-asyncio; continue; fi
    if [[ "$names" != *" $x "* ]]; then
      echo "test-matrix.sh: no $what '$x' (have: $(printf '%s ' "$@"))" >&2
      exit 2
    fi
    echo "$x"
  done
}

clients=("${all_clients[@]}") servers=("${all_servers[@]}") transports=("${all_transports[@]}")
allow_missing=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --clients|--servers|--transports)
      [ $# -ge 2 ] || { echo "test-matrix.sh: $1 needs a comma-separated list" >&2; exit 2; }
      case "$1" in
        --clients) names=$(split_list "$2" client "${all_clients[@]}") || exit 2; mapfile -t clients <<< "$names" ;;
        --servers) names=$(split_list "$2" server "${all_servers[@]}") || exit 2; mapfile -t servers <<< "$names" ;;
        --transports) names=$(split_list "$2" transport "${all_transports[@]}") || exit 2; mapfile -t transports <<< "$names" ;;
      esac
      shift 2 ;;
    --clients=*|--servers=*|--transports=*)
      set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
    --allow-missing) allow_missing=1; shift ;;
    *) echo "test-matrix.sh: unexpected argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in clients servers transports; do
  declare -n list=$v
  if [ ${#list[@]} -eq 0 ] || [ -z "${list[0]}" ]; then echo "test-matrix.sh: no $v selected" >&2; exit 2; fi
  unset -n list
done
cell_timeout=${MATRIX_CELL_TIMEOUT:-90}
start_timeout=${MATRIX_START_TIMEOUT:-30}

out="$root/target/matrix"
logs="$out/logs"
mkdir -p "$logs"
rm -f "$logs"/*.log
tmp=$(mktemp -d "${TMPDIR:-/tmp}/matrix.XXXXXX")


selected() { # selected NAME LIST...
  local n=$1
  shift
  [[ " $* " == *" $n "* ]]
}
uses() { # uses LANG: a client or server of this language is selected
  local c
  case "$1" in
    node) selected node "${servers[@]}" || selected node "${clients[@]}" || selected chromium "${clients[@]}" ;;
    python)
      selected python "${servers[@]}" && return 0
      for c in "${clients[@]}"; do [[ "$c" != python-* ]] || return 0; done
      return 1 ;;
    *) selected "$1" "${servers[@]}" || selected "$1" "${clients[@]}" ;;
  esac
}

step() { printf '\n== matrix: %s\n' "$*"; }

# TLS: a throw-away CA and a server certificate (127.0.0.1, localhost), when tls or wss is selected.
# openssl, not a generator of our own: on Debian it comes with ca-certificates (which depends on
# it, and which the set-up scripts' https downloads need), so it is on every machine these
# scripts run on, while rcgen (a Rust dev-dependency) would need a program of its own built first
# and Go's crypto/x509 the Go tool, which a run without Go need not have.
tls_dir="$tmp/tls"
tls_note=""
make_certificates() {
  mkdir -p "$tls_dir"
  local d=$tls_dir
  {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
      -subj /CN=topspin-matrix-ca -addext basicConstraints=critical,CA:TRUE \
      -addext keyUsage=critical,keyCertSign,cRLSign -keyout "$d/ca.key" -out "$d/ca.pem" &&
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost \
      -keyout "$d/server.key" -out "$d/server.csr" &&
    printf '%s\n' basicConstraints=critical,CA:FALSE keyUsage=critical,digitalSignature \
      extendedKeyUsage=serverAuth subjectAltName=IP:127.0.0.1,DNS:localhost > "$d/server.ext" &&
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
      -days 2 -extfile "$d/server.ext" -out "$d/server.pem"
  } > "$logs/certificates.log" 2>&1
}
if selected tls "${transports[@]}" || selected wss "${transports[@]}"; then
  if ! command -v openssl > /dev/null; then
    tls_note="no openssl on PATH: the tls and wss columns are left out"
  elif ! make_certificates; then
    tls_note="openssl could not make the certificates ($logs/certificates.log): the tls and wss columns are left out"
  fi
  if [ -n "$tls_note" ]; then
    echo "matrix: $tls_note" >&2
    kept=()
    for t in "${transports[@]}"; do [ "$t" = tls ] || [ "$t" = wss ] || kept+=("$t"); done
    transports=("${kept[@]}")
    [ ${#transports[@]} -gt 0 ] || { echo "test-matrix.sh: no transport left" >&2; rm -rf "$tmp"; exit 2; }
  fi
fi

# Why a language's programs are unusable ("" when they are): missing files, a failed build.
declare -A unusable=() missing_lang=()
mark_missing() {
  unusable[$1]="${unusable[$1]:+${unusable[$1]}; }missing: $2"
  missing_lang[$1]=1
  echo "MISSING ($1): $2"
}
mark_broken() {
  unusable[$1]="${unusable[$1]:+${unusable[$1]}; }$2"
  echo "BROKEN ($1): $2"
}

rust_bin=""
if uses rust; then
  if [ -n "${MATRIX_RUST_BIN:-}" ]; then
    rust_bin=$MATRIX_RUST_BIN
    step "rust: given $rust_bin"
  else
    step "rust: cargo build -p matrix"
    rust_bin="${CARGO_TARGET_DIR:-$root/target}/debug"
    cargo build -q --locked -p matrix || mark_broken rust "cargo build -p matrix failed"
  fi
  for f in matrix-server matrix-client; do
    [ -x "$rust_bin/$f" ] || [ -n "${unusable[rust]:-}" ] || mark_missing rust "$rust_bin/$f"
  done
fi

go_server="$out/go-matrix-server" go_client="$out/go-matrix-client"
if uses go; then
  if [ ! -d go/tools/cmd/matrix-server ] || [ ! -d go/tools/cmd/matrix-client ]; then
    mark_missing go "go/tools/cmd/matrix-server and go/tools/cmd/matrix-client (the Go sources)"
  else
    step "go: go build ./cmd/matrix-server ./cmd/matrix-client (in go/tools)"
    go_path
    if ! have go; then
      mark_broken go "no go on PATH (scripts/setup-go.sh installs it)"
    elif ! (cd go/tools && go build -o "$go_server" ./cmd/matrix-server && go build -o "$go_client" ./cmd/matrix-client); then
      mark_broken go "go build failed"
    fi
  fi
fi

ts=bindings/typescript
if uses node; then
  # Built when missing or older than a source (a stale build would test old code).
  stale=
  if [ -f "$ts/dist/matrix/server.js" ] && [ -n "$(find "$ts/src" "$ts/matrix" -newer "$ts/dist/matrix/server.js" -name '*.ts' -print -quit 2>/dev/null)" ]; then
    stale=1
  fi
  if [ -n "$stale" ] || [ ! -f "$ts/dist/matrix/server.js" ] || [ ! -f "$ts/dist/matrix/client.js" ]; then
    if [ ! -d "$ts/matrix" ]; then
      mark_missing node "$ts/dist/matrix/{server,client}.js and their sources $ts/matrix/"
    elif [ ! -d "$ts/node_modules" ]; then
      mark_broken node "$ts/node_modules is missing: run scripts/setup-typescript.sh"
    else
      step "node: npm run build (dist/matrix missing or older than its sources)"
      (cd "$ts" && npm run build --silent) || mark_broken node "npm run build failed"
    fi
  fi
  if [ -z "${unusable[node]:-}" ]; then
    for f in server.js client.js; do
      [ -f "$ts/dist/matrix/$f" ] || mark_missing node "$ts/dist/matrix/$f"
    done
    if selected chromium "${clients[@]}" && [ ! -f "$ts/dist/matrix/browser.js" ]; then
      mark_missing chromium "$ts/dist/matrix/browser.js"
    fi
  fi
  if ! have node; then mark_broken node "no node on PATH (scripts/setup-typescript.sh installs it)"; fi
fi

py=${MATRIX_PYTHON:-bindings/python/.venv/bin/python}
if uses python; then
  if [ ! -x "$py" ]; then
    mark_broken python "$py is missing: run scripts/setup-python.sh"
  fi
  for f in server.py client.py; do
    [ -f "bindings/python/matrix/$f" ] || mark_missing python "bindings/python/matrix/$f"
  done
fi

# The language whose programs a client or server is.
lang_of() { case "$1" in chromium) echo node ;; python-*) echo python ;; *) echo "$1" ;; esac; }
why_unusable() { # the reason side $1 (client or server name) cannot run, or ""
  local l
  l=$(lang_of "$1")
  if [ "$1" = chromium ] && [ -n "${unusable[chromium]:-}" ]; then echo "${unusable[chromium]}"; return; fi
  echo "${unusable[$l]:-}"
}
is_missing() {
  local l
  l=$(lang_of "$1")
  [ -n "${missing_lang[$l]:-}" ] || { [ "$1" = chromium ] && [ -n "${missing_lang[chromium]:-}" ]; }
}

server_cmd() { # server_cmd NAME: sets cmd=(...)
  case "$1" in
    rust) cmd=("$rust_bin/matrix-server") ;;
    go) cmd=("$go_server") ;;
    node) cmd=(node "$ts/dist/matrix/server.js") ;;
    python) cmd=("$py" bindings/python/matrix/server.py) ;;
  esac
}
client_cmd() { # client_cmd NAME: sets cmd=(...)
  case "$1" in
    rust) cmd=("$rust_bin/matrix-client") ;;
    go) cmd=("$go_client") ;;
    node) cmd=(node "$ts/dist/matrix/client.js") ;;
    chromium) cmd=(node "$ts/dist/matrix/browser.js") ;;
    python-sync) cmd=("$py" bindings/python/matrix/client.py --mode sync) ;;
    python-asyncio) cmd=("$py" bindings/python/matrix/client.py --mode asyncio) ;;
  esac
}

# Servers: started once each, stopped (SIGTERM) at the end.
declare -A server_pid=() addr=() server_note=()
stop_failed=""
stop_servers() {
  local s pid i rc
  for s in "${!server_pid[@]}"; do
    pid=${server_pid[$s]}
    kill -TERM "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; continue; }
    # The contract: gone within 2 s of SIGTERM, exit status 0.
    for i in $(seq 1 25); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
      if [ "$i" -eq 25 ]; then
        echo "FAIL server $s: still running 2.5 s after SIGTERM (killed)" >&2
        stop_failed+=" $s"
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
      fi
    done
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    if [ "$rc" -ne 0 ] && [[ "$stop_failed" != *" $s"* ]]; then
      echo "FAIL server $s: exit status $rc after SIGTERM (0 expected; log: $logs/server-$s.err.log)" >&2
      stop_failed+=" $s"
    fi
    unset "server_pid[$s]"
  done
}
# shellcheck disable=SC2317 # (called by the EXIT trap)
cleanup() {
  stop_servers
  rm -rf "$tmp"
  lib_cleanup
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# kill_server PID: a server that did not start as it should, with its process group.
kill_server() {
  kill -KILL -- "-$1" 2>/dev/null || kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# start_server NAME TRANSPORT...: starts it listening on those transports and reads its
# `listening` lines into addr[NAME:transport]. Returns 1 (with server_note set) if it fails.
start_server() {
  local s=$1 t pid n want i line a
  shift
  for t in "${all_transports[@]}"; do unset "addr[$s:$t]"; done
  local args=()
  for t in "$@"; do
    case "$t" in
      tcp) args+=(--listen tcp://127.0.0.1:0) ;;
      unix) args+=(--listen "unix://$tmp/$s.sock") ;;
      ws) args+=(--listen ws://127.0.0.1:0/) ;;
      tls) args+=(--listen tls://127.0.0.1:0) ;;
      wss) args+=(--listen wss://127.0.0.1:0/) ;;
    esac
  done
  if selected tls "$@" || selected wss "$@"; then
    args=(--tls-cert "$tls_dir/server.pem" --tls-key "$tls_dir/server.key" "${args[@]}")
  fi
  local cmd
  server_cmd "$s"
  local so="$logs/server-$s.out.log" se="$logs/server-$s.err.log"
  echo "\$ ${cmd[*]} ${args[*]}" > "$se"
  : > "$so"
  # A process group of its own: if it must be killed, so are its children.
  setsid "${cmd[@]}" "${args[@]}" > "$so" 2>> "$se" &
  pid=$!
  want=$#
  for ((i = 0; i < start_timeout * 10; i++)); do
    n=$(grep -c '^listening ' "$so" 2>/dev/null || true)
    n=${n:-0}
    [ "$n" -lt "$want" ] || break
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid" 2>/dev/null || true
      server_note[$s]="exited before listening on $*: $(tail -n 3 "$se" | tr '\n' ' ')"
      return 1
    fi
    sleep 0.1
  done
  if [ "$n" -lt "$want" ]; then
    kill_server "$pid"
    server_note[$s]="printed $n of $want listening lines within ${start_timeout}s"
    return 1
  fi
  while read -r line; do
    a=${line#listening }
    case "$a" in
      tcp://*) addr[$s:tcp]=$a ;;
      unix:*) addr[$s:unix]=$a ;;
      ws://*) addr[$s:ws]=$a ;;
      tls://*) addr[$s:tls]=$a ;;
      wss://*) addr[$s:wss]=$a ;;
      *) echo "matrix: server $s printed an address of no known transport: $line" >&2 ;;
    esac
  done < <(grep '^listening ' "$so")
  for t in "$@"; do
    if [ -z "${addr[$s:$t]:-}" ]; then
      kill_server "$pid"
      server_note[$s]="no $t address among its listening lines"
      return 1
    fi
  done
  server_pid[$s]=$pid
  echo "server $s (pid $pid): $(grep '^listening ' "$so" | sed 's/^listening //' | tr '\n' ' ')"
}

step "servers"
for s in "${servers[@]}"; do
  why=$(why_unusable "$s")
  if [ -n "$why" ]; then server_note[$s]=$why; continue; fi
  want=()
  for t in "${transports[@]}"; do selected "$t" "${server_has[$s]}" && want+=("$t"); done
  [ ${#want[@]} -gt 0 ] || { server_note[$s]="no selected transport"; continue; }
  if ! start_server "$s" "${want[@]}"; then
    if selected ws "${want[@]}" || selected wss "${want[@]}"; then
      # ws and wss are tried where they may not be supported (Python): again without them.
      echo "server $s: ${server_note[$s]}; trying again without ws and wss" >&2
      first_note=${server_note[$s]}
      cp "$logs/server-$s.err.log" "$logs/server-$s.ws-attempt.err.log" 2>/dev/null || true
      unset "server_note[$s]"
      without=()
      for t in "${want[@]}"; do [ "$t" = ws ] || [ "$t" = wss ] || without+=("$t"); done
      if [ ${#without[@]} -eq 0 ] || ! start_server "$s" "${without[@]}"; then
        server_note[$s]=${server_note[$s]:-$first_note}
        echo "FAIL server $s: ${server_note[$s]}" >&2
        continue
      fi
      server_note[$s]="no ws/wss: $first_note"
      echo "server $s: listening without ws and wss (${server_note[$s]})" >&2
    else
      echo "FAIL server $s: ${server_note[$s]}" >&2
    fi
  fi
done

# One cell: client C against server S over transport T. Sets cell (what the table shows) and
# appends the cell's FAIL/skip lines to the reports.
failed_cells=0
fail_report="" skip_report=""
run_cell() {
  local c=$1 s=$2 t=$3 a=${addr[$2:$3]} log="$logs/$1--$2--$3.log" rc=0 cmd
  client_cmd "$c"
  # A TLS cell's client trusts the throw-away CA.
  case "$t" in tls|wss) cmd+=(--ca "$tls_dir/ca.pem") ;; esac
  echo "\$ ${cmd[*]} --target $a" > "$log"
  timeout -k 5 "$cell_timeout" "${cmd[@]}" --target "$a" >> "$log" 2>&1 < /dev/null || rc=$?
  local fails=() skips=() missing=() name line
  for name in "${checks[@]}"; do
    if grep -qx "ok $name" "$log"; then continue; fi
    if grep -q "^FAIL $name:" "$log"; then fails+=("$name")
    elif grep -q "^skip $name:" "$log"; then skips+=("$name")
    else missing+=("$name"); fi
  done
  local why=()
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then why+=("timeout ${cell_timeout}s"); fi
  why+=("${fails[@]}")
  if [ ${#missing[@]} -gt 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ]; then
    why+=("no line: ${missing[*]}")
  fi
  if [ ${#why[@]} -eq 0 ] && [ "$rc" -ne 0 ]; then why+=("exit $rc"); fi
  if [ ${#why[@]} -eq 0 ] && [ ${#fails[@]} -eq 0 ] && [ "$rc" -eq 0 ] && grep -q '^FAIL ' "$log"; then
    why+=("unknown FAIL")
  fi
  # The table stays readable: at most two reasons in a cell (all of them in the report).
  if [ ${#fails[@]} -eq ${#checks[@]} ]; then why=(all)
  elif [ ${#why[@]} -gt 2 ]; then why=("${why[0]}" "${why[1]}" "+$((${#why[@]} - 2))"); fi
  local IFS=,
  if [ ${#why[@]} -gt 0 ]; then
    cell="FAIL(${why[*]})"
    failed_cells=$((failed_cells + 1))
    fail_report+="--- $c client → $s server over $t ($a): exit $rc, log $log"$'\n'
    while read -r line; do fail_report+="    $line"$'\n'; done < <(grep -E '^(FAIL|skip) ' "$log" || true)
    if [ ${#missing[@]} -gt 0 ] || ! grep -q '^FAIL ' "$log"; then
      fail_report+="    (last lines of its output:)"$'\n'
      while read -r line; do fail_report+="    | $line"$'\n'; done < <(tail -n 5 "$log")
    fi
  elif [ ${#skips[@]} -gt 0 ]; then
    cell="skip(${skips[*]})"
    while read -r line; do skip_report+="    $c → $s over $t: $line"$'\n'; done < <(grep '^skip ' "$log")
  else
    cell=ok
  fi
}

# The columns: every selected server × transport it has.
cols=()
for s in "${servers[@]}"; do
  for t in "${transports[@]}"; do
    selected "$t" "${server_has[$s]}" && cols+=("$s:$t")
  done
done
[ ${#cols[@]} -gt 0 ] || { echo "test-matrix.sh: no server has a selected transport" >&2; exit 2; }

declare -A table=()
missing_cells=0 skipped_cells=0
step "cells (a hard timeout of ${cell_timeout}s each)"
for c in "${clients[@]}"; do
  cwhy=$(why_unusable "$c")
  for col in "${cols[@]}"; do
    s=${col%%:*} t=${col#*:}
    if ! selected "$t" "${client_has[$c]}"; then table[$c/$col]="-"; continue; fi
    if [ -n "$cwhy" ]; then
      if is_missing "$c"; then table[$c/$col]=missing; missing_cells=$((missing_cells + 1))
      else table[$c/$col]="FAIL($cwhy)"; failed_cells=$((failed_cells + 1)); fi
      continue
    fi
    if [ -z "${addr[$s:$t]:-}" ] || [ -z "${server_pid[$s]:-}" ]; then
      if is_missing "$s"; then table[$c/$col]=missing; missing_cells=$((missing_cells + 1))
      elif [ -n "${server_note[$s]:-}" ] && [ -z "${server_pid[$s]:-}" ]; then
        table[$c/$col]="FAIL(server)"; failed_cells=$((failed_cells + 1))
      else table[$c/$col]=skip; skipped_cells=$((skipped_cells + 1)); fi
      continue
    fi
    if ! kill -0 "${server_pid[$s]}" 2>/dev/null; then
      table[$c/$col]="FAIL(server died)"; failed_cells=$((failed_cells + 1))
      if [ -z "${server_note[$s]:-}" ]; then
        server_note[$s]="died during the run (before $c → $s over $t); log: $logs/server-$s.err.log"
        fail_report+="--- $s server died before the cell $c → $s over $t: $(tail -n 2 "$logs/server-$s.err.log" | tr '\n' ' ')"$'\n'
      fi
      continue
    fi
    run_cell "$c" "$s" "$t"
    table[$c/$col]=$cell
    printf '%-15s → %-7s %-5s %s\n' "$c" "$s" "$t" "$cell"
  done
done

# The servers stop now, so that a failure to stop is in the summary.
stop_servers

# The table: column widths from the headers and the cells.
printf '\n== matrix: clients (rows) × servers:transport (columns)\n'
w0=14
for c in "${clients[@]}"; do [ ${#c} -le "$w0" ] || w0=${#c}; done
declare -A width=()
for col in "${cols[@]}"; do
  w=${#col}
  for c in "${clients[@]}"; do v=${table[$c/$col]}; [ ${#v} -le "$w" ] || w=${#v}; done
  width[$col]=$w
done
printf '%-*s' "$w0" "client"
for col in "${cols[@]}"; do printf '  %-*s' "${width[$col]}" "$col"; done
printf '\n'
for c in "${clients[@]}"; do
  printf '%-*s' "$w0" "$c"
  for col in "${cols[@]}"; do printf '  %-*s' "${width[$col]}" "${table[$c/$col]}"; done
  printf '\n'
done

status=0
if [ -n "$fail_report" ]; then
  printf '\n== matrix: failing cells\n%s' "$fail_report"
fi
if [ -n "$skip_report" ]; then
  printf '\n== matrix: checks the clients skipped\n%s' "$skip_report"
fi
for s in "${servers[@]}"; do
  if [ -n "${server_note[$s]:-}" ]; then echo "server $s: ${server_note[$s]}"; fi
done
for l in "${!unusable[@]}"; do echo "$l: ${unusable[$l]}"; done
if [ -n "$tls_note" ]; then echo "tls: $tls_note"; fi
printf '\n%d failed cells, %d missing, %d skipped; logs in %s\n' "$failed_cells" "$missing_cells" "$skipped_cells" "$logs"
[ "$failed_cells" -eq 0 ] || status=1
if [ "$missing_cells" -gt 0 ] || [ ${#missing_lang[@]} -gt 0 ]; then
  if [ -n "$allow_missing" ]; then
    echo "missing programs: ${!missing_lang[*]} (allowed by --allow-missing)"
  else
    echo "FAIL: missing programs: ${!missing_lang[*]} (--allow-missing to run without them)"
    status=1
  fi
fi
if [ -n "$stop_failed" ]; then
  echo "FAIL: servers that did not stop cleanly on SIGTERM:$stop_failed"
  status=1
fi
exit "$status"
