// The Chromium client of the cross-language matrix (testdata/matrix/README.md):
//   node dist/matrix/browser.js --target ws://127.0.0.1:PORT/
// bundles matrix/browser-page.ts (the checks of matrix/checks.ts on the browser's WebSocket) with
// esbuild, serves it on 127.0.0.1, opens it in Debian's Chromium through playwright-core, prints
// the page's `ok`/`FAIL`/`skip` lines as they come and exits with its result (0: none failed).
// A browser has neither TCP nor Unix sockets: for other targets every check is `skip`.
// The page is served from its own port, so the server must accept its origin.
import { createServer, type Server as HttpServer } from "node:http";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { chromium, type BrowserContext } from "playwright-core";
import { CHECKS } from "./checks.js";
import { targetArg } from "./args.js";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
/** The run's bound (README: every client ends within 60 s). */
const RUN_DEADLINE_MS = 58_000;
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";

const out = (line: string): void => void process.stdout.write(`${line}\n`);

/** Serves the page and its bundle on 127.0.0.1 (any port). */
async function servePage(): Promise<{ http: HttpServer; url: string }> {
  const bundle = await build({ entryPoints: [join(pkg, "matrix", "browser-page.ts")], bundle: true, format: "esm", platform: "browser", target: "es2022", write: false, logLevel: "error" });
  const js = bundle.outputFiles[0]?.text ?? "";
  const html = `<!doctype html><meta charset="utf-8"><title>topspin matrix in Chromium</title>
<h1>topspin matrix checks → <span id="target"></span></h1><ol id="checks"></ol><h2 id="status">running…</h2>
<script type="module" src="/page.js"></script>`;
  const http = createServer((req, res) => {
    if (req.url?.startsWith("/page.js")) res.writeHead(200, { "content-type": "text/javascript" }).end(js);
    else res.writeHead(200, { "content-type": "text/html" }).end(html);
  });
  await new Promise<void>((r) => http.listen(0, "127.0.0.1", r));
  return { http, url: `http://127.0.0.1:${(http.address() as { port: number }).port}/` };
}

/** Opens the page for `target` and resolves with its result, relaying its lines through `seen`. */
async function runPage(context: BrowserContext, pageUrl: string, target: string, seen: (line: string) => void): Promise<boolean> {
  const page = context.pages()[0] ?? (await context.newPage());
  let finish!: (passed: boolean) => void;
  const done = new Promise<boolean>((r) => (finish = r));
  let lines = 0;
  page.on("pageerror", (e) => {
    process.stderr.write(`[page error] ${e.message}\n`);
    if (lines === 0) finish(false); // the page broke before its first check
  });
  // A browser shows a refused WebSocket handshake to the page as close code 1006 only; the
  // console says why (403: the server does not accept the page's origin).
  let refused = "";
  page.on("console", (m) => {
    if (m.type() !== "error" && m.type() !== "warning") return;
    process.stderr.write(`[page ${m.type()}] ${m.text()}\n`);
    const code = /Unexpected response code: (\d+)/.exec(m.text())?.[1];
    if (code !== undefined) refused = ` (the handshake was answered ${code}${code === "403" ? `: the server refuses the page's origin ${new URL(pageUrl).origin}` : ""})`;
  });
  await page.exposeFunction("__matrixLine", (line: string) => {
    lines++;
    seen(line.startsWith("FAIL ") && line.includes("WebSocket closed (1006)") ? line + refused : line);
  });
  await page.exposeFunction("__matrixDone", (passed: boolean, error: string) => {
    if (error !== "") process.stderr.write(`[page] the checks stopped: ${error}\n`);
    finish(passed);
  });
  page.on("close", () => finish(false));
  const q = new URLSearchParams({ target, prefix: `ts-browser-${process.pid}` });
  await page.goto(`${pageUrl}?${q.toString()}`);
  return done;
}

async function main(): Promise<number> {
  let target: string;
  try {
    target = targetArg(process.argv.slice(2));
  } catch (e) {
    process.stderr.write(`${e instanceof Error ? e.message : String(e)}\n`);
    return 2;
  }
  if (!target.startsWith("ws://") && !target.startsWith("wss://")) {
    const why = `a browser has no ${target.startsWith("unix://") ? "Unix" : "TCP"} sockets (WebSocket only)`;
    for (const c of CHECKS) out(`skip ${c.name}: ${why}`);
    return 0;
  }
  const reported = new Set<string>();
  const seen = (line: string): void => {
    reported.add(/^(?:ok|FAIL|skip) ([^:\s]+)/.exec(line)?.[1] ?? "");
    out(line);
  };
  // Checks the page never reported (it crashed, Chromium did not start, the run took too long).
  const failRest = (why: string): void => {
    for (const c of CHECKS) if (!reported.has(c.name)) out(`FAIL ${c.name}: ${why}`);
  };
  const watchdog = setTimeout(() => {
    failRest(`the browser run took over ${RUN_DEADLINE_MS} ms`);
    process.exit(1);
  }, RUN_DEADLINE_MS);
  const { http, url } = await servePage();
  const profile = mkdtempSync(join(tmpdir(), "topspin-matrix-chromium-"));
  try {
    const context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
    try {
      const passed = await runPage(context, url, target, seen);
      const all = CHECKS.every((c) => reported.has(c.name));
      if (!all) failRest("the page did not report it");
      return passed && all ? 0 : 1;
    } finally {
      await context.close();
    }
  } catch (e) {
    failRest(`the browser failed: ${(e instanceof Error ? e.message : String(e)).split("\n")[0] ?? ""}`);
    return 1;
  } finally {
    clearTimeout(watchdog);
    http.close();
    rmSync(profile, { recursive: true, force: true });
  }
}

process.exit(await main());
