// The browser test: starts the Rust kvstore-server on ws://127.0.0.1 (KVSTORE_SERVER, a build
// with the WebSocket transport), serves browser/page.ts bundled with esbuild, drives Debian's
// Chromium with playwright-core, asserts every check of the page and saves a screenshot to
// test-results/browser.png.
import { createServer } from "node:http";
import { mkdtempSync, mkdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { chromium } from "playwright-core";
import { binary, startServer, stop } from "../test/procs.js";
import { connect } from "../src/node/index.js";
import { kvSuite } from "../test/suite.js";
import { serveWebExample } from "../examples/web.js";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

const bundle = await build({ entryPoints: [join(pkg, "browser", "page.ts")], bundle: true, format: "esm", platform: "browser", target: "es2022", minify: true, write: false });
const js = bundle.outputFiles[0]?.text ?? "";
const html = `<!doctype html><meta charset="utf-8"><title>topspin in the browser</title>
<h1>topspin → Rust over <span id="url"></span></h1><ol id="checks"></ol><h2 id="status">running…</h2>
<script type="module" src="/page.js"></script>`;
const http = createServer((req, res) => {
  if (req.url?.startsWith("/page.js")) res.writeHead(200, { "content-type": "text/javascript" }).end(js);
  else res.writeHead(200, { "content-type": "text/html" }).end(html);
});
await new Promise<void>((r) => http.listen(0, "127.0.0.1", r));
const pagePort = (http.address() as { port: number }).port;

// The pages come from other ports of 127.0.0.1: origins the server must be told to accept
// (by default it refuses pages of other origins).
const { proc, address } = await startServer(binary("KVSTORE_SERVER"), ["ws://127.0.0.1:0/topspin", "--allow-origin", "http://127.0.0.1:*"]);
const profile = mkdtempSync(join(tmpdir(), "topspin-chromium-"));
let failed = false;
try {
  // Node over ws:// first (the `ws` package, or Node's own WebSocket where present).
  const ch = connect(address);
  try {
    await kvSuite(ch, "nodews/");
    console.log("node client over ws:// (every call kind, deadline, cancel, error, 1 MiB): passed");
  } finally {
    ch.close();
  }
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  try {
    const page = context.pages()[0] ?? (await context.newPage());
    page.on("console", (m) => console.log(`[page] ${m.text()}`));
    await page.goto(`http://127.0.0.1:${pagePort}/?ws=${encodeURIComponent(address)}`);
    await page.waitForFunction(() => window.__results?.done === true, undefined, { timeout: 60_000 });
    const results = await page.evaluate(() => window.__results);
    mkdirSync(join(pkg, "test-results"), { recursive: true });
    await page.screenshot({ path: join(pkg, "test-results", "browser.png"), fullPage: true });
    const expected = 10;
    for (const c of results?.checks ?? []) console.log(`${c.ok ? "ok    " : "FAILED"} ${c.name}: ${c.detail}`);
    const passed = (results?.checks ?? []).filter((c) => c.ok).length;
    const count = results?.checks.length ?? 0;
    console.log(`browser: ${passed} passed, ${count - passed + Math.max(0, expected - count)} failed`);
    failed = passed !== expected || count !== expected;

    // The README's web page (examples/web-page.ts, served by examples/web.ts): keys typed in its
    // form go up one open bidi GetMany call, the answers are listed as they come down.
    const web = await serveWebExample(address, 0);
    try {
      const chat = await context.newPage();
      chat.on("console", (m) => console.log(`[web example] ${m.text()}`));
      await chat.goto(web.url);
      const lines = async (n: number): Promise<string[]> => {
        await chat.waitForFunction((k) => document.querySelectorAll("ol li").length >= k, n, { timeout: 20_000 });
        return chat.$$eval("ol li", (lis) => lis.map((li) => li.textContent ?? ""));
      };
      await lines(1); // ready
      for (const key of ["greeting", "language", "greeting", "nope"]) {
        await chat.fill("input", key);
        await chat.press("input", "Enter");
      }
      const got = await lines(5);
      await chat.screenshot({ path: join(pkg, "test-results", "web-example.png"), fullPage: true });
      const want = [
        "ready: type greeting or language",
        "greeting = hello from topspin (version 1)",
        "language = TypeScript, in a browser (version 1)",
        "greeting = hello from topspin (version 1)",
        'ended: NOT_FOUND: no key "nope"',
      ];
      const ok = JSON.stringify(got) === JSON.stringify(want);
      console.log(`${ok ? "ok    " : "FAILED"} README web page (bidi GetMany from a form): ${JSON.stringify(got)}`);
      if (!ok) failed = true;
    } finally {
      web.server.close();
    }
  } finally {
    await context.close();
  }
} finally {
  await stop(proc);
  http.close();
  rmSync(profile, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
