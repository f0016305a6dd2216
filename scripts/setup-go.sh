#!/usr/bin/env bash
# Set-up of the Go implementation (go/): the Go toolchain, the module's dependencies and
# staticcheck (pinned). Idempotent: skips what is present.
set -euo pipefail
cd "$(dirname "$0")/.."

STATICCHECK_VERSION=v0.8.2   # honnef.co/go/tools; supports the Go of go/go.mod and newer

export PATH="$PATH:/usr/local/go/bin:$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"
if ! command -v go >/dev/null 2>&1; then
  apt-get update
  apt-get install -y golang-go
fi
# go.mod asks for go 1.26; an older go fetches that toolchain from the Go module proxy.
(cd go && go mod download)
GOBIN="$(go env GOPATH)/bin"
if ! "$GOBIN/staticcheck" -version 2>/dev/null | grep -q "${STATICCHECK_VERSION#v}"; then
  go install "honnef.co/go/tools/cmd/staticcheck@${STATICCHECK_VERSION}"
fi
