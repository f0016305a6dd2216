// Each connection's incomplete split messages are charged to its share of the memory budget
// (1 / SHARE_OF_BUDGET of it, as Rust's `MemoryBudget::share_of`): past the share its chunk
// credit is withheld (one split message per connection still goes on), so one connection that
// uploads many large split messages cannot spend the budget that other connections' calls need.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as net from "node:net";
import { Connection, MemoryBudget, SHARE_OF_BUDGET } from "../src/index.js";
import { echoServer, goodClient, sleep, until } from "./hostile.js";

const BUDGET = 64 << 20;
const MESSAGES = 8;
const MESSAGE = 12 << 20; // 8 × 12 MiB = 96 MiB announced: more than the budget

test("budget share over TCP: one connection's split uploads stay within its share; a good client on another connection is served", async () => {
  const budget = new MemoryBudget(BUDGET);
  const server = echoServer({ memoryBudget: budget, settings: { maxFrameSize: 256 * 1024 }, grpc: false }).route("/t.T/Up", {
    kind: "client_streaming",
    decode: (b) => b,
    encode: (v) => v as Uint8Array,
    handler: async (input: unknown) => {
      for await (const m of input as AsyncIterable<Uint8Array>) void m; // takes every message, never returns
      return new Uint8Array(0);
    },
  });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const sock = net.connect(Number(addr.split(":").pop()), "127.0.0.1");
  sock.on("error", () => undefined);
  await new Promise((r) => sock.once("connect", r));
  const engine = new Connection("client");
  const pushOut = (): void => {
    if (engine.outputBytes > 0) sock.write(Buffer.concat(engine.takeOutput()));
  };
  sock.on("data", (b: Buffer) => {
    engine.receive(b);
    engine.takeEvents();
    pushOut(); // chunks sent as the server grants credit
  });
  pushOut();
  assert.ok(await until(() => engine.established), "handshake");
  let most = 0;
  const good = goodClient(addr, 300);
  try {
    for (let i = 0; i < MESSAGES; i++) assert.ok(engine.sendMessage(engine.startCall("/t.T/Up", 0, 0n, []), new Uint8Array(MESSAGE).fill(i)));
    pushOut();
    for (let i = 0; i < 150; i++) {
      await sleep(10);
      most = Math.max(most, budget.used);
    }
    // the share, plus the one split message that goes on and the initial windows (1 MiB a call)
    const bound = BUDGET / SHARE_OF_BUDGET + 2 * MESSAGE + MESSAGES * (1 << 20);
    assert.ok(most <= bound, `one connection held ${most} bytes of the ${BUDGET}-byte budget (its share ${BUDGET / SHARE_OF_BUDGET}; bound ${bound})`);
    assert.ok(await until(() => good.served() >= 30), "a good client on another connection is served meanwhile");
  } finally {
    const served = good.stop();
    sock.destroy();
    assert.ok((await served) >= 30, "the good client's calls succeed (none refused RESOURCE_EXHAUSTED)");
    await server.close(200);
  }
});
