#!/usr/bin/env bash
# Installs grpcurl (pinned), the gRPC command-line client no one here wrote, into
# target/grpc-tools/: the Go, TypeScript and grpc parts call every language's server with it.
# Needs Go (checked first; apt golang-go when missing, through sudo when not root).
# Idempotent: says what it will install, and installs nothing that is there.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
GRPCURL_VERSION=v1.9.3
TOOLS=$PWD/target/grpc-tools

go_path
check_go "$(go_min crates/topspin/tests/grpc-go-*/go.mod)"
# (`go install` builds say "dev build" for -version: a stamp file records the version.)
grpcurl=""
if [ ! -x "$TOOLS/grpcurl" ] || [ "$(cat "$TOOLS/grpcurl.version" 2>/dev/null)" != "$GRPCURL_VERSION" ]; then
  grpcurl=1
  plan "grpcurl $GRPCURL_VERSION (go install, into target/grpc-tools/)"
fi
plan_show setup-grpcurl || exit 0
[ -z "$go_apt" ] || { apt_install "$go_apt"; go_path; }
if [ -n "$grpcurl" ]; then
  mkdir -p "$TOOLS"
  GOBIN="$TOOLS" go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
  echo "$GRPCURL_VERSION" > "$TOOLS/grpcurl.version"
fi
