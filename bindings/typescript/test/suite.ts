// The call-kind suite every kv.v1.Store server must pass from the TypeScript client: unary,
// server streaming, client streaming, bidi, a deadline, a cancel, an error status, 1 MiB.
import assert from "node:assert/strict";
import { Code, TopspinError, createClient, type Channel } from "../src/index.js";
import { Store } from "../gen/kv/v1/kv_pb.js";

/** Asserts that `p` fails with a TopspinError of `code`. */
export async function failsWith(p: Promise<unknown>, code: Code): Promise<TopspinError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof TopspinError, `a TopspinError, got ${String(e)}`);
    assert.equal(e.code, code, `code ${Code[code]}, got ${Code[e.code]}: ${e.message}`);
    return e;
  }
  assert.fail(`expected ${Code[code]}, the call succeeded`);
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Runs every case against the server behind `channel`; keys get `prefix`. */
export async function kvSuite(channel: Channel, prefix: string): Promise<void> {
  const kv = createClient(Store, channel);

  // unary
  const put = await kv.put({ key: `${prefix}a`, value: "1" }, { timeoutMs: 5000 });
  assert.equal(put.version, 1n);
  const got = await kv.get({ key: `${prefix}a` }, { headers: { "x-test": "yes" } });
  assert.equal(got.value, "1");

  // error status
  const err = await failsWith(kv.get({ key: `${prefix}missing` }), Code.NOT_FOUND);
  assert.match(err.rawMessage, /missing/);
  await failsWith(kv.put({ key: `${prefix}a`, value: "x", expectedVersion: 7n }), Code.FAILED_PRECONDITION);

  // client streaming
  const summary = await kv.apply(
    (async function* () {
      await sleep(1);
      yield { op: { case: "put" as const, value: { key: `${prefix}b`, value: "2" } } };
      yield { op: { case: "put" as const, value: { key: `${prefix}c`, value: "3" } } };
      yield { op: { case: "delete" as const, value: { key: `${prefix}c` } } };
    })(),
  );
  assert.deepEqual([summary.puts, summary.deletes], [2, 1]);

  // bidi: each answer comes before the next request is sent (a real conversation)
  let answered = 0;
  let gate: () => void = () => undefined;
  const keys = [`${prefix}a`, `${prefix}b`, `${prefix}a`];
  const requests = (async function* () {
    for (const key of keys) {
      const next = new Promise<void>((r) => (gate = r));
      yield { key };
      await next;
    }
  })();
  const values: string[] = [];
  for await (const e of kv.getMany(requests)) {
    values.push(e.value);
    answered++;
    gate();
  }
  assert.deepEqual(values, ["1", "2", "1"]);
  assert.equal(answered, 3);

  // server streaming: existing entries first, then a live change
  const ac = new AbortController();
  const seen: string[] = [];
  const watch = (async () => {
    for await (const ev of kv.watch({ prefix: `${prefix}`, includeExisting: true }, { signal: ac.signal })) {
      seen.push(ev.kind.case === "put" ? `put ${ev.kind.value.key}=${ev.kind.value.value}` : `deleted ${String(ev.kind.value)}`);
      if (seen.length === 2) await kv.put({ key: `${prefix}live`, value: "L" });
      if (seen.length === 3) ac.abort(); // cancel: CANCEL on the wire
    }
  })();
  // cancel
  await failsWith(watch, Code.CANCELLED);
  assert.deepEqual(seen, [`put ${prefix}a=1`, `put ${prefix}b=2`, `put ${prefix}live=L`]);

  // deadline: a watch that gets no event ends with DEADLINE_EXCEEDED
  const t0 = Date.now();
  await failsWith(
    (async () => {
      for await (const _ of kv.watch({ prefix: `${prefix}nothing/` }, { timeoutMs: 200 })) assert.fail("no event expected");
    })(),
    Code.DEADLINE_EXCEEDED,
  );
  assert.ok(Date.now() - t0 >= 150, "not before the deadline");
  await failsWith(kv.get({ key: `${prefix}a` }, { timeoutMs: 0 }), Code.DEADLINE_EXCEEDED);

  // 1 MiB each way, unary and bidi
  const big = "x".repeat(1 << 20);
  await kv.put({ key: `${prefix}big`, value: big });
  assert.equal((await kv.get({ key: `${prefix}big` })).value.length, 1 << 20);
  let bigs = 0;
  for await (const e of kv.getMany([{ key: `${prefix}big` }, { key: `${prefix}big` }])) {
    assert.equal(e.value, big);
    bigs++;
  }
  assert.equal(bigs, 2);

  // 8 MiB back on one bidi call: far past the 1 MiB window, so credit must come back as the
  // client reads (and the server must wait for it)
  let bytes = 0;
  for await (const e of kv.getMany(Array.from({ length: 8 }, () => ({ key: `${prefix}big` })))) bytes += e.value.length;
  assert.equal(bytes, 8 << 20);

  // many calls in flight on one connection
  const many = await Promise.all(Array.from({ length: 200 }, (_, i) => kv.put({ key: `${prefix}m${i % 10}`, value: String(i) })));
  assert.equal(many.length, 200);
  await sleep(0);
  // the connection is still healthy after all of the above
  assert.equal((await kv.get({ key: `${prefix}b` })).value, "2");
}
