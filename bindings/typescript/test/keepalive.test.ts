// Client keep-alive (protocol.md §5.9, §9): a PING after an interval of silence; a PING left
// unanswered closes the connection (ERROR TIMEOUT) and fails its calls with UNAVAILABLE. Tested
// through a proxy that can freeze (forward nothing more, either way) in front of the Node server,
// and against the Rust kvstore-server (whose PING budget an interval of 100 ms respects).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as net from "node:net";
import { Server, connect } from "../src/node/index.js";
import { Code, createClient } from "../src/index.js";
import { Store } from "../gen/kv/v1/kv_pb.js";
import { kvStore } from "../examples/kvstore.js";
import { failsWith } from "./suite.js";
import { binary, startServer, stop } from "./procs.js";

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const PING = 0x0a;

/** Frame types in a byte stream of whole frames (12-byte headers, §3). */
function frameTypes(b: Buffer): number[] {
  const types: number[] = [];
  for (let off = 0; off + 12 <= b.length; off += 12 + b.readUInt32LE(off)) types.push(b[off + 4] as number);
  return types;
}

/**
 * A TCP proxy to `target`. Once frozen it forwards nothing more either way and keeps what the
 * client sent after that in `clientAfterFreeze`.
 */
async function proxy(target: number): Promise<{ port: number; freeze: () => void; clientAfterFreeze: () => Buffer; clientClosed: Promise<void>; connections: () => number; pings: () => number; close: () => void }> {
  let frozen = false;
  let pings = 0;
  let after: Buffer[] = [];
  let count = 0;
  let closed!: () => void;
  const clientClosed = new Promise<void>((r) => (closed = r));
  const sockets: net.Socket[] = [];
  const srv = net.createServer((client) => {
    count++;
    const up = net.connect(target, "127.0.0.1");
    sockets.push(client, up);
    client.on("data", (d: Buffer) => {
      // a PING alone in a read (what an idle client sends); enough to count them
      if (d.length === 20 && d[4] === PING && d[5] === 0) pings++;
      if (frozen) after.push(d);
      else up.write(d);
    });
    up.on("data", (d: Buffer) => {
      if (!frozen) client.write(d);
    });
    client.on("close", () => {
      closed();
      up.destroy();
    });
    client.on("error", () => undefined);
    up.on("error", () => client.destroy());
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  return {
    port: (srv.address() as net.AddressInfo).port,
    freeze: () => {
      frozen = true;
      after = [];
    },
    clientAfterFreeze: () => Buffer.concat(after),
    clientClosed,
    connections: () => count,
    pings: () => pings,
    close: () => {
      for (const s of sockets) s.destroy();
      srv.close();
    },
  };
}

async function nodeServer(): Promise<{ server: Server; port: number }> {
  const server = new Server().service(Store, kvStore());
  const addr = await server.listen("tcp://127.0.0.1:0");
  return { server, port: Number(addr.split(":").pop()) };
}

test("keep-alive: a PING nobody answers closes the connection and fails its calls with UNAVAILABLE", async () => {
  const { server, port } = await nodeServer();
  const p = await proxy(port);
  const ch = connect(`tcp://127.0.0.1:${p.port}`, { keepalive: { intervalMs: 100, timeoutMs: 400 } });
  const kv = createClient(Store, ch);
  try {
    await kv.put({ key: "k", value: "v" });
    // A watch stays open and silent; then the network goes quiet (the proxy forwards nothing).
    const watching = (async () => {
      for await (const _ of kv.watch({ prefix: "nothing-here" })) assert.fail("no event expected");
    })();
    await sleep(50);
    p.freeze();
    const t0 = Date.now();
    const err = await failsWith(watching, Code.UNAVAILABLE);
    const took = Date.now() - t0;
    assert.match(err.rawMessage, /keep-alive PING unanswered for 400 ms/);
    // Not before the timeout; generously bounded above (interval + timeout, on a busy machine).
    assert.ok(took >= 350, `failed after ${took} ms, before the keep-alive timeout`);
    assert.ok(took < 10_000, `failed only after ${took} ms`);
    // The client sent a PING into the silence, then an ERROR, and closed its socket.
    await p.clientClosed;
    const types = frameTypes(p.clientAfterFreeze());
    assert.ok(types.includes(PING), `frames sent after the freeze: ${types.join(",")}`);
    assert.equal(types.filter((t) => t === PING).length, 1, "one PING while it waited for the answer");
    assert.equal(types.at(-1), 0x0c, "ERROR (TIMEOUT) last");
  } finally {
    ch.close();
    p.close();
    await server.close(500);
  }
});

test("keep-alive: answered PINGs keep an idle connection, the next call uses it", async () => {
  const { server, port } = await nodeServer();
  const p = await proxy(port);
  const ch = connect(`tcp://127.0.0.1:${p.port}`, { keepalive: { intervalMs: 100, timeoutMs: 5000 } });
  const kv = createClient(Store, ch);
  try {
    await kv.put({ key: "k", value: "v" });
    await sleep(1500); // many intervals of silence: PINGs, each answered
    assert.equal((await kv.get({ key: "k" })).value, "v");
    assert.equal(p.connections(), 1, "the same connection throughout");
    // Once per interval of silence at most (the tick after an answer sees it): 1500 ms / 100 ms
    // gives up to 7; at least 3 even on a slow machine — and never more than one per interval.
    assert.ok(p.pings() >= 3 && p.pings() <= 15, `${p.pings()} PINGs in 1.5 s`);
  } finally {
    ch.close();
    p.close();
    await server.close(500);
  }
});

test("keep-alive at 100 ms against the Rust kvstore-server: within its PING budget, the connection stays", async () => {
  const { proc, address } = await startServer(binary("KVSTORE_SERVER"), ["tcp://127.0.0.1:0"]);
  const target = Number(address.split(":").pop());
  const p = await proxy(target);
  const ch = connect(`tcp://127.0.0.1:${p.port}`, { keepalive: { intervalMs: 20, timeoutMs: 1000 } }); // raised to 100 ms
  const kv = createClient(Store, ch);
  try {
    await kv.put({ key: "ka", value: "1" });
    await sleep(3000); // 30 intervals: past the burst of 20, so the rate is what keeps it
    assert.equal((await kv.get({ key: "ka" })).value, "1");
    assert.equal(p.connections(), 1, "not closed for too_many_pings");
  } finally {
    ch.close();
    p.close();
    await stop(proc);
  }
});
