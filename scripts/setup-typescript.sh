#!/usr/bin/env bash
# Installs what bindings/typescript needs; idempotent: says what it will install, and installs
# nothing that is there:
#   - Node.js >= 20 and npm from apt (through sudo when not root) when missing — the version apt
#     offers is checked first; a node on PATH older than 20 is an error, not an install
#   - Debian's chromium (the browser test drives it with playwright-core; no browser download)
#   - the npm packages (npm install: package.json's dependencies, the optional bufferutil, and
#     the devDependencies, among them the benchmark's peers @grpc/grpc-js,
#     @connectrpc/connect-node and @connectrpc/connect-web), when package-lock.json changed
#     since the last install
#   - the generated protobuf-es code in gen/ (buf generate; the buf binary comes from the
#     @bufbuild/buf npm package), when its inputs changed
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
how="Install Node.js >= 20 (https://nodejs.org, NodeSource's Debian packages, or nvm) and put it first on PATH."

apt_pkgs=()
if have node; then
  need_version "Node.js" "$(node -p process.versions.node)" 20 "$how"
else
  v=$(apt_candidate_version nodejs)
  need_version "Node.js (none on PATH; apt's nodejs)" "$v" 20 "$how"
  apt_pkgs+=(nodejs)
fi
have npm || apt_pkgs+=(npm)
[ -x /usr/bin/chromium ] || apt_pkgs+=(chromium)
[ ${#apt_pkgs[@]} -eq 0 ] || plan "apt: ${apt_pkgs[*]}"

cd bindings/typescript
# npm install only when package-lock.json changed since the last install.
stamp=node_modules/.topspin-lock-stamp
lock_sum=$(sha256sum package-lock.json | cut -d' ' -f1)
npm_install=""
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$lock_sum" ]; then
  npm_install=1
  plan "npm packages of bindings/typescript (npm install)"
fi
# buf generate only when its inputs changed (gen/ is not committed).
gen_stamp=gen/.topspin-inputs-stamp
gen_sum=$( (echo "$lock_sum"; sha256sum buf.gen.yaml
            find ../../examples/kvstore/proto bench/proto ../../testdata/matrix -name '*.proto' -type f -print0 |
              sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1)
gen=""
if [ -n "$npm_install" ] || [ ! -f "$gen_stamp" ] || [ "$(cat "$gen_stamp")" != "$gen_sum" ]; then
  gen=1
fi

plan_show setup-typescript || true
apt_install "${apt_pkgs[@]}"
if [ -n "$npm_install" ]; then
  # npm install (not npm ci): the lock cannot list @bufbuild/buf's binaries for other platforms
  # (the registry reached here has only some of them), which npm ci refuses.
  npm install --no-audit --no-fund --loglevel=error
  echo "$lock_sum" > "$stamp"
fi
if [ -n "$gen" ]; then
  echo "setup-typescript: generating gen/ (buf generate)"
  npx --no-install buf generate
  echo "$gen_sum" > "$gen_stamp"
fi
