// Memory a peer can make the Node server hold by announcing what it never sends: buffers grow as
// bytes arrive, never to the size a header claims, and bytes held for large frames are charged
// to the memory budget (docs/hardening.md: "50 connections each announcing a 16 MiB frame").
import { test } from "node:test";
import assert from "node:assert/strict";
import { FrameType, MemoryBudget, encodeHeader } from "../src/index.js";
import { Raw, echoServer, extensionHeader, goodClient, until } from "./hostile.js";

const MiB = 1 << 20;
const CONNS = 50;

test("50 connections announcing 16 MiB frames and sending 1–2 bytes: RSS and buffers stay small, the budget holds what arrived", async () => {
  const budget = new MemoryBudget();
  const server = echoServer({ memoryBudget: budget });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const good = goodClient(addr);
  const raws: Raw[] = [];
  try {
    assert.ok(await until(() => good.served() > 0));
    globalThis.gc?.();
    const before = process.memoryUsage();
    let sent = 0;
    for (let i = 0; i < CONNS; i++) {
      const r = await Raw.open(addr);
      r.handshake();
      // half the connections announce an extension frame, the others a message on a call
      if (i % 2 === 0) r.send(extensionHeader(16 * MiB - 1));
      else {
        r.call(1, "/t.T/Echo");
        r.send(encodeHeader(16 * MiB - 1, FrameType.MESSAGE, 0, 1));
      }
      const n = 1 + (i % 2);
      r.send(new Uint8Array(n));
      sent += n;
      raws.push(r);
    }
    // what arrived of the large frames is held, and charged (a few bytes per connection)
    assert.ok(await until(() => budget.used >= CONNS), `the budget holds the bytes that arrived (${budget.used})`);
    const after = process.memoryUsage();
    const rss = after.rss - before.rss;
    const ab = after.arrayBuffers - before.arrayBuffers;
    console.log(`50 × 16 MiB announced, ${sent} bytes sent: rss +${(rss / MiB).toFixed(1)} MiB, arrayBuffers +${(ab / MiB).toFixed(1)} MiB, budget ${budget.used} B`);
    assert.ok(budget.used <= 4 * CONNS, `reserved ${budget.used} bytes for ${sent} sent`);
    assert.ok(ab < 32 * MiB, `arrayBuffers grew ${ab} bytes (not 800 MiB)`);
    assert.ok(rss < 100 * MiB, `rss grew ${rss} bytes (not 800 MiB)`);
    assert.ok(raws.every((r) => !r.closed), "the connections are still waiting");
    assert.ok((await good.stop()) > 0, "the good client was served");
  } finally {
    for (const r of raws) r.destroy();
    await good.stop().catch(() => undefined);
    await server.close(100);
  }
  assert.ok(await until(() => budget.used === 0), `all released (${budget.used})`);
});
