#!/usr/bin/env bash
# The npm package as a user gets it: `npm pack` (its prepack builds dist/src), the tarball
# installed into a fresh project (`npm init -y`), code generated there for a small .proto
# (proto/greet/v1/greet.proto) with buf.gen.yaml as the README gives it, type-checked against
# the installed package (tsc --strict), and main.ts run: a Node server and a client calling it
# (unary, server streaming, an error status). Also: the subpath exports (./node, ./compression,
# ./otel) resolve, and the licence files are the repository's. The README's "Install, and your
# own .proto" quotes greet.proto, buf.gen.yaml, tsconfig.json, main.ts and what it prints
# (main.out); test/readme.test.ts keeps them the same.
#
# Packages come from the npm cache first (--prefer-offline), at the versions this checkout has
# installed, so the check runs without the network when ./scripts/setup-typescript.sh ran.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
pkg="$(dirname "$here")"
root="$(cd "$pkg/../.." && pwd)"
cd "$pkg"

for f in LICENSE-MIT LICENSE-APACHE; do
  cmp -s "$f" "$root/$f" || { echo "pack: $f differs from the repository's $f (copy it again)" >&2; exit 1; }
done

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
version() { node -p "require('$pkg/node_modules/$1/package.json').version"; }
npm_() { timeout 120 npm --prefer-offline --no-audit --no-fund --loglevel=error "$@"; }

echo "pack: npm pack"
npm_ pack --pack-destination "$tmp" >/dev/null
tgz="$(ls "$tmp"/*.tgz)"
listing="$(tar tzf "$tgz")"
for f in package/package.json package/README.md package/LICENSE-MIT package/LICENSE-APACHE \
         package/dist/src/index.js package/dist/src/index.d.ts package/dist/src/node/index.js \
         package/dist/src/compression.js package/dist/src/otel.js package/dist/src/gen/grpc/health/v1/health_pb.js; do
  grep -qx "$f" <<<"$listing" || { echo "pack: $(basename "$tgz") lacks $f" >&2; exit 1; }
done
if grep -v -e '^package/dist/src/' -e '^package/package.json$' -e '^package/README.md$' -e '^package/LICENSE-' <<<"$listing"; then
  echo "pack: $(basename "$tgz") holds files it should not (above)" >&2
  exit 1
fi
echo "pack: $(basename "$tgz"), $(wc -l <<<"$listing") files, $(du -k "$tgz" | cut -f1) KiB"

app="$tmp/app"
mkdir "$app"
cp -r "$here/proto" "$here/buf.gen.yaml" "$here/tsconfig.json" "$here/main.ts" "$app/"
cd "$app"
npm init -y >/dev/null
npm pkg set type=module
echo "pack: npm install (the tarball, @bufbuild/protobuf; buf, protoc-gen-es, typescript, @types/node)"
npm_ install "$tgz" "@bufbuild/protobuf@$(version @bufbuild/protobuf)" "@opentelemetry/api@$(version @opentelemetry/api)"
npm_ install --save-dev "@bufbuild/buf@$(version @bufbuild/buf)" "@bufbuild/protoc-gen-es@$(version @bufbuild/protoc-gen-es)" \
  "typescript@$(version typescript)" "@types/node@$(version @types/node)"
[ ! -L node_modules/@topspin/topspin ] || { echo "pack: the package was linked, not installed" >&2; exit 1; }

echo "pack: buf generate, tsc, node dist/main.js"
timeout 60 npx --no-install buf generate
test -f gen/greet/v1/greet_pb.ts
timeout 60 npx --no-install tsc -p tsconfig.json
got="$(timeout 30 node dist/main.js)"
want="$(cat "$here/main.out")"
if [ "$got" != "$want" ]; then
  printf 'pack: main.js printed\n%s\ninstead of\n%s\n' "$got" "$want" >&2
  exit 1
fi

timeout 30 node --input-type=module -e '
const checks = { "@topspin/topspin": "createClient", "@topspin/topspin/node": "Server",
  "@topspin/topspin/compression": "webCodecs", "@topspin/topspin/otel": "otelClientInterceptor" };
for (const [spec, name] of Object.entries(checks)) {
  const m = await import(spec);
  if (typeof m[name] === "undefined") throw new Error(`${spec} has no ${name}`);
}'
echo "pack: ok (installed from the tarball, generated code called through a Node server, subpath exports resolve)"
