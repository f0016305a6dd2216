// gzip requests on the gRPC face are held to the memory budget as they inflate (issue 26: the
// same bounds as the Rust server's and the Go face's): a gzip "bomb" (16 KiB that inflates to
// 16 MiB) is inflated only when its handler takes it, charged to the budget as it grows, capped
// at maxMessageSize, and refused RESOURCE_EXHAUSTED when the budget has no room; a good client
// is served. Measured by the process's RSS (sampled every 5 ms; server and clients share it),
// first thing in the process (grpc-gzip-stream.test.ts: the same on one client stream).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as http2 from "node:http2";
import { gzipSync } from "node:zlib";
import { MemoryBudget } from "../src/index.js";
import { until } from "./hostile.js";
import { BUDGET, INFLATED, MiB, bomb, call, deflateBomb, framed, server, underAttack } from "./gzip-bombs.js";

test("gRPC face: 24 concurrent unary gzip bombs (16 KiB → 16 MiB each, held 300 ms) stay within the budget; refused RESOURCE_EXHAUSTED past it", async () => {
  const { result: results, grew } = await underAttack((h2) => {
    const calls = [];
    for (let i = 0; i < 24; i++) calls.push(call(h2, "/t.T/Hold", [framed(i % 2 === 0 ? bomb : deflateBomb)], i % 2 === 0 ? "gzip" : "deflate"));
    return Promise.all(calls);
  });
  const ok = results.filter((r) => r.status === 0);
  const refused = results.filter((r) => r.status === 8);
  console.log(`24 gzip/deflate bombs of ${bomb.length}/${deflateBomb.length} B: ${ok.length} served, ${refused.length} RESOURCE_EXHAUSTED; RSS grew ${(grew / MiB).toFixed(1)} MiB (budget ${BUDGET / MiB} MiB)`);
  assert.equal(ok.length + refused.length, 24, `statuses ${results.map((r) => r.status).join(",")}`);
  for (const r of ok) assert.equal(r.body.readUInt32BE(5), INFLATED, "the handler got the inflated message");
  assert.ok(ok.length >= 1, "bombs within the budget are served");
  assert.ok(refused.length >= 1, "bombs past the budget are refused");
});

test("gRPC face: a gzip message that inflates past maxMessageSize is RESOURCE_EXHAUSTED, a corrupt one INTERNAL, zstd UNIMPLEMENTED", async () => {
  const budget = new MemoryBudget(BUDGET);
  const srv = server(budget);
  const addr = await srv.listen("tcp://127.0.0.1:0");
  const h2 = http2.connect(`http://127.0.0.1:${addr.split(":").pop()}`);
  h2.on("error", () => undefined);
  try {
    const big = gzipSync(Buffer.alloc(40 * MiB), { level: 9 }); // over maxMessageSize 32 MiB
    const r = await call(h2, "/t.T/Hold", [framed(big)]);
    assert.equal(r.status, 8, r.message);
    const junk = await call(h2, "/t.T/Hold", [framed(Buffer.from("not gzip at all"))]);
    assert.equal(junk.status, 13, junk.message);
    const zstd = await call(h2, "/t.T/Hold", [framed(Buffer.from("(\xb5/\xfd", "latin1"))], "zstd");
    assert.equal(zstd.status, 12, `zstd is not decoded on the gRPC face: ${zstd.message}`);
    const small = await call(h2, "/t.T/Echo", [framed(gzipSync(Buffer.from("hello")))]);
    assert.equal(small.status, 0, small.message);
    assert.equal(small.body.subarray(5).toString(), "hello");
    assert.ok(await until(() => budget.used === 0, 2000), `budget given back (${budget.used} held)`);
  } finally {
    h2.destroy();
    await srv.close(200);
  }
});
