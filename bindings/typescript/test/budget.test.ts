// The memory budget for incoming split messages (protocol.md §9 "Local limits", §7 withheld
// credit), on the sans-IO engine with hand-made client frames: buffers grow with the chunks
// (never above twice what arrived), the budget is shared by connections, new calls are refused
// RESOURCE_EXHAUSTED while it is spent, chunk credit is withheld (one split message per
// connection still goes on) and granted again once memory comes back.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Code, Connection, Flags, FrameDecoder, MemoryBudget, PREFACE, encodeFrame, TopspinError, type Channel, type Event, type Frame } from "../src/index.js";
import { Server, connect } from "../src/node/index.js";

function server(budget: MemoryBudget): { engine: Connection; wakes: () => number } {
  const engine = new Connection("server", { memoryBudget: budget });
  let wakes = 0;
  engine.onWake = () => void wakes++;
  engine.receive(PREFACE);
  engine.receive(encodeFrame({ type: "SETTINGS", flags: 0, callId: 0, entries: [] }));
  const out = concat(engine.takeOutput());
  assert.deepEqual(out.subarray(0, 8), PREFACE);
  engine.takeEvents();
  return { engine, wakes: () => wakes };
}

function concat(parts: Uint8Array[]): Uint8Array {
  const n = parts.reduce((a, p) => a + p.length, 0);
  const out = new Uint8Array(n);
  let off = 0;
  for (const p of parts) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}

/** The frames the engine sent since the last look. */
function sent(engine: Connection): Frame[] {
  const d = new FrameDecoder(1 << 24);
  d.push(concat(engine.takeOutput()));
  const frames: Frame[] = [];
  for (let f = d.next(); f !== null; f = d.next()) frames.push(f);
  return frames;
}

const credits = (frames: Frame[], callId: number): number =>
  frames.reduce((a, f) => a + (f.type === "CREDIT" && f.callId === callId ? f.increment : 0), 0);

const call = (callId: number): Frame => ({ type: "CALL", flags: Flags.NAMED, callId, methodId: 0, methodName: "/t.T/M", codec: 0, timeoutUs: 0n, metadata: [] });
const first = (callId: number, totalLen: number, n: number): Frame => ({ type: "MESSAGE", flags: Flags.SPLIT, callId, endStream: false, totalLen, chunk: new Uint8Array(n).fill(callId) });
const more = (callId: number, n: number): Frame => ({ type: "CONTINUATION", flags: 0, callId, chunk: new Uint8Array(n).fill(callId) });

function events(engine: Connection): Event[] {
  return engine.takeEvents();
}

test("budget: buffers grow with the chunks; spent → new calls refused on every connection, chunk credit withheld, granted again on release", () => {
  const budget = new MemoryBudget(64 * 1024);
  const { engine: s } = server(budget);
  const { engine: s2 } = server(budget);
  s.receive(encodeFrame(call(1)));
  s.receive(encodeFrame(call(3)));
  assert.equal(events(s).filter((e) => e.type === "CallStarted").length, 2);
  sent(s);

  // call 1: 40 000 of 300 000 bytes arrived → an 80 000-byte buffer (2×), budget spent
  s.receive(encodeFrame(first(1, 300_000, 40_000)));
  assert.equal(budget.used, 80_000);
  assert.ok(budget.exhausted);
  assert.equal(credits(sent(s), 1), 12 + 4 + 40_000, "the first split message of the connection goes on");

  // call 3: its chunk credit is withheld
  s.receive(encodeFrame(first(3, 100_000, 1000)));
  assert.equal(budget.used, 82_000);
  assert.equal(credits(sent(s), 3), 0, "chunk credit withheld while the budget is spent");

  // new calls are refused, here and on another connection of the process
  s.receive(encodeFrame(call(5)));
  s2.receive(encodeFrame(call(1)));
  for (const [engine, id] of [[s, 5], [s2, 1]] as const) {
    const end = sent(engine).find((f) => f.type === "END" && f.callId === id);
    assert.ok(end !== undefined && end.type === "END");
    assert.equal(end.code, Code.RESOURCE_EXHAUSTED);
    assert.match(end.message, /process memory budget for incoming messages exhausted \(65536 bytes\)/);
    assert.equal(events(engine).filter((e) => e.type === "CallStarted").length, 0);
  }

  // call 1 goes on: 90 000 arrived → the buffer grows to 180 000 (2×)
  s.receive(encodeFrame(more(1, 50_000)));
  assert.equal(budget.used, 182_000);
  assert.equal(credits(sent(s), 1), 12 + 50_000);

  // call 1 completes: its memory is released, call 3's withheld credit is granted at once
  s.receive(encodeFrame(more(1, 210_000)));
  const msgs = events(s).filter((e) => e.type === "Message");
  assert.equal(msgs.length, 1);
  assert.equal(msgs[0]?.type === "Message" && msgs[0].message.length, 300_000);
  assert.equal(budget.used, 2000);
  assert.ok(!budget.exhausted);
  const out = sent(s);
  assert.equal(credits(out, 3), 12 + 4 + 1000, "the withheld credit came back");
  assert.equal(credits(out, 1), 12 + 210_000);

  // new calls are taken again; call 3 completes and the budget is empty
  s.receive(encodeFrame(call(7)));
  assert.equal(events(s).filter((e) => e.type === "CallStarted").length, 1);
  s.receive(encodeFrame(more(3, 99_000)));
  assert.equal(events(s).filter((e) => e.type === "Message").length, 1);
  assert.equal(budget.used, 0);
});

test("budget: memory released by another connection wakes the waiting one; a cancelled split releases its memory", () => {
  const budget = new MemoryBudget(64 * 1024);
  const a = server(budget);
  const b = server(budget);
  a.engine.receive(encodeFrame(call(1)));
  a.engine.receive(encodeFrame(call(3)));
  a.engine.receive(encodeFrame(call(5)));
  // b holds a large incomplete message (the privileged one of its connection)
  b.engine.receive(encodeFrame(call(1)));
  b.engine.receive(encodeFrame(first(1, 1_000_000, 60_000)));
  assert.ok(budget.exhausted);
  // a: one split goes on, the second waits
  a.engine.receive(encodeFrame(first(1, 10_000, 100)));
  a.engine.receive(encodeFrame(first(3, 10_000, 100)));
  let out = sent(a.engine);
  assert.equal(credits(out, 1), 116);
  assert.equal(credits(out, 3), 0);
  // the privileged split of `a` ends by CANCEL: its memory goes, and the budget being still
  // spent, the next split of the connection is let go on (§7: one per connection)
  a.engine.receive(encodeFrame({ type: "CANCEL", flags: 0, callId: 1, code: Code.CANCELLED }));
  assert.equal(budget.used, 120_000 + 200);
  out = sent(a.engine);
  assert.equal(credits(out, 3), 116, "the next split message goes on");
  // `b`'s call is cancelled: memory comes back, `a` is woken (its driver writes the CREDITs)
  a.engine.receive(encodeFrame(first(5, 10_000, 100)));
  assert.equal(credits(sent(a.engine), 5), 0, "withheld");
  const before = a.wakes();
  b.engine.receive(encodeFrame({ type: "CANCEL", flags: 0, callId: 1, code: Code.CANCELLED }));
  assert.equal(budget.used, 400);
  assert.equal(a.wakes(), before + 1);
  assert.equal(credits(sent(a.engine), 5), 116, "granted again once memory is available");
});

test("budget: a lost connection releases what its split messages held", () => {
  const budget = new MemoryBudget();
  const { engine } = server(budget);
  engine.receive(encodeFrame(call(1)));
  engine.receive(encodeFrame(first(1, 1 << 20, 1000)));
  assert.equal(budget.used, 2000);
  engine.transportClosed("gone");
  assert.equal(budget.used, 0);
});

test("budget over TCP: concurrent 1 MiB split requests on two connections past a 256 KiB budget all complete", async () => {
  const budget = new MemoryBudget(256 * 1024);
  let peak = 0;
  const reserve = budget.reserve.bind(budget);
  budget.reserve = (n: number): void => {
    reserve(n);
    peak = Math.max(peak, budget.used);
  };
  const server = new Server({ memoryBudget: budget, settings: { maxFrameSize: 16384, initialCallWindow: 32768 } }).route("/t.T/Echo", {
    kind: "unary",
    decode: (b) => b,
    encode: (v) => v as Uint8Array,
    handler: (r) => (r as Uint8Array).subarray(0, 8),
  });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const channels = [connect(addr), connect(addr)];
  try {
    let refused = 0;
    // A call that arrives while the budget is spent is refused RESOURCE_EXHAUSTED: try again.
    const one = async (ch: Channel, i: number): Promise<void> => {
      for (let attempt = 0; attempt < 500; attempt++) {
        const c = await ch.start("/t.T/Echo", { timeoutMs: 60_000 });
        try {
          await c.send(new Uint8Array(1 << 20).fill(i), true);
          assert.deepEqual(Array.from((await c.receive()) ?? []), Array.from(new Uint8Array(8).fill(i)));
          await c.end();
          return;
        } catch (e) {
          if (!(e instanceof TopspinError && e.code === Code.RESOURCE_EXHAUSTED && /memory budget/.test(e.rawMessage))) throw e;
          refused++;
          await new Promise((r) => setTimeout(r, 10));
        }
      }
      assert.fail(`call ${i} refused ${refused} times`);
    };
    await Promise.all(channels.flatMap((ch, k) => [one(ch, 2 * k + 1), one(ch, 2 * k + 2), one(ch, 2 * k + 3)]));
    assert.ok(peak >= budget.limit, `the budget was spent at some point (peak ${peak})`);
    assert.equal(budget.used, 0);
  } finally {
    for (const ch of channels) ch.close();
    await server.close(1000);
  }
});
