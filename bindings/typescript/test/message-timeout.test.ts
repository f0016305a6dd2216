// The split-message timeout (the Rust engine's `check_message_progress`): a split message that
// gets no chunk for frame_timeout while it has credit closes the connection with TIMEOUT — the
// frame timer does not see it, its frames being complete — and gives back the budget it held;
// one that keeps progressing stays, and a good client on another connection is served.
import { test } from "node:test";
import assert from "node:assert/strict";
import { ErrorCode, Flags, MemoryBudget } from "../src/index.js";
import { Raw, echoServer, goodClient, sleep } from "./hostile.js";

const first = (callId: number, totalLen: number, n: number) =>
  ({ type: "MESSAGE", flags: Flags.SPLIT, callId, endStream: false, totalLen, chunk: new Uint8Array(n) }) as const;
const more = (callId: number, n: number) => ({ type: "CONTINUATION", flags: 0, callId, chunk: new Uint8Array(n) }) as const;

test("message timeout: a split message that stalls in complete frames closes the connection with TIMEOUT; a progressing one stays", async () => {
  const budget = new MemoryBudget(64 << 20);
  const server = echoServer({ frameTimeoutMs: 300, memoryBudget: budget, grpc: false });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const good = goodClient(addr);
  try {
    const stall = await Raw.open(addr);
    stall.handshake();
    stall.call(1, "/t.T/Echo");
    stall.send(first(1, 1 << 20, 200_000)); // then nothing: every frame it sent is complete
    const slow = await Raw.open(addr);
    slow.handshake();
    slow.call(1, "/t.T/Echo");
    slow.send(first(1, 1 << 20, 1000));
    const started = Date.now();
    for (let i = 0; i < 10 && !stall.closed; i++) {
      await sleep(100);
      slow.send(more(1, 1000)); // a chunk every 100 ms: progressing
    }
    await stall.closedByServer(5000);
    const err = await stall.frame("ERROR", 0);
    assert.equal(err.code, ErrorCode.TIMEOUT);
    assert.match(err.reason, /split message got no chunk for 300 ms \(frame_timeout\)/);
    assert.ok(Date.now() - started < 3000, "cut after about frame_timeout");
    assert.ok(budget.used < 200_000, `the stalled message's memory was given back (${budget.used} bytes held)`);
    assert.ok(!slow.closed, "the progressing split message's connection stays");
    assert.equal(slow.frames.filter((f) => f.type === "ERROR").length, 0);
    slow.destroy();
    assert.ok((await good.stop()) > 0, "a good client on another connection is served");
  } finally {
    await good.stop().catch(() => undefined);
    await server.close(100);
  }
});
