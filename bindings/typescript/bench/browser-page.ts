// The browser benchmark page (bundled with esbuild and loaded in headless Chromium by
// bench/browser.ts): the same echo, from the page, with topspin over the browser's WebSocket to
// the Node topspin server, and with connect-es (@connectrpc/connect-web: the Connect protocol
// over fetch, binary protobuf) to a Node connect server (connectNodeAdapter, HTTP/1.1 — a browser
// speaks HTTP/2 only over TLS). Results go to `window.__bench`.
import { createClient as createConnectClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { Channel, createClient, webSocketDialer } from "../src/index.js";
import { Echo } from "../gen/bench/v1/echo_pb.js";

/** One system's figures (µs; calls per second). */
export interface BrowserRow {
  name: string;
  small: { median: number; p99: number };
  big: { median: number; p99: number };
  tput: number;
}
declare global {
  interface Window {
    __bench?: { done: boolean; error?: string; isolated: boolean; rows: BrowserRow[]; counts: number[] };
  }
}

type EchoFn = (b: Uint8Array) => Promise<Uint8Array>;
const params = new URLSearchParams(location.search);
const N_SMALL = Number(params.get("small") ?? 2000);
const N_BIG = Number(params.get("big") ?? 30);
const N_TPUT = Number(params.get("tput") ?? 5000);
const out: NonNullable<Window["__bench"]> = { done: false, isolated: crossOriginIsolated, rows: [], counts: [N_SMALL, N_BIG, N_TPUT] };
window.__bench = out;

/** Each measurement stops after this long (ms), whatever its count. */
const CAP_MS = Number(params.get("capMs") ?? 5000);

async function latency(echo: EchoFn, size: number, max: number): Promise<{ median: number; p99: number }> {
  const msg = new Uint8Array(size).fill(7);
  for (let i = 0; i < Math.min(100, max / 10); i++) await echo(msg); // warm-up
  const all = new Float64Array(max);
  const until = performance.now() + CAP_MS;
  let n = 0;
  while (n < max && (n < 10 || performance.now() < until)) {
    const t = performance.now();
    const r = await echo(msg);
    all[n++] = (performance.now() - t) * 1000;
    if (r.length !== size) throw new Error(`echo of ${size} B came back as ${r.length} B`);
  }
  const times = all.subarray(0, n).sort();
  return { median: times[n >> 1] as number, p99: times[Math.floor(n * 0.99)] as number };
}

async function throughput(echo: EchoFn, max: number): Promise<number> {
  const msg = new Uint8Array(20).fill(7);
  let next = 0;
  const t = performance.now();
  const until = t + CAP_MS;
  await Promise.all(
    Array.from({ length: 64 }, async () => {
      while (next < max && performance.now() < until) {
        next++;
        await echo(msg);
      }
    }),
  );
  return next / ((performance.now() - t) / 1000);
}

async function run(name: string, echo: EchoFn): Promise<void> {
  const small = await latency(echo, 20, N_SMALL);
  const big = await latency(echo, 1 << 20, N_BIG);
  const tput = await throughput(echo, N_TPUT);
  out.rows.push({ name, small, big, tput });
  const p = document.createElement("p");
  p.textContent = `${name}: 20 B median ${small.median.toFixed(0)} µs, 1 MiB median ${big.median.toFixed(0)} µs, ${tput.toFixed(0)} calls/s`;
  document.body.appendChild(p);
}

try {
  const channel = new Channel({ dial: webSocketDialer(params.get("ws") ?? "") });
  const ts = createClient(Echo, channel);
  await run("topspin ws:// (browser WebSocket)", async (b) => (await ts.echo({ data: b })).data);
  channel.close();
  const cn = createConnectClient(Echo, createConnectTransport({ baseUrl: location.origin, useBinaryFormat: true }));
  await run("connect-web, Connect protocol (fetch, HTTP/1.1)", async (b) => (await cn.echo({ data: b })).data);
} catch (e) {
  out.error = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
}
out.done = true;
