// A failing call's response headers (protocol.md §5.4): a Node handler throws a TopspinError
// with `headers`; the server sends HEADERS, then the failing END (unless the call sent its
// headers already, or they are over the client's limit); the Node client keeps them on the
// error (`headers`, apart from `trailers`). The gRPC face answers HEADERS, then the trailers.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";
import { Code, TopspinError, type Metadata } from "../src/index.js";
import { Server, connect, type HandlerContext } from "../src/node/index.js";
import { failsWith } from "./suite.js";
import { grpcClient } from "./grpc-helpers.js";

const id = { decode: (b: Uint8Array) => b, encode: (v: unknown) => v as Uint8Array };
const failure = (headers: Metadata = [{ key: "early", value: "yes" }]): TopspinError =>
  new TopspinError(Code.UNAVAILABLE, "draining", [{ key: "late", value: "no" }], { headers });

function failingServer(): Server {
  return new Server()
    .route("/e.S/Fail", {
      kind: "unary",
      ...id,
      handler: (_r, ctx: HandlerContext) => {
        const big = ctx.requestHeaders.some((m) => m.key === "big");
        throw failure(big ? [{ key: "big", value: "x".repeat(1000) }] : undefined);
      },
    })
    .route("/e.S/SetThenFail", {
      kind: "unary",
      ...id,
      handler: (_r, ctx: HandlerContext) => {
        ctx.responseHeaders.push({ key: "set", value: "1" });
        throw failure();
      },
    })
    .route("/e.S/Plain", {
      kind: "unary",
      ...id,
      handler: () => {
        throw new TopspinError(Code.NOT_FOUND, "nothing", [{ key: "late", value: "no" }]);
      },
    })
    .route("/e.S/SumFail", {
      kind: "client_streaming",
      ...id,
      handler: async (reqs) => {
        for await (const _ of reqs as AsyncIterable<Uint8Array>) void _;
        throw failure();
      },
    })
    .route("/e.S/StreamFail", {
      kind: "server_streaming",
      ...id,
      handler: async function* () {
        yield* await Promise.resolve([]); // no message
        throw failure();
      },
    })
    .route("/e.S/SentThenFail", {
      kind: "server_streaming",
      ...id,
      handler: async function* (_r, ctx: HandlerContext) {
        ctx.responseHeaders.push({ key: "first", value: "1" });
        yield await Promise.resolve(new Uint8Array([1]));
        throw failure();
      },
    });
}

/** Asserts `e` is failure() with response headers `headers`. */
function isFailure(e: TopspinError, headers: Metadata): void {
  assert.equal(e.code, Code.UNAVAILABLE);
  assert.equal(e.rawMessage, "draining");
  assert.deepEqual(e.headers, headers);
  assert.deepEqual(e.trailers, [{ key: "late", value: "no" }]);
  assert.deepEqual(e.metadata, [...headers, { key: "late", value: "no" }]);
}

test("a failing call's response headers: unary, client streaming, server streaming, already sent", async () => {
  const server = failingServer();
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr);
  try {
    const unary = async (method: string): Promise<TopspinError> => {
      const c = await ch.start(method);
      await c.send(new Uint8Array([1]), true);
      return failsWith(c.end(), method === "/e.S/Plain" ? Code.NOT_FOUND : Code.UNAVAILABLE);
    };
    isFailure(await unary("/e.S/Fail"), [{ key: "early", value: "yes" }]);
    // the headers the handler set come first, the error's after them
    isFailure(await unary("/e.S/SetThenFail"), [{ key: "set", value: "1" }, { key: "early", value: "yes" }]);
    // an error without headers has none
    const plain = await unary("/e.S/Plain");
    assert.deepEqual([plain.headers, plain.trailers, plain.metadata], [[], [{ key: "late", value: "no" }], [{ key: "late", value: "no" }]]);

    // client streaming
    const sum = await ch.start("/e.S/SumFail");
    await sum.send(new Uint8Array([1]));
    await sum.send(new Uint8Array([2]));
    sum.halfClose();
    isFailure(await failsWith(sum.end(), Code.UNAVAILABLE), [{ key: "early", value: "yes" }]);

    // server streaming: the headers reach onHeader, then the error has them too
    const seen: Metadata[] = [];
    const s = await ch.start("/e.S/StreamFail", { onHeader: (h) => seen.push(h) });
    await s.send(new Uint8Array([1]), true);
    isFailure(await failsWith(s.receive(), Code.UNAVAILABLE), [{ key: "early", value: "yes" }]);
    assert.deepEqual(seen, [[{ key: "early", value: "yes" }]]);

    // headers already sent with a message are not sent again: the error's are dropped
    const seen2: Metadata[] = [];
    const s2 = await ch.start("/e.S/SentThenFail", { onHeader: (h) => seen2.push(h) });
    await s2.send(new Uint8Array([1]), true);
    assert.deepEqual([...((await s2.receive()) ?? [])], [1]);
    isFailure(await failsWith(s2.receive(), Code.UNAVAILABLE), [{ key: "first", value: "1" }]);
    assert.deepEqual(seen2, [[{ key: "first", value: "1" }]]);
  } finally {
    ch.close();
    await server.close(1000);
  }
});

test("a failing call's headers over the client's metadata limit: the END goes alone", async () => {
  const server = failingServer();
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr, { settings: { maxMetadataSize: 512 } });
  try {
    const c = await ch.start("/e.S/Fail", { headers: { big: "1" } });
    await c.send(new Uint8Array([1]), true);
    isFailure(await failsWith(c.end(), Code.UNAVAILABLE), []);
    // the connection goes on
    const d = await ch.start("/e.S/Fail");
    await d.send(new Uint8Array([1]), true);
    isFailure(await failsWith(d.end(), Code.UNAVAILABLE), [{ key: "early", value: "yes" }]);
  } finally {
    ch.close();
    await server.close(1000);
  }
});

test("gRPC face: a failing call's headers come as HEADERS, then the trailers", async () => {
  const server = failingServer();
  const addr = await server.listen("tcp://127.0.0.1:0");
  const c = grpcClient(addr);
  try {
    const raw = (b: Buffer): Buffer => b;
    const { err, headers } = await new Promise<{ err: grpc.ServiceError | null; headers: grpc.Metadata | null }>((resolve) => {
      let headers: grpc.Metadata | null = null;
      const call = c.makeUnaryRequest("/e.S/Fail", raw, raw, Buffer.from([1]), (err) => setImmediate(() => resolve({ err, headers })));
      call.on("metadata", (m: grpc.Metadata) => (headers = m));
    });
    assert.equal(err?.code, grpc.status.UNAVAILABLE);
    assert.deepEqual(headers?.get("early"), ["yes"]);
    assert.deepEqual(err.metadata.get("late"), ["no"]);
    assert.deepEqual(err.metadata.get("early"), []);
  } finally {
    c.close();
    await server.close(500);
  }
});
