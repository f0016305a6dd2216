#!/usr/bin/env bash
# Installs what bindings/typescript needs; safe to run again (skips what is there):
# Node.js and npm (Debian) if missing, Debian's chromium (the browser test drives it with
# playwright-core; no browser download), the npm packages (npm install: package.json's
# dependencies, the optional bufferutil, and the devDependencies, among them the benchmark's peers
# @grpc/grpc-js, @connectrpc/connect-node and @connectrpc/connect-web) and the generated
# protobuf-es code (buf generate; the buf binary comes from the @bufbuild/buf npm package).
set -euo pipefail
cd "$(dirname "$0")/../bindings/typescript"

have() { command -v "$1" >/dev/null 2>&1; }
as_root=""; [ "$(id -u)" -eq 0 ] || as_root="sudo"

apt_pkgs=()
have node || apt_pkgs+=(nodejs)
have npm || apt_pkgs+=(npm)
[ -x /usr/bin/chromium ] || apt_pkgs+=(chromium)
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  $as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq "${apt_pkgs[@]}"
fi

node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
  echo "setup-typescript: Node.js >= 20 is needed (found $(node --version))" >&2
  exit 1
fi

# npm install only when package-lock.json changed since the last install.
stamp=node_modules/.topspin-lock-stamp
lock_sum=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$lock_sum" ]; then
  # npm install (not npm ci): the lock cannot list @bufbuild/buf's binaries for other platforms
  # (the registry reached here has only some of them), which npm ci refuses.
  npm install --no-audit --no-fund --loglevel=error
  echo "$lock_sum" > "$stamp"
fi

# Generated code (gen/ is not committed): protobuf-es messages and service descriptors.
npx --no-install buf generate
