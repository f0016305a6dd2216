// Interceptors (connect-es shape) on the client (typed clients and the raw call functions) and
// on the Node server (native TCP, WebSocket and the gRPC face): the order of a chain, a refusal
// before the handler, metadata both ways, a wrapped response stream, measuring, and a client
// chain against the Rust kvstore-server.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, createClient, methodCodec, rawMethod, unaryCall, TopspinError, type Interceptor, type Metadata } from "../src/index.js";
import { Server, connect, type ServiceImpl } from "../src/node/index.js";
import { GetRequestSchema, PutRequestSchema, Store } from "../gen/kv/v1/kv_pb.js";
import { kvStore } from "../examples/kvstore.js";
import { failsWith, kvSuite } from "./suite.js";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { binary, run, startServer, stop } from "./procs.js";
import { bidiRaw, collect, grpcClient, grpcError, unaryRaw } from "./grpc-helpers.js";
import { REFUSAL_DETAILS, addHeader, all, countResponses, measure, requireToken, textOf, tracer, type Measured } from "./interceptor-helpers.js";

/** kvStore with every handler run counted, and the request metadata of each `get` recorded. */
function countedStore(runs: { n: number; getHeaders: string[] }): ServiceImpl<typeof Store> {
  const impl = kvStore() as unknown as Record<string, (...a: unknown[]) => unknown>;
  const out: Record<string, (...a: unknown[]) => unknown> = {};
  for (const [name, f] of Object.entries(impl)) {
    out[name] = (...a: unknown[]) => {
      runs.n++;
      const ctx = a[1] as { requestHeaders: { key: string; value: unknown }[] };
      if (name === "get") runs.getHeaders.push(ctx.requestHeaders.map((m) => m.key).join(","));
      return f(...a);
    };
  }
  return out as unknown as ServiceImpl<typeof Store>;
}

/** A Node server with `interceptors` on tcp://; `fn` gets its address; closed after. */
async function withServer(interceptors: Interceptor[], fn: (addr: string, runs: { n: number; getHeaders: string[] }, server: Server) => Promise<void>): Promise<void> {
  const runs = { n: 0, getHeaders: [] as string[] };
  const server = new Server({ interceptors }).service(Store, countedStore(runs));
  const addr = await server.listen("tcp://127.0.0.1:0");
  try {
    await fn(addr, runs, server);
  } finally {
    await server.close(1000);
  }
}

test("interceptors: client and server chains run first-outermost, on every call kind and raw calls", async () => {
  const log: string[] = [];
  await withServer([tracer("S1", log), tracer("S2", log)], async (addr) => {
    const ch = connect(addr, { interceptors: [tracer("C1", log), tracer("C2", log)] });
    try {
      const kv = createClient(Store, ch);
      await kv.put({ key: "a", value: "1" });
      assert.deepEqual(log, ["C1>", "C2>", "S1>", "S2>", "<S2", "<S1", "<C2", "<C1"]);
      log.length = 0;
      assert.deepEqual((await all(kv.getMany([{ key: "a" }, { key: "a" }]))).map((e) => e.value), ["1", "1"]);
      assert.deepEqual(log, ["C1>", "C2>", "S1>", "S2>", "<S2", "<S1", "<C2", "<C1"]);
      log.length = 0;
      await kv.apply([{ op: { case: "put", value: { key: "b", value: "2" } } }]);
      for await (const _ of kv.watch({ prefix: "a", includeExisting: true })) break;
      const raw = await unaryCall(ch, rawMethod("/kv.v1.Store/Get", "unary"), toBinary(GetRequestSchema, create(GetRequestSchema, { key: "b" })));
      assert.ok(raw.length > 0);
      // apply, watch and the raw get: each went through both chains
      assert.equal(log.filter((l) => l === "C1>").length, 3);
      assert.equal(log.filter((l) => l === "S2>").length, 3);
    } finally {
      ch.close();
    }
  });
});

/** Records request messages (and the response's descriptor name) as they pass. */
function looker(seen: unknown[]): Interceptor {
  return (next) => async (req) => {
    let res;
    if (!req.stream) {
      seen.push(req.message);
      res = await next(req);
    } else {
      const source = req.message;
      const message = (async function* () {
        for await (const m of source) yield (seen.push(m), m);
      })();
      res = await next({ ...req, message });
    }
    seen.push(res.descriptor?.name);
    return res;
  };
}

test("interceptors: a typed client's own run outside the channel's, and see created messages and the descriptor", async () => {
  const log: string[] = [];
  const seen: unknown[] = [];
  await withServer([], async (addr) => {
    const ch = connect(addr, { interceptors: [tracer("channel", log)] });
    try {
      const kv = createClient(Store, ch, { interceptors: [tracer("client", log), looker(seen)] });
      await kv.put({ key: "a", value: "1" });
      assert.deepEqual(log, ["client>", "channel>", "<channel", "<client"]);
      await kv.apply([{ op: { case: "delete", value: { key: "a" } } }]);
      const typeNames = seen.map((m) => (typeof m === "object" && m !== null && "$typeName" in m ? m.$typeName : m));
      assert.deepEqual(typeNames.slice(0, 2), ["kv.v1.PutRequest", "Put"]);
      assert.deepEqual(typeNames.slice(2).sort(), ["Apply", "kv.v1.Mutation"]); // the stream is read as the call goes
      // another client on the same channel has only the channel's
      log.length = 0;
      await createClient(Store, ch).put({ key: "b", value: "2" });
      assert.deepEqual(log, ["channel>", "<channel"]);
    } finally {
      ch.close();
    }
  });
});

test("interceptors: a server interceptor refuses before the handler; a client one before the call", async () => {
  const seen: Measured[] = [];
  await withServer([measure(seen), requireToken()], async (addr, runs) => {
    const bare = connect(addr);
    const authed = connect(addr, { interceptors: [addHeader("authorization", "Bearer ok")] });
    const refusing: Interceptor = () => () => Promise.reject(new TopspinError(Code.UNAUTHENTICATED, "log in first"));
    const local = connect(addr, { interceptors: [refusing] });
    try {
      const e = await failsWith(createClient(Store, bare).put({ key: "k", value: "v" }), Code.PERMISSION_DENIED);
      assert.equal(e.rawMessage, "no token for /kv.v1.Store/Put");
      assert.deepEqual([...(e.details ?? [])], [...REFUSAL_DETAILS]);
      await failsWith(all(createClient(Store, bare).getMany([{ key: "k" }])), Code.PERMISSION_DENIED);
      assert.equal(runs.n, 0, "no handler ran");
      assert.equal((await createClient(Store, authed).put({ key: "k", value: "v" })).version, 1n);
      assert.equal(runs.n, 1);
      await failsWith(createClient(Store, local).get({ key: "k" }), Code.UNAUTHENTICATED);
      assert.deepEqual(seen.map((m) => m.code), [Code.PERMISSION_DENIED, Code.PERMISSION_DENIED, Code.OK], "the refused client call never reached the server");
    } finally {
      for (const c of [bare, authed, local]) c.close();
    }
  });
});

/** Server side: reads `x-added`, answers with it in a response header, and adds a trailer. */
const echoAdded: Interceptor = (next) => async (req) => {
  const added = textOf(req.header, "x-added") ?? "none";
  const res = await next(req);
  res.header.push({ key: "x-seen", value: added });
  res.trailer.push({ key: "x-trailer", value: `after ${req.method}` });
  return res;
};

test("interceptors: metadata added by a client interceptor reaches the handler; a server one adds headers and trailers", async () => {
  await withServer([echoAdded], async (addr, runs) => {
    const got: { header?: string; trailer?: string } = {};
    const peek: Interceptor = (next) => async (req) => {
      const res = await next(req);
      got.header = textOf(res.header, "x-seen");
      got.trailer = textOf(res.trailer, "x-trailer");
      return res;
    };
    const ch = connect(addr, { interceptors: [peek, addHeader("x-added", "yes")] });
    try {
      const kv = createClient(Store, ch);
      await kv.put({ key: "k", value: "v" });
      let onHeader: string | undefined;
      const caller = { "x-caller": "1" };
      await kv.get({ key: "k" }, { headers: caller, onHeader: (h) => (onHeader = textOf(h, "x-seen")) });
      assert.deepEqual(runs.getHeaders, ["x-caller,x-added"]);
      assert.deepEqual(caller, { "x-caller": "1" }, "the caller's headers are left as they were");
      assert.equal(onHeader, "yes");
      assert.deepEqual(got, { header: "yes", trailer: "after /kv.v1.Store/Get" });
      // a stream: the server interceptor adds to the headers before the first message goes out
      let streamHeader: string | undefined;
      let streamTrailer: string | undefined;
      const opts = { onHeader: (h: Metadata) => (streamHeader = textOf(h, "x-seen")), onTrailer: (t: Metadata) => (streamTrailer = textOf(t, "x-trailer")) };
      for await (const _ of kv.getMany([{ key: "k" }], opts));
      assert.deepEqual([streamHeader, streamTrailer], ["yes", "after /kv.v1.Store/GetMany"]);
    } finally {
      ch.close();
    }
  });
});

test("interceptors: wrapping the response stream counts its messages on both sides", async () => {
  const server = new Map<string, number>();
  const client = new Map<string, number>();
  await withServer([countResponses(server)], async (addr) => {
    const ch = connect(addr, { interceptors: [countResponses(client)] });
    try {
      const kv = createClient(Store, ch);
      for (const key of ["a", "b"]) await kv.put({ key, value: key });
      assert.equal((await all(kv.getMany([{ key: "a" }, { key: "b" }, { key: "a" }]))).length, 3);
      let n = 0;
      for await (const _ of kv.watch({ prefix: "", includeExisting: true })) if (++n === 2) break;
      assert.equal(client.get("/kv.v1.Store/GetMany"), 3);
      assert.equal(client.get("/kv.v1.Store/Watch"), 2);
      assert.equal(server.get("/kv.v1.Store/GetMany"), 3);
      assert.equal(server.get("/kv.v1.Store/Watch"), 2);
      assert.equal(client.get("/kv.v1.Store/Put"), undefined, "a unary response is no stream");
    } finally {
      ch.close();
    }
  });
});

test("interceptors: measuring records each call's method and final code on both sides", async () => {
  const server: Measured[] = [];
  const client: Measured[] = [];
  await withServer([measure(server)], async (addr) => {
    const ch = connect(addr, { interceptors: [measure(client)] });
    try {
      const kv = createClient(Store, ch);
      await kv.put({ key: "a", value: "1" });
      await failsWith(kv.get({ key: "missing" }), Code.NOT_FOUND);
      await all(kv.getMany([{ key: "a" }]));
      await failsWith(all(kv.getMany([{ key: "a" }, { key: "missing" }])), Code.NOT_FOUND);
      await failsWith(all(kv.watch({ prefix: "none/" }, { timeoutMs: 100 })), Code.DEADLINE_EXCEEDED);
      const expected = [
        ["/kv.v1.Store/Put", Code.OK],
        ["/kv.v1.Store/Get", Code.NOT_FOUND],
        ["/kv.v1.Store/GetMany", Code.OK],
        ["/kv.v1.Store/GetMany", Code.NOT_FOUND],
        ["/kv.v1.Store/Watch", Code.DEADLINE_EXCEEDED],
      ];
      assert.deepEqual(client.map((m) => [m.method, m.code]), expected);
      // the server's Watch handler ends quietly at the deadline: measure reads the code from the signal
      for (let i = 0; i < 100 && server.length < 5; i++) await new Promise((r) => setTimeout(r, 10));
      assert.deepEqual(server.map((m) => [m.method, m.code]), expected);
      assert.ok(client.every((m) => m.ms >= 0) && (client[4]?.ms ?? 0) >= 90, "durations; the deadline's call took its 100 ms");
    } finally {
      ch.close();
    }
  });
});

test("interceptors: the server's chain runs once per call on native TCP, WebSocket and gRPC (grpc-js)", async () => {
  const seen: Measured[] = [];
  const counts = new Map<string, number>();
  await withServer([measure(seen), requireToken(), countResponses(counts)], async (addr, runs, server) => {
    const wsAddr = await server.listen("ws://127.0.0.1:0/");
    const token = { interceptors: [addHeader("authorization", "Bearer ok")] };
    const tcp = connect(addr, token);
    const ws = connect(wsAddr, token);
    const g = grpcClient(addr);
    try {
      await createClient(Store, tcp).put({ key: "a", value: "1" });
      assert.equal((await createClient(Store, ws).get({ key: "a" })).value, "1");
      const md = new grpc.Metadata();
      md.set("authorization", "Bearer ok");
      await unaryRaw(g, "/kv.v1.Store/Put", toBinary(PutRequestSchema, create(PutRequestSchema, { key: "b", value: "2" })), md);
      const many = bidiRaw(g, "/kv.v1.Store/GetMany", md);
      for (const key of ["a", "b"]) many.write(Buffer.from(toBinary(GetRequestSchema, create(GetRequestSchema, { key }))));
      many.end();
      assert.equal((await collect(many)).length, 2);
      assert.equal(runs.n, 4, "one handler run per call");
      assert.deepEqual(seen.map((m) => [m.method, m.code]), [["/kv.v1.Store/Put", 0], ["/kv.v1.Store/Get", 0], ["/kv.v1.Store/Put", 0], ["/kv.v1.Store/GetMany", 0]]);
      assert.equal(counts.get("/kv.v1.Store/GetMany"), 2);
      // refused on the gRPC face: the status, message and details, and no handler
      const e = await grpcError(unaryRaw(g, "/kv.v1.Store/Get", toBinary(GetRequestSchema, create(GetRequestSchema, { key: "a" }))));
      assert.equal(e.code, grpc.status.PERMISSION_DENIED);
      assert.equal(e.details, "no token for /kv.v1.Store/Get");
      assert.deepEqual(new Uint8Array(e.metadata.get("grpc-status-details-bin")[0] as Buffer), REFUSAL_DETAILS);
      assert.equal(runs.n, 4);
      assert.equal(seen.at(-1)?.code, Code.PERMISSION_DENIED);
    } finally {
      tcp.close();
      ws.close();
      g.close();
    }
  });
});

test("interceptors: a client chain against the Rust kvstore-server (every call kind, deadline, cancel)", async () => {
  const { proc, address } = await startServer(binary("KVSTORE_SERVER"), ["tcp://127.0.0.1:0"]);
  const log: string[] = [];
  const seen: Measured[] = [];
  const counts = new Map<string, number>();
  const ch = connect(address, { interceptors: [tracer("A", log), measure(seen), countResponses(counts), addHeader("x-client", "ts")] });
  try {
    await kvSuite(ch, "icpt/");
    const codes = new Set(seen.map((m) => m.code));
    for (const c of [Code.OK, Code.NOT_FOUND, Code.FAILED_PRECONDITION, Code.CANCELLED, Code.DEADLINE_EXCEEDED]) assert.ok(codes.has(c), `a call ended ${Code[c]}`);
    assert.equal(log.filter((l) => l === "A>").length, seen.length, "every call measured once");
    assert.ok((counts.get("/kv.v1.Store/GetMany") ?? 0) >= 3 + 2 + 8);
    // the raw call functions go through the chain too, and a typed codec can be used with them
    const before = seen.length;
    const e = await failsWith(unaryCall(ch, methodCodec(Store.method.get), { key: "icpt/none" }), Code.NOT_FOUND);
    assert.match(e.rawMessage, /icpt\/none/);
    assert.deepEqual(seen.slice(before).map((m) => [m.method, m.code]), [["/kv.v1.Store/Get", Code.NOT_FOUND]]);
  } finally {
    ch.close();
    await stop(proc);
  }
});

test("interceptors: the README's example runs and prints what it says", async () => {
  const pkg = join(fileURLToPath(import.meta.url), "..", "..", "..");
  const r = await run(process.execPath, [join(pkg, "dist", "examples", "interceptors.js")]);
  assert.equal(r.code, 0, r.stderr);
  const lines = r.stdout.trim().split("\n");
  for (const want of [
    /^server: \/kv\.v1\.Store\/Put OK in [\d.]+ ms$/,
    /^server: \/kv\.v1\.Store\/GetMany OK after 2 messages in [\d.]+ ms$/,
    /^server: \/kv\.v1\.Store\/Get UNAUTHENTICATED in [\d.]+ ms$/,
    /^client: got a = 1$/,
    /^client: UNAUTHENTICATED: who are you\?$/,
  ]) {
    assert.ok(lines.some((l) => want.test(l)), `${String(want)} in:\n${r.stdout}`);
  }
  assert.equal(lines.length, 6);
});
