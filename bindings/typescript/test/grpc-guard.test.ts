// The gRPC face's bounds beyond grpc-js's own (the Rust gRPC face's rules, docs/hardening.md):
// request messages under way charged to the memory budget, a connection held to its share of it
// (its streams' windows withheld past it), a request message that stops arriving cut after the
// frame timeout, a peer that never reads cut at the write timeout — each while a good gRPC
// client is served.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as http2 from "node:http2";
import * as net from "node:net";
import { MemoryBudget } from "../src/index.js";
import { Server } from "../src/node/index.js";
import { grpcClient, unaryRaw } from "./grpc-helpers.js";
import { sleep, until } from "./hostile.js";

const MiB = 1 << 20;
/** Streams of the partial-message attack: their paused windows may spend the connection's. */
const STREAMS = 16;

function server(opts: ConstructorParameters<typeof Server>[0]): Server {
  return new Server(opts)
    .route("/t.T/Echo", { kind: "unary", decode: (b) => b, encode: (v) => v as Uint8Array, handler: (v) => v })
    .route("/t.T/Big", { kind: "unary", decode: (b) => b, encode: (v) => v as Uint8Array, handler: () => new Uint8Array(8 * MiB).fill(3) });
}

/** The 5-byte gRPC message prefix announcing `n` bytes (not compressed). */
function prefix(n: number): Buffer {
  const b = Buffer.alloc(5);
  b.writeUInt32BE(n, 1);
  return b;
}

test("gRPC face: request messages under way are charged, one connection held to its share, stalled ones cut at the frame timeout", async () => {
  const budget = new MemoryBudget(16 * MiB); // a connection's share: 2 MiB
  const srv = server({ memoryBudget: budget, frameTimeoutMs: 400 });
  const addr = await srv.listen("tcp://127.0.0.1:0");
  const good = grpcClient(addr);
  const h2 = http2.connect(`http://127.0.0.1:${addr.split(":").pop()}`);
  h2.on("error", () => undefined);
  const streams: http2.ClientHttp2Stream[] = [];
  const body = Buffer.alloc(3 * MiB, 1);
  try {
    for (let i = 0; i < STREAMS; i++) {
      const s = h2.request({ ":method": "POST", ":path": "/t.T/Echo", "content-type": "application/grpc", te: "trailers" });
      s.on("error", () => undefined);
      s.write(prefix(6 * MiB));
      s.write(body); // 3 of the 6 MiB announced, then nothing more
      streams.push(s);
    }
    await sleep(600);
    const sent = streams.reduce((n, s) => n + 5 + body.length - s.writableLength, 0);
    const used = budget.used;
    // what arrived of the messages is charged (before: nothing, grpc-js held it outside the budget)
    assert.ok(used >= 2 * MiB, `charged ${used} bytes`);
    // past the share (2 MiB) the other streams' windows are withheld: the one that goes on, the
    // share and a window per stream, not the 48 MiB the client has to send
    assert.ok(sent <= 2 * MiB + body.length + STREAMS * 256 * 1024, `the client got ${sent} bytes through`);
    assert.equal((await unaryRaw(good, "/t.T/Echo", new Uint8Array([5]))).value[0], 5, "a good client is served");
    // stalled: reset once the frame timeout passes while they are read (the paused ones once
    // resumed: the one that went on is reset first, then the others are under the share)
    assert.ok(await until(() => streams.every((s) => s.closed), 20_000), `streams reset: ${streams.filter((s) => s.closed).length} of ${STREAMS}`);
    for (const s of streams) assert.equal(s.rstCode, http2.constants.NGHTTP2_CANCEL);
    assert.ok(await until(() => budget.used === 0, 2000), `budget given back (${budget.used} held)`);
    assert.equal((await unaryRaw(good, "/t.T/Echo", new Uint8Array([6]))).value[0], 6);
  } finally {
    for (const s of streams) s.destroy();
    h2.destroy();
    good.close();
    await srv.close(200);
  }
});

/** An HPACK literal header field without indexing, new name, no Huffman (RFC 7541 §6.2.2); names and values under 127 bytes. */
function literal(name: string, value: string): Buffer {
  return Buffer.concat([Buffer.from([0, name.length]), Buffer.from(name), Buffer.from([value.length]), Buffer.from(value)]);
}

/** An HTTP/2 frame (RFC 9113 §4.1). */
function frame(type: number, flags: number, stream: number, payload: Buffer): Buffer {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(stream, 5);
  return Buffer.concat([h, payload]);
}

/** Bytes of a raw HTTP/2 client: preface, SETTINGS INITIAL_WINDOW_SIZE `window` (and the connection's window opened as far), then `calls` unary calls of `path` with a 1-byte request. */
function rawCalls(window: number, path: string, calls: number): Buffer {
  const settings = Buffer.alloc(6);
  settings.writeUInt16BE(4, 0); // INITIAL_WINDOW_SIZE
  settings.writeUInt32BE(window, 2);
  const out = [Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), frame(4, 0, 0, settings)];
  if (window > 65_535) {
    const update = Buffer.alloc(4);
    update.writeUInt32BE(window - 65_535, 0);
    out.push(frame(8, 0, 0, update));
  }
  for (let i = 0, id = 1; i < calls; i++, id += 2) {
    const head = [literal(":method", "POST"), literal(":scheme", "http"), literal(":path", path), literal(":authority", "x"), literal("content-type", "application/grpc"), literal("te", "trailers")];
    out.push(frame(1, 4, id, Buffer.concat(head)), frame(0, 1, id, Buffer.concat([prefix(1), Buffer.from([0])])));
  }
  return Buffer.concat(out);
}

test("gRPC face: a client that opens its windows, asks for 8 MiB answers and never reads is cut at the write timeout", async () => {
  const srv = server({ writeTimeoutMs: 500 });
  const addr = await srv.listen("tcp://127.0.0.1:0");
  const good = grpcClient(addr);
  assert.equal((await unaryRaw(good, "/t.T/Echo", new Uint8Array([6]))).value[0], 6, "the good client connects");
  const sock = net.connect(Number(addr.split(":").pop()), "127.0.0.1");
  sock.on("error", () => undefined);
  let closed = false;
  sock.on("close", () => (closed = true));
  try {
    await new Promise((r) => sock.once("connect", r));
    sock.write(rawCalls(2 ** 31 - 1, "/t.T/Big", 4));
    sock.pause(); // and never reads: 32 MiB of answers, more than the kernel's buffers
    const face = (srv as unknown as { face: { sockets: Set<unknown> } }).face;
    assert.ok(await until(() => face.sockets.size === 2, 2000), "both connected");
    const t0 = Date.now();
    assert.ok(await until(() => face.sockets.size === 1, 10_000), "the server closed the connection");
    assert.ok(Date.now() - t0 >= 400, `cut after ${Date.now() - t0} ms, not before the write timeout`);
    sock.resume(); // what was in flight, then the end
    assert.ok(await until(() => closed, 5000), "the client sees the connection closed");
    assert.equal((await unaryRaw(good, "/t.T/Echo", new Uint8Array([7]))).value[0], 7, "a good client is served");
  } finally {
    sock.destroy();
    good.close();
    await srv.close(200);
  }
});

test("gRPC face: a client that grants no window (INITIAL_WINDOW_SIZE 0) and asks for 40 answers of 8 MiB is held to the send buffer", async () => {
  let encoded = 0;
  const value = new Uint8Array(8 * MiB).fill(3); // one stored value (as kvstore's Get); each answer a copy
  const srv = server({ maxSendBuffer: 4 * MiB }).route("/t.T/Big", {
    kind: "unary",
    decode: (b) => b,
    encode: (v) => (encoded++, (v as Uint8Array).slice()),
    handler: () => value,
  });
  const addr = await srv.listen("tcp://127.0.0.1:0");
  const good = grpcClient(addr);
  assert.equal((await unaryRaw(good, "/t.T/Echo", new Uint8Array([6]))).value[0], 6, "the good client connects");
  const sock = net.connect(Number(addr.split(":").pop()), "127.0.0.1");
  sock.on("error", () => undefined);
  sock.on("data", () => undefined); // reads, but grants no window: no answer can go out
  const base = process.memoryUsage().arrayBuffers;
  try {
    await new Promise((r) => sock.once("connect", r));
    sock.write(rawCalls(0, "/t.T/Big", 40));
    let most = 0;
    for (let i = 0; i < 50; i++) {
      await sleep(10);
      most = Math.max(most, process.memoryUsage().arrayBuffers - base);
    }
    // answers wait for the window in their streams and count as unsent: past the send buffer
    // (4 MiB) no answer is produced and no new call starts (before: 40 answers, 320 MiB held)
    assert.ok(encoded <= 2, `${encoded} of 40 answers produced`);
    assert.ok(most < 24 * MiB, `array buffers grew ${most} bytes`);
    assert.equal((await unaryRaw(good, "/t.T/Echo", new Uint8Array([7]))).value[0], 7, "a good client is served");
  } finally {
    sock.destroy();
    good.close();
    await srv.close(200);
  }
});
