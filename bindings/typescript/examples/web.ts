// Serves examples/web-page.ts (bundled with esbuild) on http://127.0.0.1:8080 for a topspin
// server reachable over WebSocket. Usage:
//   node dist/examples/web.js ws://127.0.0.1:50051/topspin [port]
// then open the printed address in a browser.
import { createServer, type Server } from "node:http";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

/** The page's HTML: a form, a list, and the bundled script. */
export const WEB_HTML = `<!doctype html><meta charset="utf-8"><title>topspin: bidi streaming in a page</title>
<h1>kv.v1.Store over WebSocket</h1>
<form><input name="key" autofocus placeholder="key"> <button>GetMany</button></form>
<ol></ol>
<script type="module" src="/web-page.js"></script>`;

/** Bundles the page and serves it on `port` (0: any); resolves with the server and the page's URL for `wsUrl`. */
export async function serveWebExample(wsUrl: string, port = 8080): Promise<{ server: Server; url: string }> {
  const pkg = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
  const out = await build({ entryPoints: [join(pkg, "examples", "web-page.ts")], bundle: true, format: "esm", platform: "browser", target: "es2022", minify: true, write: false });
  const js = out.outputFiles[0]?.text ?? "";
  const server = createServer((req, res) => {
    if (req.url?.startsWith("/web-page.js")) res.writeHead(200, { "content-type": "text/javascript" }).end(js);
    else res.writeHead(200, { "content-type": "text/html" }).end(WEB_HTML);
  });
  await new Promise<void>((r) => server.listen(port, "127.0.0.1", r));
  const bound = (server.address() as { port: number }).port;
  return { server, url: `http://127.0.0.1:${bound}/?ws=${encodeURIComponent(wsUrl)}` };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { url } = await serveWebExample(process.argv[2] ?? "ws://127.0.0.1:50051/topspin", Number(process.argv[3] ?? 8080));
  console.log(`open ${url}`);
}
