// The browser test page: bundled with esbuild and loaded in Chromium by browser/run.ts. It calls a
// Rust topspin kvstore server over ws:// with the browser's own WebSocket and records each check
// in `window.__results` (and on the page, for the screenshot).
import { Channel, Code, TopspinError, createClient, webSocketDialer } from "../src/index.js";
import { webCodecs } from "../src/compression.js";
import { Store } from "../gen/kv/v1/kv_pb.js";

interface Check {
  name: string;
  ok: boolean;
  detail: string;
}
declare global {
  interface Window {
    __results?: { done: boolean; checks: Check[] };
  }
}

const results: { done: boolean; checks: Check[] } = { done: false, checks: [] };
window.__results = results;
const list = document.getElementById("checks") as HTMLElement;

async function check(name: string, f: () => Promise<string>): Promise<void> {
  let c: Check;
  try {
    c = { name, ok: true, detail: await f() };
  } catch (e) {
    c = { name, ok: false, detail: e instanceof Error ? `${e.name}: ${e.message}` : String(e) };
  }
  results.checks.push(c);
  const li = document.createElement("li");
  li.textContent = `${c.ok ? "✔" : "✘"} ${c.name}: ${c.detail}`;
  li.style.color = c.ok ? "green" : "red";
  list.appendChild(li);
}

function expect(cond: boolean, what: string): void {
  if (!cond) throw new Error(`expected ${what}`);
}

async function code(p: Promise<unknown>): Promise<Code> {
  try {
    await p;
  } catch (e) {
    if (e instanceof TopspinError) return e.code;
    throw e;
  }
  throw new Error("the call succeeded");
}

async function main(): Promise<void> {
  const url = new URLSearchParams(location.search).get("ws") ?? "";
  document.getElementById("url")!.textContent = url;
  const channel = new Channel({ dial: webSocketDialer(url) });
  const kv = createClient(Store, channel);

  await check("unary Put/Get", async () => {
    const v = await kv.put({ key: "web/a", value: "1" }, { timeoutMs: 5000 });
    const e = await kv.get({ key: "web/a" });
    expect(e.value === "1" && v.version === e.version, "the value back");
    return `version ${e.version}`;
  });
  await check("error status NOT_FOUND", async () => {
    const c = await code(kv.get({ key: "web/missing" }));
    expect(c === Code.NOT_FOUND, `NOT_FOUND, got ${Code[c]}`);
    return "NOT_FOUND";
  });
  await check("client streaming Apply", async () => {
    const s = await kv.apply(
      (async function* () {
        await new Promise((r) => setTimeout(r, 1));
        yield { op: { case: "put" as const, value: { key: "web/b", value: "2" } } };
        yield { op: { case: "put" as const, value: { key: "web/c", value: "3" } } };
        yield { op: { case: "delete" as const, value: { key: "web/c" } } };
      })(),
    );
    expect(s.puts === 2 && s.deletes === 1, "2 puts, 1 delete");
    return `${s.puts} puts, ${s.deletes} deletes`;
  });
  await check("bidi GetMany as an echo chat", async () => {
    let gate: () => void = () => undefined;
    const said = ["web/a", "web/b", "web/a", "web/b"];
    const heard: string[] = [];
    const talk = (async function* () {
      for (const key of said) {
        const answered = new Promise<void>((r) => (gate = r));
        yield { key };
        await answered; // wait for the answer before saying the next thing
      }
    })();
    for await (const e of kv.getMany(talk)) {
      heard.push(e.value);
      gate();
    }
    expect(heard.join() === "1,2,1,2", `1,2,1,2, got ${heard.join()}`);
    return heard.join(" ");
  });
  await check("server streaming Watch, then cancel with AbortSignal", async () => {
    const ac = new AbortController();
    const seen: string[] = [];
    const c = await code(
      (async () => {
        for await (const ev of kv.watch({ prefix: "web/", includeExisting: true }, { signal: ac.signal })) {
          if (ev.kind.case === "put") seen.push(ev.kind.value.key);
          if (seen.length === 2) await kv.put({ key: "web/live", value: "L" });
          if (seen.length === 3) ac.abort();
        }
      })(),
    );
    expect(c === Code.CANCELLED, `CANCELLED, got ${Code[c]}`);
    expect(seen.join() === "web/a,web/b,web/live", `three events, got ${seen.join()}`);
    return `${seen.join(" ")}, then CANCELLED`;
  });
  await check("deadline", async () => {
    const t = performance.now();
    const c = await code(
      (async () => {
        for await (const _ of kv.watch({ prefix: "web/none/" }, { timeoutMs: 300 })) throw new Error("no event expected");
      })(),
    );
    const ms = performance.now() - t;
    expect(c === Code.DEADLINE_EXCEEDED, `DEADLINE_EXCEEDED, got ${Code[c]}`);
    expect(ms >= 250, `not before the deadline (${ms} ms)`);
    return `DEADLINE_EXCEEDED after ${Math.round(ms)} ms`;
  });
  await check("1 MiB message each way", async () => {
    const big = "z".repeat(1 << 20);
    await kv.put({ key: "web/big", value: big });
    const e = await kv.get({ key: "web/big" });
    expect(e.value === big, "the 1 MiB value back");
    return `${e.value.length} bytes`;
  });
  await check("1 MiB gzip-compressed with CompressionStream (per call)", async () => {
    const gz = createClient(Store, new Channel({ dial: webSocketDialer(url), codecs: webCodecs }));
    const big = "g".repeat(1 << 20);
    await gz.put({ key: "web/gz", value: big }, { compression: "gzip" });
    const e = await gz.get({ key: "web/gz" }, { compression: "gzip" });
    expect(e.value === big, "the 1 MiB value back");
    return `${e.value.length} bytes`;
  });
  await check("maxSendBuffer: queued output stays within the bound (bufferedAmount polled)", async () => {
    const bound = 256 * 1024;
    const ch = new Channel({ dial: webSocketDialer(url), maxSendBuffer: bound });
    const bk = createClient(Store, ch);
    await bk.put({ key: "web/warm", value: "up" });
    const value = "b".repeat(256 * 1024);
    const queued = (): { bytes: number; socket: number } => {
      const live = (ch as unknown as { live: { driver: { io: { pending?: () => number }; engine: { outputBytes: number } } } | null }).live;
      const socket = live?.driver.io.pending?.() ?? 0;
      return { bytes: socket + (live?.driver.engine.outputBytes ?? 0), socket };
    };
    let most = 0;
    let mostSocket = 0;
    let running = true;
    const sampler = (async () => {
      while (running) {
        const q = queued();
        most = Math.max(most, q.bytes);
        mostSocket = Math.max(mostSocket, q.socket);
        await new Promise((r) => setTimeout(r, 0));
      }
    })();
    const n = 40; // 10 MiB at once
    await Promise.all(Array.from({ length: n }, (_, i) => bk.put({ key: `web/bp${i}`, value })));
    running = false;
    await sampler;
    const e = await bk.get({ key: `web/bp${n - 1}` });
    ch.close();
    expect(e.value.length === value.length, "the last value back");
    expect(most <= bound + value.length + 4096, `at most ${bound} + one message queued, saw ${most}`);
    return `${n} puts of 256 KiB; most queued ${most} bytes (bufferedAmount up to ${mostSocket}), bound ${bound}`;
  });
  await check("the connection is still healthy", async () => {
    const e = await kv.get({ key: "web/b" });
    expect(e.value === "2", "web/b = 2");
    return "ok";
  });
  channel.close();
  results.done = true;
  document.getElementById("status")!.textContent = results.checks.every((c) => c.ok) ? "ALL PASSED" : "FAILED";
}

void main().catch((e: unknown) => {
  results.checks.push({ name: "page", ok: false, detail: String(e) });
  results.done = true;
});
