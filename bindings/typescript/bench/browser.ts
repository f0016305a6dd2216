// The browser benchmark (npm run bench:browser): headless Chromium (Debian's /usr/bin/chromium
// through playwright-core, as browser/run.ts) loads bench/browser-page.ts, which echoes 20 B and
// 1 MiB with topspin over WebSocket to the Node topspin server and with connect-web (Connect
// protocol over fetch) to a Node connect server on HTTP/1.1. Both servers run in this process;
// the page comes from the connect server's origin (no CORS) with COOP/COEP, so that
// `performance.now()` has its fine resolution. Bounded: each measurement stops after 5 s, the
// whole run takes under 40 s.
//
// Usage: node dist/bench/browser.js [--quick]
import { createServer } from "node:http";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { chromium } from "playwright-core";
import type { ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { Server } from "../src/node/index.js";
import { Echo } from "../gen/bench/v1/echo_pb.js";
import type { BrowserRow } from "./browser-page.js";

const quick = process.argv.includes("--quick");
const counts = quick ? { small: 300, big: 10, tput: 1000, capMs: 1500 } : { small: 2000, big: 30, tput: 5000, capMs: 5000 };
const pkg = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

const bundle = await build({ entryPoints: [join(pkg, "bench", "browser-page.ts")], bundle: true, format: "esm", platform: "browser", target: "es2022", minify: true, write: false });
const js = bundle.outputFiles[0]?.text ?? "";
const html = `<!doctype html><meta charset="utf-8"><title>topspin vs connect-web</title><h1>topspin vs connect-web</h1><script type="module" src="/page.js"></script>`;

const connect = connectNodeAdapter({ routes: (r: ConnectRouter) => void r.service(Echo, { echo: (req) => req }), readMaxBytes: 64 << 20, writeMaxBytes: 64 << 20 });
const isolation = { "cross-origin-opener-policy": "same-origin", "cross-origin-embedder-policy": "require-corp" };
const http = createServer((req, res) => {
  if (req.url?.startsWith("/bench.v1.Echo/")) connect(req, res);
  else if (req.url?.startsWith("/page.js")) res.writeHead(200, { "content-type": "text/javascript", ...isolation }).end(js);
  else res.writeHead(200, { "content-type": "text/html", ...isolation }).end(html);
});
await new Promise<void>((r) => http.listen(0, "127.0.0.1", r));
const origin = `http://127.0.0.1:${(http.address() as { port: number }).port}`;
// The page comes from another origin (this HTTP server's port): the Node server must allow it.
const topspin = new Server({ webSocket: { allowedOrigins: [origin] } }).service(Echo, { echo: (req) => req });
const wsAddress = await topspin.listen("ws://127.0.0.1:0/topspin");

const profile = mkdtempSync(join(tmpdir(), "topspin-bench-chromium-"));
let failed = false;
try {
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  try {
    const page = context.pages()[0] ?? (await context.newPage());
    page.on("console", (m) => console.log(`[page] ${m.text()}`));
    await page.goto(`${origin}/?ws=${encodeURIComponent(wsAddress)}&small=${counts.small}&big=${counts.big}&tput=${counts.tput}&capMs=${counts.capMs}`);
    await page.waitForFunction(() => window.__bench?.done === true, undefined, { timeout: 110_000, polling: 250 });
    const r = await page.evaluate(() => window.__bench);
    const version = context.browser()?.version() ?? (await page.evaluate(() => navigator.userAgent));
    if (r === undefined || r.error !== undefined || r.rows.length !== 2) {
      console.error(`the page failed: ${r?.error ?? "no results"}`);
      failed = true;
    } else {
      const ref = r.rows[0] as BrowserRow;
      const f = (x: number): string => x.toFixed(0);
      console.log(`Headless Chromium ${version}, page → Node servers on loopback, ${r.counts[0]} × 20 B, ${r.counts[1]} × 1 MiB, ${r.counts[2]} calls at 64 in flight, each measurement capped at ${counts.capMs / 1000} s${quick ? " (quick)" : ""}; timer: ${r.isolated ? "cross-origin isolated (fine)" : "coarse (100 µs)"}.`);
      console.log("Latency in µs; × topspin = this system's figure / topspin's (calls/s: topspin's / this one's; > 1: topspin is faster).\n");
      console.log("| system | 20 B median | p99 | 1 MiB median | p99 | calls/s, 20 B, 64 in flight | × topspin: 20 B median | 1 MiB median | calls/s |");
      console.log("|---|---|---|---|---|---|---|---|---|");
      for (const row of r.rows) {
        console.log(
          `| ${row.name} | ${f(row.small.median)} | ${f(row.small.p99)} | ${f(row.big.median)} | ${f(row.big.p99)} | ${f(row.tput)} | ${(row.small.median / ref.small.median).toFixed(2)} | ${(row.big.median / ref.big.median).toFixed(2)} | ${(ref.tput / row.tput).toFixed(2)} |`,
        );
      }
    }
  } finally {
    await context.close();
  }
} finally {
  http.close();
  await topspin.close(500);
  rmSync(profile, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
