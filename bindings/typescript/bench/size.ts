// Prints the min+gzip size of the browser client runtime (what a web page ships): the engine,
// the channel, typed clients and the WebSocket transport, bundled and minified with esbuild.
// Usage: node dist/bench/size.js [--json]
import { build } from "esbuild";
import { gzipSync } from "node:zlib";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

const here = dirname(fileURLToPath(import.meta.url));
const pkg = join(here, "..", "..");
const entry = `export { Channel, createClient, webSocketDialer, TopspinError, Code } from "./src/index.ts";`;

async function size(external: string[]): Promise<{ min: number; gzip: number }> {
  const r = await build({
    stdin: { contents: entry, resolveDir: pkg, loader: "ts" },
    bundle: true,
    minify: true,
    format: "esm",
    platform: "browser",
    target: "es2022",
    write: false,
    external,
    treeShaking: true,
  });
  const code = r.outputFiles[0]?.contents ?? new Uint8Array();
  return { min: code.length, gzip: gzipSync(code, { level: 9 }).length };
}

const own = await size(["@bufbuild/protobuf"]);
const all = await size([]);
const kb = (n: number): string => `${(n / 1024).toFixed(1)} KB`;
console.log(`topspin client runtime (without @bufbuild/protobuf): ${kb(own.min)} min, ${kb(own.gzip)} min+gzip (target <= 15 KB)`);
console.log(`with @bufbuild/protobuf's runtime (what toBinary/fromBinary pull in): ${kb(all.min)} min, ${kb(all.gzip)} min+gzip`);
if (own.gzip > 15 * 1024) {
  console.error("the client runtime is over its 15 KB min+gzip budget");
  process.exit(1);
}
