// The README's quick start and web page are the files that the tests run: keep them the same.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const pkg = join(fileURLToPath(import.meta.url), "..", "..", "..");

test("README quotes examples/quickstart.ts verbatim", () => {
  const readme = readFileSync(join(pkg, "README.md"), "utf8");
  const qs = readFileSync(join(pkg, "examples", "quickstart.ts"), "utf8");
  assert.ok(readme.includes("```ts\n" + qs + "```"), "README.md must contain examples/quickstart.ts as its ts block");
});

test("README quotes examples/web-page.ts (the web page with bidi streaming) verbatim", () => {
  const readme = readFileSync(join(pkg, "README.md"), "utf8");
  const page = readFileSync(join(pkg, "examples", "web-page.ts"), "utf8");
  assert.ok(readme.includes("```ts\n" + page + "```"), "README.md must contain examples/web-page.ts as a ts block");
});

test("README quotes examples/interceptors.ts verbatim", () => {
  const readme = readFileSync(join(pkg, "README.md"), "utf8");
  const ex = readFileSync(join(pkg, "examples", "interceptors.ts"), "utf8");
  assert.ok(readme.includes("```ts\n" + ex + "```"), "README.md must contain examples/interceptors.ts as a ts block");
});

test("README quotes examples/otel.ts verbatim", () => {
  const readme = readFileSync(join(pkg, "README.md"), "utf8");
  const ex = readFileSync(join(pkg, "examples", "otel.ts"), "utf8");
  assert.ok(readme.includes("```ts\n" + ex + "```"), "README.md must contain examples/otel.ts as a ts block");
});

test("README quotes pack/ (install, and your own .proto) verbatim: the files pack/check.sh runs", () => {
  const readme = readFileSync(join(pkg, "README.md"), "utf8");
  const blocks: [string, string][] = [
    ["proto", "pack/proto/greet/v1/greet.proto"],
    ["yaml", "pack/buf.gen.yaml"],
    ["json", "pack/tsconfig.json"],
    ["ts", "pack/main.ts"],
    ["text", "pack/main.out"],
  ];
  for (const [lang, file] of blocks) {
    const text = readFileSync(join(pkg, file), "utf8");
    assert.ok(readme.includes("```" + lang + "\n" + text + "```"), `README.md must contain ${file} as a ${lang} block`);
  }
});
