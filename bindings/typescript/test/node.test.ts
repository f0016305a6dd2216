// Node client ↔ Node server over TCP and a Unix socket: the whole call-kind suite, plus what
// only the Node server can show (the handler sees the cancel and the deadline).
import { test } from "node:test";
import assert from "node:assert/strict";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, TopspinError, createClient } from "../src/index.js";
import { Server, connect } from "../src/node/index.js";
import { Store } from "../gen/kv/v1/kv_pb.js";
import { kvStore } from "../examples/kvstore.js";
import { failsWith, kvSuite } from "./suite.js";

async function waitFor(cond: () => boolean, ms = 5000): Promise<void> {
  const until = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > until) assert.fail("condition not reached in time");
    await new Promise((r) => setTimeout(r, 5));
  }
}

test("node client ↔ node server over TCP: every call kind", async () => {
  const stats = { watching: 0, ended: [] as unknown[] };
  const server = new Server().service(Store, kvStore(stats));
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr);
  try {
    await kvSuite(ch, "t/");
    await waitFor(() => stats.watching === 0); // cancel and deadline reached the handlers
    // The abort came as CANCEL CANCELLED and the deadline as DEADLINE_EXCEEDED, on a connection
    // that went on (not a lost connection: that would be UNAVAILABLE).
    assert.deepEqual(
      stats.ended.map((r) => (r instanceof TopspinError ? Code[r.code] : String(r))),
      ["CANCELLED", "DEADLINE_EXCEEDED"],
    );
  } finally {
    ch.close();
    await server.close(1000);
  }
});

test("node client ↔ node server over a Unix socket", async () => {
  const path = join(tmpdir(), `topspin-ts-${process.pid}.sock`);
  const server = new Server().service(Store, kvStore());
  await server.listen(`unix://${path}`);
  const ch = connect(`unix://${path}`);
  try {
    await kvSuite(ch, "u/");
  } finally {
    ch.close();
    await server.close(1000);
  }
});

test("server: unknown method is UNIMPLEMENTED; handler errors carry code, message, details and trailers", async () => {
  const server = new Server().route("/t.T/Fail", {
    kind: "unary",
    decode: (b) => b,
    encode: (v) => v as Uint8Array,
    handler: (_req, ctx) => {
      ctx.responseTrailers.push({ key: "why", value: "because" });
      throw Object.assign(new Error("x"), { name: "Other" });
    },
  });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr);
  try {
    const call = await ch.start("/t.T/Nope");
    await call.send(new Uint8Array([1]), true);
    await failsWith(call.end(), Code.UNIMPLEMENTED);
    const c2 = await ch.start("/t.T/Fail");
    await c2.send(new Uint8Array([1]), true);
    const e = await failsWith(c2.end(), Code.UNKNOWN);
    assert.deepEqual(e.metadata, [{ key: "why", value: "because" }]);
  } finally {
    ch.close();
    await server.close(1000);
  }
});

test("reconnect with backoff: a call after the server restarts on the same port succeeds", async () => {
  let server = new Server().service(Store, kvStore());
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr, { backoff: { initialMs: 20, maxMs: 200 } });
  const kv = createClient(Store, ch);
  try {
    await kv.put({ key: "a", value: "1" });
    await server.close(100);
    await failsWith(kv.get({ key: "a" }), Code.UNAVAILABLE); // nobody listening
    server = new Server().service(Store, kvStore());
    await server.listen(addr);
    let ok = false;
    for (let i = 0; i < 50 && !ok; i++) {
      try {
        await kv.put({ key: "a", value: "2" });
        ok = true;
      } catch {
        await new Promise((r) => setTimeout(r, 20));
      }
    }
    assert.ok(ok, "reconnected");
  } finally {
    ch.close();
    await server.close(100);
  }
});

test("graceful shutdown: GOAWAY lets the call in progress finish; the next call finds no server", async () => {
  let entered: () => void = () => undefined;
  const inHandler = new Promise<void>((r) => (entered = r));
  const server = new Server().route("/t.T/Slow", {
    kind: "unary",
    decode: (b) => b,
    encode: (v) => v as Uint8Array,
    handler: async (req) => {
      entered();
      await new Promise((r) => setTimeout(r, 200));
      return req;
    },
  });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr, { backoff: { initialMs: 10, maxMs: 50 } });
  try {
    const call = await ch.start("/t.T/Slow");
    await call.send(new Uint8Array([42]), true);
    await inHandler;
    const closing = server.close(5000);
    assert.deepEqual([...((await call.receive()) ?? [])], [42]);
    await call.end();
    await closing;
    await failsWith(ch.start("/t.T/Slow").then((c) => c.end()), Code.UNAVAILABLE);
  } finally {
    ch.close();
  }
});

test("graceful shutdown: a call ending in the same timer turn as the shutdown's check still gets its reply and END", async () => {
  // Regression (CI, stop 39): close() saw no call left and closed the socket before the
  // driver's deferred flush had written the call's reply and END. The handler's timer and
  // close()'s first check are armed in one loop turn with the same delay, so they fire together.
  let entered: () => void = () => undefined;
  const inHandler = new Promise<void>((r) => (entered = r));
  const server = new Server().route("/t.T/Soon", {
    kind: "unary",
    decode: (b) => b,
    encode: (v) => v as Uint8Array,
    handler: async (req) => {
      const later = new Promise((r) => setTimeout(r, 10));
      entered();
      await later;
      return req;
    },
  });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr);
  try {
    const call = await ch.start("/t.T/Soon");
    await call.send(new Uint8Array([7]), true);
    await inHandler;
    const closing = server.close(5000);
    assert.deepEqual([...((await call.receive()) ?? [])], [7]);
    await call.end();
    await closing;
  } finally {
    ch.close();
  }
});

test("a slow reader holds the server back (flow control), then gets every byte", async () => {
  let sent = 0;
  const server = new Server().route("/t.T/Flood", {
    kind: "server_streaming",
    decode: (b) => b,
    encode: (v) => v as Uint8Array,
    handler: function* () {
      for (let i = 0; i < 64; i++) {
        sent++;
        yield new Uint8Array(64 * 1024).fill(i);
      }
    },
  });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr);
  try {
    const call = await ch.start("/t.T/Flood");
    await call.send(new Uint8Array(0), true);
    await new Promise((r) => setTimeout(r, 300));
    // 4 MiB offered, 1 MiB window: the handler is held well before the end
    assert.ok(sent < 40, `the server stopped for credit (sent ${sent})`);
    let n = 0;
    for (let m = await call.receive(); m !== undefined; m = await call.receive()) {
      assert.equal(m[0], n);
      n++;
    }
    await call.end();
    assert.equal(n, 64);
  } finally {
    ch.close();
    await server.close(1000);
  }
});

test("small frames and windows both ways: 1 MiB messages go as split messages and wait for credit", async () => {
  const settings = { maxFrameSize: 16384, initialCallWindow: 65536 };
  const server = new Server({ settings }).service(Store, kvStore());
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr, { settings });
  try {
    await kvSuite(ch, "s/");
  } finally {
    ch.close();
    await server.close(1000);
  }
});

test("window 0 on both sides: the first credit comes with the call (§7)", async () => {
  const settings = { initialCallWindow: 0 };
  const server = new Server({ settings }).service(Store, kvStore());
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr, { settings });
  try {
    await kvSuite(ch, "z/");
  } finally {
    ch.close();
    await server.close(1000);
  }
});
