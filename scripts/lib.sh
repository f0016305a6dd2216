# shellcheck shell=bash disable=SC2034 # (variables set for the scripts that source this)
# Helpers shared by the set-up and test scripts; sourced (`. scripts/lib.sh`), never run.
#
#   have CMD                 is CMD on PATH?
#   as_root CMD...           CMD as root: directly when root, else through sudo (an error
#                            saying what to run when there is no sudo)
#   plan WHAT...             adds WHAT to the list of things this script will install
#   plan_show NAME           prints that list ("NAME: will install: ...") or nothing; returns
#                            1 when the list is empty (nothing to do). With
#                            TOPSPIN_SETUP_DRY_RUN=1 it ends the script there: the set-up
#                            scripts then only say what they would install.
#   apt_install PKG...       installs Debian packages; `apt-get update` at most once per run
#   apt_candidate_version P  the version apt would install of P ("" when none)
#   version_ge A B           A >= B, for dotted versions (1.26.0 >= 1.21)
#   need_version WHAT HAVE MIN HOW   fails with an actionable message unless HAVE >= MIN
#   skip_part REASON         ends a test part as skipped (exit 77), REASON in the summary
#
# "One run" is one top-level command and everything it starts: the first script that sources
# this file exports TOPSPIN_RUN_ID, and the stamp of `apt-get update` is kept per run id.

have() { command -v "$1" >/dev/null 2>&1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif have sudo; then
    sudo "$@"
  else
    echo "error: this needs root and sudo is not installed; run as root: $*" >&2
    return 1
  fi
}

if [ -z "${TOPSPIN_RUN_ID:-}" ]; then
  TOPSPIN_RUN_ID="$$"
  export TOPSPIN_RUN_ID
  topspin_run_owner=1
fi
topspin_apt_stamp="${TMPDIR:-/tmp}/topspin-apt-updated.$TOPSPIN_RUN_ID"
# The run's first script removes the stamp when it ends (scripts that set their own EXIT trap
# call lib_cleanup from it).
lib_cleanup() {
  if [ -n "${topspin_run_owner:-}" ]; then rm -f "$topspin_apt_stamp"; fi
}
trap lib_cleanup EXIT

apt_update_once() {
  [ -e "$topspin_apt_stamp" ] && return 0
  as_root apt-get update -qq
  : > "$topspin_apt_stamp"
}

apt_candidate_version() {
  local v
  have apt-cache || return 0
  v=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')
  if [ -z "$v" ] || [ "$v" = "(none)" ]; then
    # Empty or stale package lists: read them once, then ask again.
    apt_update_once >&2 || return 0
    v=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')
  fi
  [ "$v" = "(none)" ] && v=""
  # 2:1.19~1 -> 1.19; 20.19.2+dfsg-1 -> 20.19.2
  v=${v#*:}
  v=${v%%[~+-]*}
  echo "$v"
}

apt_install() {
  [ $# -gt 0 ] || return 0
  if ! have apt-get; then
    echo "error: please install these packages with your package manager: $*" >&2
    return 1
  fi
  # Lists read earlier in this run (or recently enough) usually do; update once if not.
  if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
    apt_update_once
  fi
  if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; then
    [ -e "$topspin_apt_stamp" ] && return 1
    apt_update_once
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
  fi
}

topspin_plan=()
plan() { topspin_plan+=("$*"); }
plan_show() {
  local p
  if [ ${#topspin_plan[@]} -gt 0 ]; then
    echo "$1: will install:"
    for p in "${topspin_plan[@]}"; do echo "  - $p"; done
  elif [ -n "${TOPSPIN_SETUP_DRY_RUN:-}" ]; then
    echo "$1: nothing to install"
  fi
  [ -z "${TOPSPIN_SETUP_DRY_RUN:-}" ] || exit 0
  [ ${#topspin_plan[@]} -gt 0 ]
}

version_ge() {
  [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$2" ]
}

need_version() {
  local what=$1 have_v=$2 min=$3 how=$4
  if [ -z "$have_v" ] || ! version_ge "$have_v" "$min"; then
    echo "error: $what >= $min is needed (found: ${have_v:-none}). $how" >&2
    return 1
  fi
}

skip_part() {
  echo "SKIPPED: $*"
  if [ -n "${TOPSPIN_SKIP_FILE:-}" ]; then echo "$*" > "$TOPSPIN_SKIP_FILE"; fi
  exit 77
}

# Go: the toolchain where the Go installer and `go install` put it.
go_path() {
  local gopath
  PATH="$PATH:/usr/local/go/bin"
  gopath=$(go env GOPATH 2>/dev/null || echo "$HOME/go")
  PATH="$PATH:$gopath/bin"
  export PATH
}
# go_min GOMOD...: the highest `go` version these go.mod files ask for.
go_min() { awk '$1 == "go" {print $2}' "$@" | sort -V | tail -n1; }
# check_go MIN: fails (with what to do) unless a Go that can build for MIN is there or can come
# from apt: Go >= MIN, or Go >= 1.21, which fetches the go MIN toolchain from the Go module
# proxy itself (GOTOOLCHAIN=auto). Sets go_apt=golang-go when apt must install it (planned).
check_go() {
  local min=$1 v how
  how="Install Go >= $min from https://go.dev/dl/ (e.g. tar -C /usr/local -xzf go$min.linux-amd64.tar.gz; /usr/local/go/bin is looked in), or put such a go first on PATH."
  go_apt=""
  if have go; then
    v=$(go env GOVERSION 2>/dev/null || true); v=${v#go}; v=${v%% *}
    version_ge "$v" "$min" && return 0
    if version_ge "$v" 1.21 && [ "$(go env GOTOOLCHAIN 2>/dev/null)" != local ]; then
      [ -d "$(go env GOMODCACHE)/golang.org/toolchain@v0.0.1-go$min.$(go env GOHOSTOS)-$(go env GOHOSTARCH)" ] ||
        plan "the go$min toolchain (go $v fetches it from the Go module proxy on first use)"
      return 0
    fi
    need_version "Go" "$v" "$min" "$how (A Go >= 1.21 also does, with GOTOOLCHAIN=auto: it fetches go$min itself.)"
    return 1
  fi
  v=$(apt_candidate_version golang-go)
  if [ -n "$v" ] && { version_ge "$v" "$min" || version_ge "$v" 1.21; }; then
    go_apt=golang-go
    plan "apt: golang-go ($v)"
    version_ge "$v" "$min" || plan "the go$min toolchain (go $v fetches it from the Go module proxy on first use)"
    return 0
  fi
  echo "error: Go is not installed, and apt offers ${v:+only golang-go $v: }no Go >= $min, nor a Go >= 1.21 (which fetches go$min itself). $how" >&2
  return 1
}
# check_python PY: Python >= 3.11 (the tools' venvs); fails with what to do.
check_python() {
  local py=$1 v
  if ! have "$py"; then
    echo "error: $py not found: Python >= 3.11 is needed. Install it (Debian 12 and later: apt-get install python3 python3-venv) or set PYTHON to one." >&2
    return 1
  fi
  v=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
  need_version "Python ($py)" "$v" 3.11 "Set PYTHON to a python3.11 or newer, or install one (pyenv, Debian 12 and later)."
}
# check_venv VENV PY PKG...: plans what a venv with these pip packages needs. Sets new_venv
# (1: make it with PY), venv_apt (python3-venv when PY cannot make venvs) and venv_missing
# (the packages to pip install); fails on a Python < 3.11.
check_venv() {
  local venv=$1 py=$2
  shift 2
  new_venv="" venv_apt="" venv_missing=()
  if [ -x "$venv/bin/python" ]; then
    check_python "$venv/bin/python" || { echo "error: remove $venv to make it again with $py" >&2; return 1; }
    mapfile -t venv_missing < <("$venv/bin/python" -c '
import sys
from importlib.metadata import PackageNotFoundError, version
for name in sys.argv[1:]:
    try:
        version(name)
    except PackageNotFoundError:
        print(name)
' "$@")
  else
    check_python "$py" || return 1
    new_venv=1
    venv_missing=("$@")
    # Debian's python3 needs python3-venv for `-m venv` (a pyenv or python.org build has it).
    if ! "$py" -c 'import venv, ensurepip' >/dev/null 2>&1; then
      have apt-get || { echo "error: $py cannot make a venv (no ensurepip); install its venv module" >&2; return 1; }
      venv_apt=python3-venv
      plan "apt: python3-venv"
    fi
    plan "a venv $venv ($py -m venv)"
  fi
  [ ${#venv_missing[@]} -eq 0 ] || plan "pip into $venv: ${venv_missing[*]}"
}
