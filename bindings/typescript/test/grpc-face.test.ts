// The Node server's gRPC face: a @grpc/grpc-js client on the same port as native topspin
// clients (TCP and a Unix socket), answered by the same handlers: the four call kinds, metadata
// both ways, headers and trailers, a deadline, an error status with details, a message over
// 64 KiB, gzip-compressed requests, and the bounds (message size, maxConnections, close()).
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as net from "node:net";
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, MemoryBudget, TopspinError, createClient } from "../src/index.js";
import { Server, connect, type HandlerContext } from "../src/node/index.js";
import { ApplySummarySchema, EntrySchema, EventSchema, GetRequestSchema, MutationSchema, PutRequestSchema, PutResponseSchema, Store, WatchRequestSchema } from "../gen/kv/v1/kv_pb.js";
import { kvStore } from "../examples/kvstore.js";
import { failsWith } from "./suite.js";
import { bidiRaw, clientStreamRaw, collect, countingProxy, grpcClient, grpcError, serverStreamRaw, unary, unaryRaw } from "./grpc-helpers.js";

const te = new TextEncoder();
const td = new TextDecoder();

/** The four kinds over gRPC against the kv example, then the same data read natively. */
async function kvOverGrpc(addr: string, prefix: string): Promise<void> {
  const c = grpcClient(addr);
  const ch = connect(addr);
  try {
    const put = await unary(c, "/kv.v1.Store/Put", PutRequestSchema, PutResponseSchema, create(PutRequestSchema, { key: `${prefix}a`, value: "1" }));
    assert.equal(put.version, 1n);
    const got = await unary(c, "/kv.v1.Store/Get", GetRequestSchema, EntrySchema, create(GetRequestSchema, { key: `${prefix}a` }));
    assert.equal(got.value, "1");
    // client streaming
    const muts = [create(MutationSchema, { op: { case: "put", value: { key: `${prefix}b`, value: "2" } } }), create(MutationSchema, { op: { case: "delete", value: { key: `${prefix}zz` } } })];
    const sum = fromBinary(ApplySummarySchema, await clientStreamRaw(c, "/kv.v1.Store/Apply", muts.map((m) => toBinary(MutationSchema, m))));
    assert.equal(sum.puts, 1);
    // server streaming (a watch with the existing keys; cancelled by the client after two)
    const watch = serverStreamRaw(c, "/kv.v1.Store/Watch", toBinary(WatchRequestSchema, create(WatchRequestSchema, { prefix, includeExisting: true })));
    const seen: string[] = [];
    await assert.rejects(
      (async () => {
        for await (const m of watch as AsyncIterable<Buffer>) {
          const ev = fromBinary(EventSchema, m);
          if (ev.kind.case === "put") seen.push(ev.kind.value.key);
          if (seen.length === 2) watch.cancel();
        }
      })(),
      (e: grpc.ServiceError) => e.code === grpc.status.CANCELLED,
    );
    assert.deepEqual(seen.sort(), [`${prefix}a`, `${prefix}b`]);
    // bidi
    const many = bidiRaw(c, "/kv.v1.Store/GetMany");
    for (const k of ["a", "b"]) many.write(Buffer.from(toBinary(GetRequestSchema, create(GetRequestSchema, { key: `${prefix}${k}` }))));
    many.end();
    assert.deepEqual((await collect(many)).map((b) => fromBinary(EntrySchema, b).value), ["1", "2"]);
    // an error status from the handler
    const e = await grpcError(unary(c, "/kv.v1.Store/Get", GetRequestSchema, EntrySchema, create(GetRequestSchema, { key: "nope" })));
    assert.equal(e.code, grpc.status.NOT_FOUND);
    assert.equal(e.details, 'no key "nope"');
    // the native face of the same port sees what the gRPC calls did
    assert.equal((await createClient(Store, ch).get({ key: `${prefix}b` })).value, "2");
  } finally {
    c.close();
    ch.close();
  }
}

test("gRPC face: a grpc-js client and a native client on the same TCP port, every call kind", async () => {
  const stats = { watching: 0, ended: [] as unknown[] };
  const server = new Server().service(Store, kvStore(stats));
  const addr = await server.listen("tcp://127.0.0.1:0");
  try {
    await kvOverGrpc(addr, "g/");
    // the client's cancel of the watch reached its handler as CANCELLED
    for (let i = 0; i < 500 && stats.watching > 0; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(stats.watching, 0);
    assert.deepEqual(
      stats.ended.map((r) => (r instanceof TopspinError ? Code[r.code] : String(r))),
      ["CANCELLED"],
    );
  } finally {
    await server.close(500);
  }
});

test("gRPC face: over a Unix socket too", async () => {
  const path = join(mkdtempSync(join(tmpdir(), "topspin-grpc-")), "kv.sock");
  const server = new Server().service(Store, kvStore());
  const addr = await server.listen(`unix://${path}`);
  try {
    await kvOverGrpc(addr, "u/");
  } finally {
    await server.close(500);
  }
});

/** A server with raw routes for the metadata, status, deadline and size tests. */
function rawServer(opts: ConstructorParameters<typeof Server>[0] = {}, seen: { reason?: unknown } = {}): Server {
  return new Server(opts)
    .route("/t.T/Echo", { kind: "unary", decode: (b) => b, encode: (v) => v as Uint8Array, handler: (v) => v })
    .route("/t.T/Meta", {
      kind: "unary",
      decode: (b) => b,
      encode: (v) => v as Uint8Array,
      handler: (_v, ctx: HandlerContext) => {
        const user = ctx.requestHeaders.find((m) => m.key === "x-user")?.value;
        const bin = ctx.requestHeaders.find((m) => m.key === "x-data-bin")?.value;
        ctx.responseHeaders.push({ key: "x-header", value: "h" }, { key: "x-header-bin", value: new Uint8Array([9, 8]) });
        ctx.responseTrailers.push({ key: "x-trailer", value: "t" });
        const reserved = ctx.requestHeaders.filter((m) => m.key.startsWith("grpc-")).length;
        return te.encode(`${String(user)}|${bin instanceof Uint8Array ? [...bin].join(",") : "none"}|${reserved}|${ctx.deadline !== undefined}`);
      },
    })
    .route("/t.T/Fail", {
      kind: "unary",
      decode: (b) => b,
      encode: (v) => v as Uint8Array,
      handler: (_v, ctx: HandlerContext) => {
        ctx.responseTrailers.push({ key: "x-trailer", value: "t" });
        throw new TopspinError(Code.FAILED_PRECONDITION, "not now: 100% busy", [{ key: "x-why", value: "busy" }], new Uint8Array([1, 2, 3]));
      },
    })
    .route("/t.T/Slow", {
      kind: "unary",
      decode: (b) => b,
      encode: (v) => v as Uint8Array,
      handler: (_v, ctx: HandlerContext) =>
        new Promise((_resolve, reject) =>
          ctx.signal.addEventListener("abort", () => {
            seen.reason = ctx.signal.reason;
            reject(ctx.signal.reason as Error);
          }),
        ),
    });
}

test("gRPC face: metadata both ways (text and -bin), response headers and trailers", async () => {
  const server = rawServer();
  const addr = await server.listen("tcp://127.0.0.1:0");
  const c = grpcClient(addr);
  try {
    const md = new grpc.Metadata();
    md.set("x-user", "ann");
    md.set("x-data-bin", Buffer.from([1, 2, 255]));
    const r = await unaryRaw(c, "/t.T/Meta", new Uint8Array(), md, { deadline: Date.now() + 10_000 });
    // the handler saw the text and binary values, no gRPC-reserved header, and the deadline
    assert.equal(td.decode(r.value), "ann|1,2,255|0|true");
    assert.deepEqual(r.headers.get("x-header"), ["h"]);
    assert.deepEqual(r.headers.get("x-header-bin"), [Buffer.from([9, 8])]);
    assert.deepEqual(r.trailers.get("x-trailer"), ["t"]);
  } finally {
    c.close();
    await server.close(500);
  }
});

test("gRPC face: an error status with its message, trailers and details (grpc-status-details-bin)", async () => {
  const server = rawServer();
  const addr = await server.listen("tcp://127.0.0.1:0");
  const c = grpcClient(addr);
  const ch = connect(addr);
  try {
    const e = await grpcError(unaryRaw(c, "/t.T/Fail", new Uint8Array()));
    assert.equal(e.code, grpc.status.FAILED_PRECONDITION);
    assert.equal(e.details, "not now: 100% busy");
    assert.deepEqual(e.metadata.get("x-why"), ["busy"]);
    assert.deepEqual(e.metadata.get("x-trailer"), ["t"]);
    assert.deepEqual(e.metadata.get("grpc-status-details-bin"), [Buffer.from([1, 2, 3])]);
    // the native face gets the same status and details (topspin-status-details-bin)
    const call = await ch.start("/t.T/Fail");
    await call.send(new Uint8Array(), true);
    const n = await failsWith(call.end(), Code.FAILED_PRECONDITION);
    assert.deepEqual([...(n.details ?? [])], [1, 2, 3]);
    // an unknown method
    const u = await grpcError(unaryRaw(c, "/t.T/Nope", new Uint8Array()));
    assert.equal(u.code, grpc.status.UNIMPLEMENTED);
  } finally {
    c.close();
    ch.close();
    await server.close(500);
  }
});

test("gRPC face: the client's deadline (grpc-timeout) ends the call DEADLINE_EXCEEDED and aborts the handler", async () => {
  const seen: { reason?: unknown } = {};
  const server = rawServer({}, seen);
  const addr = await server.listen("tcp://127.0.0.1:0");
  const c = grpcClient(addr);
  try {
    const t0 = Date.now();
    const e = await grpcError(unaryRaw(c, "/t.T/Slow", new Uint8Array(), new grpc.Metadata(), { deadline: Date.now() + 200 }));
    assert.equal(e.code, grpc.status.DEADLINE_EXCEEDED);
    assert.ok(Date.now() - t0 < 5000);
    for (let i = 0; i < 200 && seen.reason === undefined; i++) await new Promise((r) => setTimeout(r, 10));
    assert.ok(seen.reason instanceof TopspinError, "the handler's signal was aborted");
    assert.ok([Code.DEADLINE_EXCEEDED, Code.CANCELLED].includes(seen.reason.code));
  } finally {
    c.close();
    await server.close(500);
  }
});

test("gRPC face: a 1 MiB message each way, and gzip-compressed requests (what went over the wire shows it)", async () => {
  const server = rawServer();
  const addr = await server.listen("tcp://127.0.0.1:0");
  const big = new Uint8Array(1 << 20).map((_, i) => i % 251);
  const plain = grpcClient(addr);
  const proxy = await countingProxy(addr.replace("tcp://", ""));
  const gz = grpcClient(proxy.address, { "grpc.default_compression_algorithm": grpc.compressionAlgorithms.gzip });
  try {
    const r = await unaryRaw(plain, "/t.T/Echo", big);
    assert.equal(r.value.length, big.length);
    assert.ok(r.value.equals(Buffer.from(big)));
    const zeros = new Uint8Array(1 << 20);
    const z = await unaryRaw(gz, "/t.T/Echo", zeros);
    assert.equal(z.value.length, zeros.length);
    assert.ok(proxy.sent() < 64 * 1024, `a 1 MiB request of zeros went gzip-compressed (${proxy.sent()} bytes sent)`);
  } finally {
    plain.close();
    gz.close();
    proxy.close();
    await server.close(500);
  }
});

test("gRPC face bounds: a message over maxMessageSize (compressed or not) and metadata over maxMetadataSize are RESOURCE_EXHAUSTED", async () => {
  const server = rawServer({ settings: { maxMessageSize: 64 * 1024 } });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const c = grpcClient(addr);
  const gz = grpcClient(addr, { "grpc.default_compression_algorithm": grpc.compressionAlgorithms.gzip });
  try {
    assert.equal((await unaryRaw(c, "/t.T/Echo", new Uint8Array(60 * 1024))).value.length, 60 * 1024);
    const e = await grpcError(unaryRaw(c, "/t.T/Echo", new Uint8Array(100 * 1024)));
    assert.equal(e.code, grpc.status.RESOURCE_EXHAUSTED);
    // 1 MiB of zeros compresses to ~1 KiB: what it decompresses to counts
    const z = await grpcError(unaryRaw(gz, "/t.T/Echo", new Uint8Array(1 << 20)));
    assert.equal(z.code, grpc.status.RESOURCE_EXHAUSTED);
    // metadata: maxMetadataSize (16 KiB) + 4 KiB for HTTP/2's own header fields
    const md = (n: number): grpc.Metadata => {
      const m = new grpc.Metadata();
      m.set("x-big", "a".repeat(n));
      return m;
    };
    assert.equal((await unaryRaw(c, "/t.T/Echo", new Uint8Array([1]), md(15_000))).value[0], 1);
    const m = await grpcError(unaryRaw(c, "/t.T/Echo", new Uint8Array([1]), md(30_000)));
    assert.equal(m.code, grpc.status.RESOURCE_EXHAUSTED);
    assert.equal((await unaryRaw(c, "/t.T/Echo", new Uint8Array([2]))).value[0], 2, "the connection goes on");
  } finally {
    c.close();
    gz.close();
    await server.close(500);
  }
});

test("gRPC face bounds: gRPC connections count toward maxConnections, both ways", async () => {
  const server = rawServer({ maxConnections: 1 });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const first = grpcClient(addr);
  const second = grpcClient(addr);
  const native = connect(addr, { backoff: { initialMs: 10_000, maxMs: 10_000 } });
  try {
    assert.equal((await unaryRaw(first, "/t.T/Echo", new Uint8Array([1]))).value[0], 1);
    // the gRPC connection holds the only slot: a native client is told so
    const call = await native.start("/t.T/Echo");
    await call.send(new Uint8Array([1]), true);
    const n = await failsWith(call.end(), Code.UNAVAILABLE);
    assert.match(n.rawMessage, /max_connections \(1\) reached/);
    // and so is another gRPC client
    const e = await grpcError(unaryRaw(second, "/t.T/Echo", new Uint8Array([2])));
    assert.equal(e.code, grpc.status.UNAVAILABLE);
    assert.match(e.details, /max_connections \(1\) reached/);
    // once the gRPC client is gone, the slot is free again
    first.close();
    const face = (server as unknown as { face: { sockets: Set<unknown> } }).face;
    for (let i = 0; i < 500 && face.sockets.size > 0; i++) await new Promise((r) => setTimeout(r, 10));
    const ch = connect(addr);
    const c2 = await ch.start("/t.T/Echo");
    await c2.send(new Uint8Array([7]), true);
    assert.deepEqual([...((await c2.receive()) ?? [])], [7]);
    ch.close();
  } finally {
    first.close();
    second.close();
    native.close();
    await server.close(500);
  }
});

test("gRPC face: close() ends gRPC calls and connections too; { grpc: false } serves native only", async () => {
  const stats = { watching: 0 };
  const server = new Server().service(Store, kvStore(stats));
  const addr = await server.listen("tcp://127.0.0.1:0");
  const c = grpcClient(addr);
  try {
    const watch = serverStreamRaw(c, "/kv.v1.Store/Watch", toBinary(WatchRequestSchema, create(WatchRequestSchema, { prefix: "x" })));
    const ended = new Promise<grpc.StatusObject>((r) => watch.on("status", r));
    watch.on("error", () => undefined);
    watch.on("data", () => undefined);
    for (let i = 0; i < 500 && stats.watching === 0; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(stats.watching, 1);
    const t0 = Date.now();
    await server.close(300);
    assert.ok(Date.now() - t0 < 3000, "close() returned within its grace (and a little)");
    const s = await ended;
    assert.notEqual(s.code, grpc.status.OK);
    const after = await grpcError(unaryRaw(c, "/kv.v1.Store/Get", new Uint8Array(), new grpc.Metadata(), { deadline: Date.now() + 2000 }));
    assert.ok([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED].includes(after.code));
  } finally {
    c.close();
  }
  const off = new Server({ grpc: false }).service(Store, kvStore());
  const addr2 = await off.listen("tcp://127.0.0.1:0");
  const c2 = grpcClient(addr2);
  const ch = connect(addr2);
  try {
    const e = await grpcError(unaryRaw(c2, "/kv.v1.Store/Get", new Uint8Array(), new grpc.Metadata(), { deadline: Date.now() + 3000 }));
    assert.ok([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED, grpc.status.INTERNAL].includes(e.code), `got ${e.code}`);
    await createClient(Store, ch).put({ key: "k", value: "v" });
  } finally {
    c2.close();
    ch.close();
    await off.close(500);
  }
});

test("gRPC face bounds: a stalled HTTP/2 handshake is closed at handshakeTimeoutMs; the memory budget is charged and, spent, refuses calls", async () => {
  const budget = new MemoryBudget(1 << 20);
  const server = rawServer({ handshakeTimeoutMs: 300, memoryBudget: budget }).route("/t.T/Used", {
    kind: "unary",
    decode: (b) => b,
    encode: (v) => v as Uint8Array,
    handler: () => te.encode(String(budget.used)),
  });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const c = grpcClient(addr);
  try {
    // half of HTTP/2's preface, then nothing: closed, and its slot given back
    const stall = net.connect(Number(addr.split(":").pop()), "127.0.0.1");
    stall.on("error", () => undefined);
    stall.write("PRI * HTTP/2.0\r\n");
    const t0 = Date.now();
    await new Promise<void>((r) => stall.once("close", () => r()));
    assert.ok(Date.now() - t0 < 5000, "closed by the handshake timeout");
    // a request message over 64 KiB is held in the budget while its handler runs; a small one is not
    assert.equal(td.decode((await unaryRaw(c, "/t.T/Used", new Uint8Array(200 * 1024))).value), String(200 * 1024));
    assert.equal(td.decode((await unaryRaw(c, "/t.T/Used", new Uint8Array(1024))).value), "0");
    assert.equal(budget.used, 0, "released when the call ended");
    // spent (by anyone): new calls are refused until memory is released
    budget.reserve(2 << 20);
    const e = await grpcError(unaryRaw(c, "/t.T/Echo", new Uint8Array([1])));
    assert.equal(e.code, grpc.status.RESOURCE_EXHAUSTED);
    budget.release(2 << 20);
    assert.equal((await unaryRaw(c, "/t.T/Echo", new Uint8Array([1]))).value[0], 1);
  } finally {
    c.close();
    await server.close(500);
  }
});

test("gRPC face bounds: idleTimeoutMs closes a gRPC connection without calls (GOAWAY); a new call reconnects", async () => {
  const server = rawServer({ idleTimeoutMs: 300 });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const c = grpcClient(addr);
  try {
    assert.equal((await unaryRaw(c, "/t.T/Echo", new Uint8Array([1]))).value[0], 1);
    const face = (server as unknown as { face: { sockets: Set<unknown> } }).face;
    assert.equal(face.sockets.size, 1);
    const t0 = Date.now();
    for (let i = 0; i < 500 && face.sockets.size > 0; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(face.sockets.size, 0, "the idle connection was closed");
    assert.ok(Date.now() - t0 >= 150, "not before the idle time");
    assert.equal((await unaryRaw(c, "/t.T/Echo", new Uint8Array([2]))).value[0], 2);
  } finally {
    c.close();
    await server.close(500);
  }
});

test("gRPC face: metadata over maxMetadataSize (under the HTTP/2 header list bound) is RESOURCE_EXHAUSTED", async () => {
  const srv = rawServer();
  const addr = await srv.listen("tcp://127.0.0.1:0");
  const c = grpcClient(addr);
  try {
    const md = new grpc.Metadata();
    md.set("x-big", "a".repeat(17_000)); // over 16 KiB, under 16 KiB + 4 KiB
    const e = await grpcError(unaryRaw(c, "/t.T/Echo", new Uint8Array([1]), md));
    assert.equal(e.code, grpc.status.RESOURCE_EXHAUSTED);
    assert.match(e.details, /max_metadata_size/);
    const ok = new grpc.Metadata();
    ok.set("x-big", "a".repeat(15_000));
    assert.equal((await unaryRaw(c, "/t.T/Echo", new Uint8Array([2]), ok)).value[0], 2);
  } finally {
    c.close();
    await srv.close(200);
  }
});
