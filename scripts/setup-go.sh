#!/usr/bin/env bash
# Set-up of the Go implementation (go/): a Go toolchain new enough for the go.mod files, the
# module's dependencies and staticcheck (pinned). Idempotent: says what it will install, and
# installs nothing that is there.
#
#   scripts/setup-go.sh                    everything scripts/test-go.sh needs
#   scripts/setup-go.sh --toolchain-only   only Go (the grpc and grpcclient parts build Go
#                                          programs of their own)
#
# Go comes from apt (golang-go, through sudo when not root) when there is none; a Go older than
# go.mod's version but >= 1.21 fetches the right toolchain from the Go module proxy itself.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

STATICCHECK_VERSION=v0.8.2   # honnef.co/go/tools; supports the Go of go/go.mod and newer

toolchain_only=""
case "${1:-}" in
  --toolchain-only) toolchain_only=1 ;;
  "") ;;
  *) echo "setup-go: unknown argument $1" >&2; exit 2 ;;
esac

go_path
check_go "$(go_min go/go.mod crates/topspin/tests/grpc-go-*/go.mod)"
mod_download=""
staticcheck=""
if [ -z "$toolchain_only" ]; then
  # Modules missing from the module cache (`go mod download` would fetch them).
  if [ -n "$go_apt" ] || ! (cd go && GOPROXY=off go mod download >/dev/null 2>&1); then
    mod_download=1
    plan "go/'s module dependencies (go mod download, from the Go module proxy)"
  fi
  if [ -n "$go_apt" ] || ! "$(go env GOPATH)/bin/staticcheck" -version 2>/dev/null | grep -q "${STATICCHECK_VERSION#v}"; then
    staticcheck=1
    plan "staticcheck $STATICCHECK_VERSION (go install, into $(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin)"
  fi
fi

plan_show "setup-go${toolchain_only:+ (--toolchain-only)}" || exit 0
[ -z "$go_apt" ] || { apt_install "$go_apt"; go_path; }
[ -z "$mod_download" ] || (cd go && go mod download)
[ -z "$staticcheck" ] || go install "honnef.co/go/tools/cmd/staticcheck@${STATICCHECK_VERSION}"
