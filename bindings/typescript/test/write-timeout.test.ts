// The write timeout (the Rust server's write_timeout; docs/hardening.md): a client that asks for
// large answers and then reads nothing is cut once its socket took none of our bytes for
// `writeTimeoutMs` — its connection closed at once, its open calls cancelled — over TCP and
// ws://, while a good client is served throughout; a client that reads slowly stays.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as net from "node:net";
import WebSocket from "ws";
import { Code, Connection, TopspinError, WS_SUBPROTOCOL } from "../src/index.js";
import { Server } from "../src/node/index.js";
import { goodClient, sleep, until } from "./hostile.js";

const ANSWER = 256 * 1024;
const CALLS = 200; // 50 MiB of answers: far more than the kernel's socket buffers hold
const WRITE_MS = 500;

/** A byte stream to the server that can stop reading. */
interface Pipe {
  write: (b: Uint8Array) => void;
  pause: () => void;
  resume: () => void;
  close: () => void;
  closed: () => boolean;
}

async function open(addr: string, onData: (b: Uint8Array) => void): Promise<Pipe> {
  let closed = false;
  if (addr.startsWith("ws://")) {
    const ws = new WebSocket(addr, [WS_SUBPROTOCOL]);
    ws.on("message", (d: Buffer) => onData(d));
    ws.on("error", () => undefined);
    ws.on("close", () => (closed = true));
    await new Promise((r, j) => {
      ws.once("open", r);
      ws.once("error", j);
    });
    return { write: (b) => ws.send(b), pause: () => ws.pause(), resume: () => ws.resume(), close: () => ws.terminate(), closed: () => closed };
  }
  const sock = net.connect(Number(addr.split(":").pop()), "127.0.0.1");
  sock.on("data", (b: Buffer) => onData(b));
  sock.on("error", () => undefined);
  sock.on("close", () => (closed = true));
  await new Promise((r) => sock.once("connect", r));
  return { write: (b) => sock.write(b), pause: () => sock.pause(), resume: () => sock.resume(), close: () => sock.destroy(), closed: () => closed };
}

/** A server with `/t.T/Big` (a 256 KiB answer), `/t.T/Echo`, and `/t.T/Hang` (ends when cancelled, recording why). */
function server(why: TopspinError[]): Server {
  const id = { kind: "unary" as const, decode: (b: Uint8Array) => b, encode: (v: unknown) => v as Uint8Array };
  return new Server({ writeTimeoutMs: WRITE_MS, maxSendBuffer: 1 << 20 })
    .route("/t.T/Big", { ...id, handler: () => new Uint8Array(ANSWER).fill(1) })
    .route("/t.T/Echo", { ...id, handler: (r) => r })
    .route("/t.T/Hang", {
      ...id,
      handler: (_r, ctx) =>
        new Promise((resolve) =>
          ctx.signal.addEventListener("abort", () => {
            why.push(TopspinError.from(ctx.signal.reason));
            resolve(new Uint8Array(0));
          }),
        ),
    });
}

/** Connections the server is serving (white-box). */
const open_ = (s: Server): number => (s as unknown as { conns: Set<unknown> }).conns.size;

/** Handshakes `pipe`'s engine and starts `Hang` ×3 and `Big` × CALLS on it. */
async function attack(pipe: Pipe, engine: Connection): Promise<void> {
  pipe.write(Buffer.concat(engine.takeOutput()));
  assert.ok(await until(() => engine.established), "handshake");
  for (let i = 0; i < 3; i++) engine.sendMessage(engine.startCall("/t.T/Hang", 0, 0n, []), new Uint8Array([1]), true);
  for (let i = 0; i < CALLS; i++) engine.sendMessage(engine.startCall("/t.T/Big", 0, 0n, []), new Uint8Array([i & 0xff]), true);
  pipe.write(Buffer.concat(engine.takeOutput()));
}

async function run(transport: "tcp" | "ws"): Promise<void> {
  const why: TopspinError[] = [];
  const srv = server(why);
  const addr = await srv.listen(transport === "tcp" ? "tcp://127.0.0.1:0" : "ws://127.0.0.1:0/t");
  const goodAddr = transport === "tcp" ? addr : await srv.listen("tcp://127.0.0.1:0");
  const good = goodClient(goodAddr);
  let pipe: Pipe | null = null;
  const engine = new Connection("client");
  let received = 0;
  try {
    pipe = await open(addr, (b) => {
      received += b.length;
      engine.receive(b);
      engine.takeEvents();
      if (pipe !== null && engine.outputBytes > 0) pipe.write(Buffer.concat(engine.takeOutput()));
    });
    await attack(pipe, engine);
    assert.ok(await until(() => received > 1 << 20), "answers flow");
    pipe.pause(); // and never read again
    const t0 = Date.now();
    const before = open_(srv);
    // Cut within the timeout plus its checks (a quarter of it) and the kernel's buffers filling.
    assert.ok(await until(() => why.length === 3, 10_000), `the open calls were cancelled (${why.length} of 3)`);
    const took = Date.now() - t0;
    assert.ok(took >= WRITE_MS, `cut after ${took} ms, not before the ${WRITE_MS} ms timeout`);
    for (const e of why) {
      assert.equal(e.code, Code.UNAVAILABLE);
      assert.match(e.rawMessage, /write_timeout/);
    }
    assert.ok(await until(() => open_(srv) === before - 1, 2000), "the connection is gone");
    pipe.resume();
    assert.ok(await until(() => pipe?.closed() === true, 5000), "the client sees the connection closed");
    assert.ok((await good.stop()) > 0, "the good client was served");
  } finally {
    await good.stop().catch(() => undefined);
    pipe?.close();
    await srv.close(200);
  }
}

test("write timeout over TCP: a client that reads nothing is cut, its calls cancelled; a good client is served", () => run("tcp"));
test("write timeout over ws://: a client that reads nothing is cut, its calls cancelled; a good client is served", () => run("ws"));

test("write timeout: a client that reads slowly (a bit every 200 ms) is not cut", async () => {
  const why: TopspinError[] = [];
  const srv = server(why);
  const addr = await srv.listen("tcp://127.0.0.1:0");
  const engine = new Connection("client");
  let pipe: Pipe | null = null;
  let ended = 0;
  try {
    pipe = await open(addr, (b) => {
      engine.receive(b);
      for (const e of engine.takeEvents()) if (e.type === "Ended" && e.code === 0) ended++;
      if (pipe !== null && engine.outputBytes > 0) pipe.write(Buffer.concat(engine.takeOutput()));
    });
    await attack(pipe, engine);
    // paused most of the time, reading for 5 ms every 200 ms: each pause is under the timeout
    const until_ = Date.now() + 20_000;
    while (ended < CALLS && Date.now() < until_) {
      pipe.pause();
      await sleep(200);
      pipe.resume();
      await sleep(5);
    }
    pipe.resume();
    assert.equal(why.length, 0, `no call cancelled: ${why.map((e) => e.rawMessage).join("; ")}`);
    assert.ok(await until(() => ended === CALLS, 20_000), `every answer arrives (${ended} of ${CALLS})`);
    assert.ok(!pipe.closed());
  } finally {
    pipe?.close();
    await srv.close(200);
  }
});
