// The header rule on the client: a call is handed to the caller as soon as its CALL is out,
// without waiting for response headers. Servers (Go, Node, Python) may send HEADERS only with
// their first message: a bidi call that opened and then sends must not deadlock, and subscribing
// to a quiet stream returns at once. Each wait here is bounded: a client that waited for headers
// fails these tests instead of hanging.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createClient } from "../src/index.js";
import { Server, connect } from "../src/node/index.js";
import { Store } from "../gen/kv/v1/kv_pb.js";
import { kvStore } from "../examples/kvstore.js";

/** `p`, or a failure naming `what` after 5 s. */
function within<T>(p: Promise<T>, what: string): Promise<T> {
  let t: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => (t = setTimeout(() => reject(new Error(`${what}: still waiting after 5 s`)), 5000)));
  return Promise.race([p, timeout]).finally(() => clearTimeout(t));
}

test("header rule: a bidi call opens before any header, then sends; a quiet stream's call returns at once", async () => {
  let quietEntered = false;
  let quietAborted = false;
  const id = { decode: (b: Uint8Array) => b, encode: (v: unknown) => v as Uint8Array };
  const server = new Server()
    .route("/t.T/Bidi", {
      kind: "bidi_streaming",
      ...id,
      handler: async function* (reqs) {
        for await (const r of reqs as AsyncIterable<Uint8Array>) yield r; // HEADERS go with the first answer
      },
    })
    .route("/t.T/Quiet", {
      kind: "server_streaming",
      ...id,
      handler: async function* (_r, ctx) {
        quietEntered = true;
        await new Promise((r) => ctx.signal.addEventListener("abort", r));
        quietAborted = true;
        yield new Uint8Array(0);
      },
    })
    .service(Store, kvStore());
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr);
  try {
    // bidi: open, and only then send; the server says nothing before our first message
    const bidi = await within(ch.start("/t.T/Bidi"), "opening a bidi call");
    assert.deepEqual(bidi.headers, [], "no header yet");
    await bidi.send(new Uint8Array([1]));
    assert.deepEqual([...((await within(bidi.receive(), "the first answer")) ?? [])], [1]);
    await bidi.send(new Uint8Array([2]));
    assert.deepEqual([...((await within(bidi.receive(), "the second answer")) ?? [])], [2]);
    bidi.halfClose();
    await within(bidi.end(), "the end");

    // a quiet stream: the call is ours at once; the handler runs, nothing has come back
    let headerSeen = false;
    const quiet = await within(ch.start("/t.T/Quiet", { onHeader: () => (headerSeen = true) }), "subscribing");
    await quiet.send(new Uint8Array(0), true);
    const deadline = Date.now() + 5000;
    while (!quietEntered && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5));
    assert.ok(quietEntered, "the handler runs");
    assert.ok(!headerSeen && quiet.headers.length === 0 && !quiet.done);
    quiet.cancel();
    const until = Date.now() + 5000;
    while (!quietAborted && Date.now() < until) await new Promise((r) => setTimeout(r, 5));
    assert.ok(quietAborted, "the cancel reached the handler");

    // the typed bidi client: requests pulled as the caller writes, answers as they come
    const kv = createClient(Store, ch);
    await kv.put({ key: "h", value: "1" });
    let more!: () => void;
    const gate = new Promise<void>((r) => (more = r));
    const reqs = (async function* () {
      yield { key: "h" };
      await gate; // the second request waits for the first answer
      yield { key: "h" };
    })();
    let n = 0;
    await within(
      (async () => {
        for await (const e of kv.getMany(reqs)) {
          assert.equal(e.value, "1");
          if (++n === 1) more();
        }
      })(),
      "the typed bidi call",
    );
    assert.equal(n, 2);
  } finally {
    ch.close();
    await server.close(100);
  }
});
