// Output a peer does not read (protocol.md §7): the Node server bounds what it has produced for a
// connection and not yet written to it. A client sends many calls whose answers are large and
// does not read: the bytes the server queued for it (engine output + socket buffer, looked at
// inside the server) stay within the bound plus one answer; once the client reads, every call
// completes.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as net from "node:net";
import WebSocket from "ws";
import { Connection, WS_SUBPROTOCOL } from "../src/index.js";
import { Server } from "../src/node/index.js";
import type { Driver } from "../src/driver.js";

/** The most any connection of `server` has queued and not written (white-box: its drivers). */
function queued(server: Server): number {
  const conns = (server as unknown as { conns: Set<{ driver: Driver }> }).conns;
  let most = 0;
  for (const c of conns) most = Math.max(most, (c.driver.io.pending?.() ?? 0) + c.driver.engine.outputBytes);
  return most;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const CALLS = 400;
const ANSWER = 256 * 1024; // 400 answers: 100 MiB, far more than the kernel's socket buffers hold

/** A byte stream to the server that can stop reading: a TCP socket or a WebSocket. */
interface Pipe {
  write: (b: Uint8Array) => void;
  pause: () => void;
  resume: () => void;
  close: () => void;
}

async function open(addr: string, onData: (b: Uint8Array) => void): Promise<Pipe> {
  if (addr.startsWith("ws://")) {
    const ws = new WebSocket(addr, [WS_SUBPROTOCOL]);
    ws.on("message", (d: Buffer) => onData(d));
    await new Promise((r, j) => {
      ws.once("open", r);
      ws.once("error", j);
    });
    return { write: (b) => ws.send(b), pause: () => ws.pause(), resume: () => ws.resume(), close: () => ws.terminate() };
  }
  const sock = net.connect(Number(addr.split(":").pop()), "127.0.0.1");
  sock.on("data", (b: Buffer) => onData(b));
  await new Promise((r) => sock.once("connect", r));
  return { write: (b) => sock.write(b), pause: () => sock.pause(), resume: () => sock.resume(), close: () => sock.destroy() };
}

async function run(transport: "tcp" | "ws"): Promise<void> {
  let started = 0;
  const server = new Server({ maxSendBuffer: 1 << 20 }).route("/t.T/Big", {
    kind: "unary",
    decode: (b) => b,
    encode: (v) => v as Uint8Array,
    handler: () => {
      started++;
      return new Uint8Array(ANSWER).fill(1);
    },
  });
  const addr = await server.listen(transport === "tcp" ? "tcp://127.0.0.1:0" : "ws://127.0.0.1:0/topspin");
  const engine = new Connection("client");
  let ended = 0;
  let pipe: Pipe | null = null; // the server may speak first, before open() returns (ws://)
  const sock = await open(addr, (b) => {
    engine.receive(b);
    for (const e of engine.takeEvents()) if (e.type === "Ended" && e.code === 0) ended++;
    if (pipe !== null && engine.outputBytes > 0) pipe.write(Buffer.concat(engine.takeOutput()));
  });
  pipe = sock;
  try {
    sock.write(Buffer.concat(engine.takeOutput()));
    const until = Date.now() + 10_000;
    while (!engine.established && Date.now() < until) await sleep(5);
    assert.ok(engine.established, "handshake");
    // Every call at once, then no more reading.
    for (let i = 0; i < CALLS; i++) {
      const id = engine.startCall("/t.T/Big", 0, 0n, []);
      assert.ok(engine.sendMessage(id, new Uint8Array([i & 0xff]), true));
    }
    sock.pause();
    sock.write(Buffer.concat(engine.takeOutput()));
    // Without the bound the server queues every answer the kernel does not take: tens of MiB.
    let most = 0;
    for (let i = 0; i < 150; i++) {
      await sleep(10);
      most = Math.max(most, queued(server));
    }
    assert.ok(started > 0, "the calls ran");
    assert.ok(most <= (1 << 20) + ANSWER + 1024, `the server queued ${most} bytes for a client that reads nothing (bound 1 MiB + one answer)`);
    assert.ok(ended < CALLS, "the client has not read everything yet");
    sock.resume();
    const done = Date.now() + 30_000;
    while (ended < CALLS && Date.now() < done) await sleep(10);
    assert.equal(ended, CALLS, "every call completes once the client reads");
    assert.equal(started, CALLS);
  } finally {
    sock.close();
    await server.close(500);
  }
}

test("server over TCP: what it queues for a client that does not read stays within its bound (§7)", () => run("tcp"));
test("server over ws://: what it queues for a client that does not read stays within its bound (§7)", () => run("ws"));
