// Calls pipelined by a client that never reads (attack 4 of scripts/attacks; the Rust server's
// rule, docs/hardening.md): once the connection's output is full, calls already read do not
// start, and the connection is not read any further — not even when the output drained to half
// its bound while calls read earlier still wait for room for their first answer. So what one
// connection makes the server hold is its output bound plus the calls of about one read, not
// every call it pipelines; a good client on another connection is served, and the never-reading
// connection is cut by the write timeout.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as net from "node:net";
import { Connection, HeldDuplex, PREFACE, encodeFrame } from "../src/index.js";
import { Server } from "../src/node/index.js";
import { Driver } from "../src/driver.js";
import { extensionHeader, goodClient, sleep, until } from "./hostile.js";

const CALLS = 1000; // within max_concurrent_calls (1,024)
/** Metadata that makes a call ~250 bytes: the 1,000 calls span several reads of the socket. */
const PAD = [{ key: "pad", value: "x".repeat(200) }];
/** Calls of one read (64 KiB) at most, with some slack. */
const ONE_READ = 300;
const ANSWER = 64 * 1024;
const BOUND = 1 << 20;
const WRITE_MS = 1500;

/** The connections of `server` (white-box: their drivers). */
function drivers(server: Server): Driver[] {
  return [...(server as unknown as { conns: Set<{ driver: Driver }> }).conns].map((c) => c.driver);
}

test("pipelined calls never read: no call starts and nothing more is read while earlier calls wait for room; cut at the write timeout", async () => {
  let started = 0; // handlers run
  let encoded = 0; // answers encoded
  const server = new Server({ maxSendBuffer: BOUND, writeTimeoutMs: WRITE_MS, grpc: false })
    .route("/t.T/Get", { kind: "unary", decode: (b) => b, encode: (v) => (encoded++, v as Uint8Array), handler: () => (started++, new Uint8Array(ANSWER).fill(7)) })
    .route("/t.T/Echo", { kind: "unary", decode: (b) => b, encode: (v) => v as Uint8Array, handler: (r) => r });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const engine = new Connection("client");
  const sock = net.connect(Number(addr.split(":").pop()), "127.0.0.1");
  let closed = false;
  sock.on("error", () => undefined);
  sock.on("close", () => (closed = true));
  sock.on("data", (b: Buffer) => {
    engine.receive(b);
    engine.takeEvents();
  });
  await new Promise((r) => sock.once("connect", r));
  const good = goodClient(addr, 400);
  const base = process.memoryUsage().arrayBuffers;
  try {
    sock.write(Buffer.concat(engine.takeOutput()));
    assert.ok(await until(() => engine.established), "handshake");
    sock.pause(); // never reads again
    // all at once: while the server does not read them they wait in the kernel's buffers
    for (let i = 0; i < CALLS; i++) engine.sendMessage(engine.startCall("/t.T/Get", 0, 0n, PAD), new Uint8Array([i & 0xff]), true);
    sock.write(Buffer.concat(engine.takeOutput()));
    let most = 0;
    for (let i = 0; i < 50; i++) {
      await sleep(10);
      most = Math.max(most, process.memoryUsage().arrayBuffers - base);
    }
    const attacker = drivers(server).find((d) => d.held > 0);
    assert.ok(attacker !== undefined, "the attacker's connection holds output");
    assert.ok(attacker.readsPaused, "the attacker's connection is not read");
    // The calls of the first read, not the 1,000 pipelined.
    assert.ok(started <= ONE_READ, `${started} of ${CALLS} pipelined calls started their handlers`);
    assert.ok(attacker.held <= BOUND + ANSWER, `${attacker.held} bytes held for the attacker (bound ${BOUND} + one answer)`);
    // what started holds its answer (64 KiB each): the calls of about one read
    assert.ok(most < ONE_READ * ANSWER + (4 << 20), `array buffers grew ${most} bytes`);
    assert.ok(await until(() => good.served() >= 20), "a good client on another connection is served meanwhile");
    const encodedBefore = encoded;
    assert.ok(await until(() => closed || drivers(server).length === 1, WRITE_MS + 5000), "the never-reading connection is cut at the write timeout");
    assert.ok(await until(() => drivers(server).length === 1, 2000), "only the good client's connection is left");
    // the calls that waited were cancelled with their connection: none encodes its answer now
    // (before: every waiting call encoded its answer for nobody, 1,000 x 1 MiB in attack 4)
    await sleep(100);
    assert.equal(encoded, encodedBefore, "answers encoded after the connection was cut");
    assert.ok((await good.stop()) >= 20);
  } finally {
    await good.stop().catch(() => undefined);
    sock.destroy();
    await server.close(200);
  }
});

test("after a resume, a peer that sends faster than one read a turn is taken faster: what is kept undecoded stays bounded", async () => {
  let pending = 0;
  let drained: (() => void) | null = null;
  let paused = false;
  const io = new HeldDuplex(
    () => undefined,
    () => undefined,
    { pending: () => pending, pause: () => (paused = true), resume: () => (paused = false), onDrain: (f) => (drained = f) },
  );
  const engine = new Connection("server");
  const driver = new Driver(engine, io, () => undefined, 1000);
  io.deliver(Buffer.concat([PREFACE, encodeFrame({ type: "SETTINGS", flags: 0, callId: 0, entries: [] })]));
  const chunk = Buffer.concat([extensionHeader(64 * 1024 - 12), Buffer.alloc(64 * 1024 - 12)]); // ignored frames
  pending = 2000; // the output is full: reading is held
  void driver.room();
  assert.ok(driver.readsPaused && paused, "reading held");
  io.deliver(chunk); // passed after the pause: kept
  pending = 0;
  (drained as (() => void) | null)?.(); // the output drained: reading resumes, one read a turn
  assert.ok(!driver.readsPaused, "reading resumed");
  for (let i = 0; i < 100; i++) io.deliver(chunk); // 6.4 MB at once
  await new Promise((r) => setImmediate(r));
  await new Promise((r) => setImmediate(r));
  const kept = (driver as unknown as { stash: Uint8Array[] }).stash.reduce((n, b) => n + b.length, 0);
  assert.ok(kept <= 256 * 1024 + chunk.length, `${kept} bytes kept undecoded`);
  assert.ok(!engine.closed, "the frames were fine");
  driver.abortIo();
});
