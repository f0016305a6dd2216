// gzip bombs on one client stream of the gRPC face: inflated one by one as the handler takes
// them, charged to the memory budget (a process of its own, for the RSS; see grpc-gzip.test.ts).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as http2 from "node:http2";
import { MemoryBudget } from "../src/index.js";
import { grpcClient, unaryRaw } from "./grpc-helpers.js";
import { until } from "./hostile.js";
import { BUDGET, MiB, SLACK, bomb, call, framed, rssPeak, server } from "./gzip-bombs.js";

test("gRPC face: 20 gzip bombs on one client stream are inflated one by one as the handler takes them", async () => {
  const budget = new MemoryBudget(BUDGET);
  const srv = server(budget);
  const addr = await srv.listen("tcp://127.0.0.1:0");
  const good = grpcClient(addr);
  const h2 = http2.connect(`http://127.0.0.1:${addr.split(":").pop()}`);
  h2.on("error", () => undefined);
  try {
    assert.equal((await unaryRaw(good, "/t.T/Echo", new Uint8Array([1]))).value[0], 1);
    globalThis.gc?.();
    const before = process.memoryUsage.rss();
    const peak = rssPeak();
    const r = await call(h2, "/t.T/Count", Array.from({ length: 20 }, () => framed(bomb)));
    const grew = peak.stop() - before;
    console.log(`20 gzip bombs on one stream: status ${r.status}; RSS grew ${(grew / MiB).toFixed(1)} MiB (budget ${BUDGET / MiB} MiB)`);
    assert.equal(r.status, 0, r.message);
    assert.equal(r.body.readUInt32BE(5), 20);
    assert.ok(grew <= BUDGET + SLACK, `RSS grew ${(grew / MiB).toFixed(1)} MiB, over the budget + 64 MiB`);
    assert.ok(await until(() => budget.used === 0, 2000), `budget given back (${budget.used} held)`);
    assert.equal((await unaryRaw(good, "/t.T/Echo", new Uint8Array([2]))).value[0], 2, "a good client is served");
  } finally {
    h2.destroy();
    good.close();
    await srv.close(200);
  }
});

