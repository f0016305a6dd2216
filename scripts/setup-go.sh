#!/usr/bin/env bash
# Set-up of the Go implementation (go/): a Go toolchain new enough for the go.mod files, the
# dependencies of its modules (go/, go/topspinotel, go/gen, go/tools), staticcheck (pinned) and
# buf (pinned, built with go install into target/go-tools/: the test of protoc-gen-go-topspin
# runs `buf generate`; BUF=/path/to/buf uses that one instead). Idempotent: says what it will
# install, and installs nothing that is there.
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
BUF_VERSION=v1.75.0          # github.com/bufbuild/buf (the TypeScript part's npm buf is 1.75.0 too)
GO_TOOLS=$PWD/target/go-tools
GO_MODULES=". topspinotel gen tools"   # under go/

toolchain_only=""
case "${1:-}" in
  --toolchain-only) toolchain_only=1 ;;
  "") ;;
  *) echo "setup-go: unknown argument $1" >&2; exit 2 ;;
esac

go_path
check_go "$(go_min go/go.mod go/*/go.mod crates/topspin/tests/grpc-go-*/go.mod examples/interop/grpc-go-client/go.mod)"
mod_download=""
staticcheck=""
buf=""
if [ -z "$toolchain_only" ]; then
  # Modules missing from the module cache (`go mod download` would fetch them).
  for m in $GO_MODULES; do
    if [ -n "$go_apt" ] || ! (cd "go/$m" && GOPROXY=off go mod download >/dev/null 2>&1); then
      mod_download=1
    fi
  done
  [ -z "$mod_download" ] || plan "the module dependencies of go/, go/topspinotel, go/gen, go/tools (go mod download, from the Go module proxy)"
  if [ -n "$go_apt" ] || ! "$(go env GOPATH)/bin/staticcheck" -version 2>/dev/null | grep -q "${STATICCHECK_VERSION#v}"; then
    staticcheck=1
    plan "staticcheck $STATICCHECK_VERSION (go install, into $(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin)"
  fi
  # (`go install` builds say "dev build" for --version: a stamp file records the version.)
  if [ ! -x "${BUF:-}" ] && { [ ! -x "$GO_TOOLS/buf" ] || [ "$(cat "$GO_TOOLS/buf.version" 2>/dev/null)" != "$BUF_VERSION" ]; }; then
    buf=1
    plan "buf $BUF_VERSION (go install, into target/go-tools/; a few minutes the first time)"
  fi
fi

plan_show "setup-go${toolchain_only:+ (--toolchain-only)}" || exit 0
[ -z "$go_apt" ] || { apt_install "$go_apt"; go_path; }
if [ -n "$mod_download" ]; then
  for m in $GO_MODULES; do (cd "go/$m" && go mod download); done
fi
[ -z "$staticcheck" ] || go install "honnef.co/go/tools/cmd/staticcheck@${STATICCHECK_VERSION}"
if [ -n "$buf" ]; then
  mkdir -p "$GO_TOOLS"
  GOBIN="$GO_TOOLS" go install "github.com/bufbuild/buf/cmd/buf@$BUF_VERSION"
  echo "$BUF_VERSION" > "$GO_TOOLS/buf.version"
fi
