// Output a peer does not read (protocol.md §7), client side: a channel bounds what it has queued
// for sending and not yet handed to the network (`maxSendBuffer`). The server sits behind a TCP
// proxy that stops reading from the client: the client's queued bytes (engine output + socket
// buffer / WebSocket bufferedAmount, looked at inside the channel) stay within the bound plus one
// message, a client-streaming request iterable is not pulled further, a unary call with a
// deadline fails with DEADLINE_EXCEEDED while it waits for room, and once the proxy reads again
// every call completes. The last test does the same against the Rust server, stopped with SIGSTOP.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as net from "node:net";
import { Code, TopspinError, createClient, type Channel } from "../src/index.js";
import { Server, connect } from "../src/node/index.js";
import type { Driver } from "../src/driver.js";
import { Store } from "../gen/kv/v1/kv_pb.js";
import { kvStore } from "../examples/kvstore.js";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { binary, startServer, stop } from "./procs.js";

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const BOUND = 1 << 20;
const VALUE = 256 * 1024; // one Mutation: a bit over 256 KiB
const MUTATIONS = 200; // 50 MiB: far more than the kernel's socket buffers hold
const PUTS = 10;

/** What the channel has queued and not handed to the network (white-box: its driver). */
function queued(ch: Channel): number {
  const live = (ch as unknown as { live: { driver: Driver } | null }).live;
  if (live === null) return 0;
  return (live.driver.io.pending?.() ?? 0) + live.driver.engine.outputBytes;
}

/** A TCP proxy to `port` whose client → server direction can stop (the "server" stops reading). */
async function proxy(port: number): Promise<{ port: number; stop: () => void; go: () => void; close: () => void }> {
  const clients = new Set<net.Socket>();
  let stopped = false;
  const srv = net.createServer((c) => {
    clients.add(c);
    const up = net.connect(port, "127.0.0.1");
    c.on("data", (b: Buffer) => up.write(b));
    up.on("data", (b: Buffer) => c.write(b));
    c.on("close", () => up.destroy());
    up.on("close", () => c.destroy());
    c.on("error", () => undefined);
    up.on("error", () => undefined);
    if (stopped) c.pause();
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const addr = srv.address() as net.AddressInfo;
  return {
    port: addr.port,
    stop: () => {
      stopped = true;
      for (const c of clients) c.pause();
    },
    go: () => {
      stopped = false;
      for (const c of clients) c.resume();
    },
    close: () => {
      for (const c of clients) c.destroy();
      srv.close();
    },
  };
}

async function run(transport: "tcp" | "ws"): Promise<void> {
  // A large call window: without the bound, one request stream alone would queue everything.
  const server = new Server({ settings: { initialCallWindow: 64 << 20 } }).service(Store, kvStore());
  const addr = await server.listen(transport === "tcp" ? "tcp://127.0.0.1:0" : "ws://127.0.0.1:0/topspin");
  const port = Number(/:(\d+)/.exec(addr.replace(/^\w+:\/\//, ""))?.[1]);
  const px = await proxy(port);
  const ch = connect(transport === "tcp" ? `tcp://127.0.0.1:${px.port}` : `ws://127.0.0.1:${px.port}/topspin`, { maxSendBuffer: BOUND });
  const kv = createClient(Store, ch);
  try {
    await kv.put({ key: "warm", value: "up" }); // the connection is up
    px.stop();
    let pulled = 0;
    const value = "v".repeat(VALUE);
    function* mutations(): Generator<{ op: { case: "put"; value: { key: string; value: string } } }> {
      for (let i = 0; i < MUTATIONS; i++) {
        pulled++;
        yield { op: { case: "put", value: { key: `k${i}`, value } } };
      }
    }
    const apply = kv.apply(mutations());
    apply.catch(() => undefined);
    let most = 0;
    for (let i = 0; i < 100; i++) {
      await sleep(10);
      most = Math.max(most, queued(ch));
    }
    // Unary calls now: they wait for room; one with a deadline fails with DEADLINE_EXCEEDED.
    const puts = Array.from({ length: PUTS }, (_, i) => kv.put({ key: `p${i}`, value: "x".repeat(64 * 1024) }));
    await sleep(50);
    const live = (ch as unknown as { live: { calls: Map<number, unknown> } | null }).live;
    assert.equal(live?.calls.size, 1, "the unary calls wait for room before their CALL is queued (only Apply is open)");
    let putsDone = 0;
    for (const p of puts) p.then(() => putsDone++, () => undefined);
    const late = await kv.put({ key: "late", value: "y" }, { timeoutMs: 300 }).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(late instanceof TopspinError && late.code === Code.DEADLINE_EXCEEDED, `a start waiting for room past its deadline: ${String(late)}`);
    const pulledThen = pulled;
    for (let i = 0; i < 50; i++) {
      await sleep(10);
      most = Math.max(most, queued(ch));
    }
    assert.ok(most <= BOUND + VALUE + 4096, `the client queued ${most} bytes for a server that reads nothing (bound ${BOUND} + one message)`);
    assert.ok(pulled < MUTATIONS / 2, `the request iterable was pulled ${pulled} times of ${MUTATIONS} while nothing was read`);
    assert.equal(pulled, pulledThen, "the request iterable is not pulled while the output is full");
    assert.equal(putsDone, 0, "no unary call completes while the server reads nothing");
    px.go();
    const summary = await apply;
    assert.equal(summary.puts, MUTATIONS, "every mutation arrives once the server reads");
    await Promise.all(puts);
    assert.equal(putsDone, PUTS);
    assert.equal((await kv.get({ key: `k${MUTATIONS - 1}` })).value.length, VALUE);
  } finally {
    ch.close();
    px.close();
    await server.close(500);
  }
}

test("client over TCP: what it queues for a server that does not read stays within maxSendBuffer (§7)", () => run("tcp"));
test("client over ws://: what it queues for a server that does not read stays within maxSendBuffer (§7)", () => run("ws"));

// The same against the Rust kvstore-server over a Unix socket, the server stopped (SIGSTOP):
// many unary calls at once, each with its own call window, would queue everything without the
// bound; with it they wait for room, and complete once the server runs again (SIGCONT).
test("client over a Unix socket to a stopped Rust kvstore-server: queued bytes stay within maxSendBuffer (§7)", async () => {
  const path = join(mkdtempSync(join(tmpdir(), "topspin-ts-")), "kv.sock");
  const { proc } = await startServer(binary("KVSTORE_SERVER"), [`unix://${path}`]);
  const ch = connect(`unix://${path}`, { maxSendBuffer: BOUND });
  const kv = createClient(Store, ch);
  let stopped = false;
  try {
    await kv.put({ key: "warm", value: "up" });
    stopped = proc.kill("SIGSTOP");
    assert.ok(stopped, "SIGSTOP");
    const value = "w".repeat(VALUE);
    const calls = 120; // 30 MiB
    let done = 0;
    const puts = Array.from({ length: calls }, (_, i) => kv.put({ key: `u${i}`, value }).then(() => done++));
    let most = 0;
    for (let i = 0; i < 100; i++) {
      await sleep(10);
      most = Math.max(most, queued(ch));
    }
    assert.ok(most <= BOUND + VALUE + 4096, `the client queued ${most} bytes for a stopped server (bound ${BOUND} + one message)`);
    assert.equal(done, 0, "nothing completes while the server is stopped");
    proc.kill("SIGCONT");
    stopped = false;
    await Promise.all(puts);
    assert.equal(done, calls);
    assert.equal((await kv.get({ key: `u${calls - 1}` })).value.length, VALUE);
  } finally {
    if (stopped) proc.kill("SIGCONT");
    ch.close();
    await stop(proc);
  }
});
