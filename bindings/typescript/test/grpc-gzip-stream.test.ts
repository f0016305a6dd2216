// gzip bombs on one client stream of the gRPC face: inflated one by one as the handler takes
// them, charged to the memory budget (a process of its own, for the RSS; see grpc-gzip.test.ts).
import { test } from "node:test";
import assert from "node:assert/strict";
import { BUDGET, MiB, bomb, call, framed, underAttack } from "./gzip-bombs.js";

test("gRPC face: 20 gzip bombs on one client stream are inflated one by one as the handler takes them", async () => {
  const { result: r, grew } = await underAttack((h2) => call(h2, "/t.T/Count", Array.from({ length: 20 }, () => framed(bomb))));
  console.log(`20 gzip bombs on one stream: status ${r.status}; RSS grew ${(grew / MiB).toFixed(1)} MiB (budget ${BUDGET / MiB} MiB)`);
  assert.equal(r.status, 0, r.message);
  assert.equal(r.body.readUInt32BE(5), 20);
});
