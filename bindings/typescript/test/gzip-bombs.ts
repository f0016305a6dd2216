// Helpers of the gzip-bomb tests of the gRPC face (grpc-gzip*.test.ts): the bombs, a server
// whose handlers hold requests a while, a raw HTTP/2 gRPC call and an RSS sampler.
import assert from "node:assert/strict";
import * as http2 from "node:http2";
import { deflateSync, gzipSync } from "node:zlib";
import { MemoryBudget } from "../src/index.js";
import { Server } from "../src/node/index.js";
import { grpcClient, unaryRaw } from "./grpc-helpers.js";
import { sleep, until } from "./hostile.js";

export const MiB = 1 << 20;
export const BUDGET = 64 * MiB;
/** What the process may grow by over its RSS before the attack: the budget + 64 MiB (the rule of docs/hardening.md). */
export const SLACK = 64 * MiB;
/** One bomb: 16 MiB of zeros, gzip level 9 (~16 KiB). */
export const INFLATED = 16 * MiB;
const zeros = Buffer.alloc(INFLATED);
export const bomb = gzipSync(zeros, { level: 9 });
export const deflateBomb = deflateSync(zeros, { level: 9 });

export const count = (n: number): Uint8Array => {
  const b = new Uint8Array(4);
  new DataView(b.buffer).setUint32(0, n);
  return b;
};

/** A server whose handlers hold each request a while (as a handler whose answer waits for the peer's window). */
export function server(budget: MemoryBudget): Server {
  return new Server({ memoryBudget: budget, settings: { maxMessageSize: 32 * MiB } })
    .route("/t.T/Echo", { kind: "unary", decode: (b) => b, encode: (v) => v as Uint8Array, handler: (v) => v })
    .route("/t.T/Hold", {
      kind: "unary",
      decode: (b) => b,
      encode: (v) => v as Uint8Array,
      handler: async (v) => {
        await sleep(300);
        return count((v as Uint8Array).length);
      },
    })
    .route("/t.T/Count", {
      kind: "client_streaming",
      decode: (b) => b,
      encode: (v) => v as Uint8Array,
      handler: async (reqs) => {
        let n = 0;
        for await (const r of reqs as AsyncIterable<Uint8Array>) {
          assert.equal(r.length, INFLATED);
          n++;
          await sleep(20);
        }
        return count(n);
      },
    });
}

/** The process's RSS, sampled every 5 ms: the peak since `start`. */
export function rssPeak(): { stop: () => number } {
  let peak = process.memoryUsage.rss();
  const t = setInterval(() => (peak = Math.max(peak, process.memoryUsage.rss())), 5);
  return {
    stop: () => {
      clearInterval(t);
      return Math.max(peak, process.memoryUsage.rss());
    },
  };
}

/** The 5-byte gRPC prefix of a compressed message of `n` bytes, and the message. */
export const framed = (body: Buffer): Buffer => {
  const p = Buffer.alloc(5);
  p[0] = 1;
  p.writeUInt32BE(body.length, 1);
  return Buffer.concat([p, body]);
};

/** One raw HTTP/2 gRPC call sending `msgs` (compressed with `encoding`); its status and answer. */
export function call(h2: http2.ClientHttp2Session, path: string, msgs: Buffer[], encoding = "gzip"): Promise<{ status: number; message: string; body: Buffer }> {
  return new Promise((resolve) => {
    const s = h2.request({ ":method": "POST", ":path": path, "content-type": "application/grpc", te: "trailers", "grpc-encoding": encoding });
    const chunks: Buffer[] = [];
    let status = -1;
    let message = "";
    const take = (h: http2.IncomingHttpHeaders): void => {
      if (h["grpc-status"] === undefined) return;
      status = Number(h["grpc-status"]);
      message = decodeURIComponent(String(h["grpc-message"] ?? ""));
    };
    s.on("response", take);
    s.on("trailers", take);
    s.on("data", (b: Buffer) => chunks.push(b));
    s.on("error", () => undefined);
    s.on("close", () => resolve({ status, message, body: Buffer.concat(chunks) }));
    for (const m of msgs) s.write(m);
    s.end();
  });
}

/**
 * Runs `attack` against a server with a {@link BUDGET} budget while a good gRPC client is on
 * it: RSS measured from just before (after a collection, if `--expose-gc`); afterwards the
 * budget must be given back and the good client served. Returns what `attack` returned and how
 * much the RSS grew at its peak.
 */
export async function underAttack<T>(attack: (h2: http2.ClientHttp2Session) => Promise<T>): Promise<{ result: T; grew: number }> {
  const budget = new MemoryBudget(BUDGET);
  const srv = server(budget);
  const addr = await srv.listen("tcp://127.0.0.1:0");
  const good = grpcClient(addr);
  const h2 = http2.connect(`http://127.0.0.1:${addr.split(":").pop()}`);
  h2.on("error", () => undefined);
  try {
    assert.equal((await unaryRaw(good, "/t.T/Echo", new Uint8Array([1]))).value[0], 1);
    globalThis.gc?.();
    const before = process.memoryUsage.rss();
    const peak = rssPeak();
    const result = await attack(h2);
    const grew = peak.stop() - before;
    assert.ok(grew <= BUDGET + SLACK, `RSS grew ${(grew / MiB).toFixed(1)} MiB, over the budget + 64 MiB`);
    assert.ok(await until(() => budget.used === 0, 2000), `budget given back (${budget.used} held)`);
    assert.equal((await unaryRaw(good, "/t.T/Echo", new Uint8Array([2]))).value[0], 2, "a good client is served");
    return { result, grew };
  } finally {
    h2.destroy();
    good.close();
    await srv.close(200);
  }
}
