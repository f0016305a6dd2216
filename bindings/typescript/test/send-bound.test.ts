// The send bound holds what is produced, not only what is queued (protocol.md §7, the Rust
// server's `max_send_buffer`): a client pipelines many calls for a large answer and never reads.
// The answers the server has produced (encoded) and the network has not taken stay within the
// bound plus one answer — calls already read wait for room before their answers are encoded —
// while a good client on another connection is served.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as net from "node:net";
import WebSocket from "ws";
import { Connection, WS_SUBPROTOCOL } from "../src/index.js";
import { Server } from "../src/node/index.js";
import type { Driver } from "../src/driver.js";
import { goodClient, sleep, until } from "./hostile.js";

const CALLS = 300;
const ANSWER = 256 * 1024;
const BOUND = 1 << 20;

/** The bytes the network took from the connections of `server` (white-box: their drivers). */
function taken(server: Server): number {
  const conns = (server as unknown as { conns: Set<{ driver: Driver }> }).conns;
  let n = 0;
  for (const c of conns) n += c.driver.taken;
  return n;
}

/** A byte stream to the server that can stop reading: a TCP or Unix socket, or a WebSocket. */
interface Pipe {
  write: (b: Uint8Array) => void;
  pause: () => void;
  destroy: () => void;
}

async function open(addr: string, onData: (b: Uint8Array) => void): Promise<Pipe> {
  if (addr.startsWith("ws://")) {
    const ws = new WebSocket(addr, [WS_SUBPROTOCOL]);
    ws.on("message", (d: Buffer) => onData(d));
    await new Promise((r, j) => {
      ws.once("open", r);
      ws.once("error", j);
    });
    return { write: (b) => ws.send(b), pause: () => ws.pause(), destroy: () => ws.terminate() };
  }
  const sock = addr.startsWith("unix://") ? net.connect({ path: addr.slice(7) }) : net.connect(Number(addr.split(":").pop()), "127.0.0.1");
  sock.on("error", () => undefined);
  sock.on("data", (b: Buffer) => onData(b));
  await new Promise((r) => sock.once("connect", r));
  return { write: (b) => sock.write(b), pause: () => sock.pause(), destroy: () => sock.destroy() };
}

async function run(addr: (srv: Server) => Promise<string>): Promise<void> {
  const value = new Uint8Array(ANSWER).fill(7); // one stored value, shared (as kvstore's Get)
  let produced = 0; // bytes of answers encoded (each a copy, as protobuf's toBinary)
  const server = new Server({ maxSendBuffer: BOUND, grpc: false })
    .route("/t.T/Get", { kind: "unary", decode: (b) => b, encode: (v) => ((produced += (v as Uint8Array).length), (v as Uint8Array).slice()), handler: () => value })
    .route("/t.T/Echo", { kind: "unary", decode: (b) => b, encode: (v) => v as Uint8Array, handler: (r) => r });
  const where = await addr(server);
  const engine = new Connection("client");
  const sock = await open(where, (b) => {
    engine.receive(b);
    engine.takeEvents();
  });
  // the good client on a native listener (goodClient speaks tcp:// and unix://)
  const good = goodClient(where.startsWith("ws://") ? await server.listen("tcp://127.0.0.1:0") : where, 200);
  try {
    sock.write(Buffer.concat(engine.takeOutput()));
    assert.ok(await until(() => engine.established), "handshake");
    for (let i = 0; i < CALLS; i++) {
      const id = engine.startCall("/t.T/Get", 0, 0n, []);
      assert.ok(engine.sendMessage(id, new Uint8Array([i & 0xff]), true));
    }
    sock.pause();
    sock.write(Buffer.concat(engine.takeOutput()));
    let most = 0;
    for (let i = 0; i < 100; i++) {
      await sleep(10);
      // produced and not taken by the network: held by the server (the good client's bytes are tiny)
      most = Math.max(most, produced - taken(server));
    }
    assert.ok(produced > 0, "answers were produced");
    assert.ok(most <= BOUND + ANSWER + 64 * 1024, `the server held ${most} bytes of answers for a client that reads nothing (bound ${BOUND} + one answer)`);
    assert.ok(await until(() => good.served() >= 20), "a good client on another connection is served meanwhile");
    assert.ok((await good.stop()) >= 20);
  } finally {
    sock.destroy();
    await server.close(200);
  }
}

test("send bound over TCP: answers are not produced while the peer does not read (held <= max_send_buffer + one answer)", () =>
  run((s) => s.listen("tcp://127.0.0.1:0")));
test("send bound over Unix: answers are not produced while the peer does not read (held <= max_send_buffer + one answer)", () =>
  run(async (s) => {
    const path = `/tmp/topspin-send-bound-${process.pid}.sock`;
    return s.listen(`unix://${path}`);
  }));
test("send bound over ws://: answers are not produced while the peer does not read (held <= max_send_buffer + one answer)", () =>
  run((s) => s.listen("ws://127.0.0.1:0/topspin")));
