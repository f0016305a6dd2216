// WebSocket messages that never complete (the Rust server's test
// `messages_that_never_complete_are_charged_and_cut_at_the_frame_timeout`, docs/hardening.md):
// 16 raw WebSocket connections each announce a 1,000,000-byte message and send 900 KB of it,
// against a server with an 8 MiB memory budget. What the `ws` package holds of them is charged
// to the budget past 64 KiB, no connection reads further while less than a quarter is left, every
// attacker is closed with 1008 at the frame timeout and the charge is given back — while a good
// client is served on the same WebSocket listener.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as net from "node:net";
import { MemoryBudget } from "../src/index.js";
import { echoServer, goodClient, sleep, until } from "./hostile.js";

const ATTACKERS = 16;
const ANNOUNCED = 1_000_000;
const SENT = 900_000;
const BUDGET = 8 << 20;
const FRAME_MS = 1500;

/** A raw WebSocket client: upgrades by hand, then writes what it is told (frames or parts of them). */
class RawWs {
  readonly got: Buffer[] = [];
  closed = false;
  private constructor(readonly sock: net.Socket) {
    sock.on("data", (b: Buffer) => this.got.push(b));
    sock.on("error", () => undefined);
    sock.on("close", () => (this.closed = true));
  }

  static async open(addr: string): Promise<RawWs> {
    const u = new URL(addr);
    const sock = net.connect(Number(u.port), u.hostname);
    await new Promise<void>((r, j) => {
      sock.once("connect", r);
      sock.once("error", j);
    });
    const raw = new RawWs(sock);
    sock.write(
      `GET ${u.pathname} HTTP/1.1\r\nHost: ${u.host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
        `Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: topspin.v1\r\n\r\n`,
    );
    assert.ok(await until(() => Buffer.concat(raw.got).toString("latin1").includes("\r\n\r\n"), 5000), "the upgrade's answer");
    assert.match(Buffer.concat(raw.got).toString("latin1"), /^HTTP\/1\.1 101/);
    return raw;
  }

  /** The header of a masked binary frame of `length` bytes (mask key 0: the payload goes as is). */
  static header(length: number): Buffer {
    const h = Buffer.alloc(14);
    h[0] = 0x82;
    h[1] = 0x80 | 127;
    h.writeBigUInt64BE(BigInt(length), 2);
    return h; // 4 zero bytes of mask key follow the length
  }

  /** Whether the server sent a close frame with `code`. */
  closedWith(code: number): boolean {
    const all = Buffer.concat(this.got);
    const want = Buffer.from([0x88, 0, code >> 8, code & 0xff]);
    for (let i = all.indexOf(0x88); i >= 0; i = all.indexOf(0x88, i + 1)) {
      want[1] = all[i + 1] ?? 0;
      if (all.subarray(i, i + 4).equals(want)) return true;
    }
    return false;
  }
}

test("ws:// messages that never complete are charged to the budget, starve at ¾ of it, and are cut at the frame timeout", async () => {
  const budget = new MemoryBudget(BUDGET);
  const server = echoServer({ memoryBudget: budget, frameTimeoutMs: FRAME_MS });
  const addr = await server.listen("ws://127.0.0.1:0/t");
  const good = goodClient(addr);
  const attackers: RawWs[] = [];
  try {
    assert.ok(await until(() => good.served() > 0), "the good client is served");
    for (let i = 0; i < ATTACKERS; i++) attackers.push(await RawWs.open(addr));
    const t0 = Date.now();
    for (const a of attackers) {
      a.sock.write(RawWs.header(ANNOUNCED));
      a.sock.write(Buffer.alloc(SENT));
    }
    let most = 0;
    const servedBefore = good.served();
    while (Date.now() - t0 < FRAME_MS + 3000 && !attackers.every((a) => a.closed)) {
      most = Math.max(most, budget.used);
      await sleep(5);
    }
    const took = Date.now() - t0;
    assert.ok(most > 0, "what the attackers sent was charged to the budget");
    assert.ok(most <= BUDGET * 0.75 + ATTACKERS * 64 * 1024, `held ${most} bytes: at most ¾ of the ${BUDGET}-byte budget and one read per connection`);
    assert.ok(attackers.every((a) => a.closed), `every attacker closed within ${took} ms`);
    assert.ok(took >= FRAME_MS - 100, `cut after ${took} ms: not before the frame timeout`);
    const told = attackers.filter((a) => a.closedWith(1008)).length;
    assert.ok(told > 0, "the attackers were told 1008 (those the server could still write to)");
    assert.ok(await until(() => budget.used === 0, 2000), `the charge is given back (${budget.used} held)`);
    assert.ok(good.served() > servedBefore, "the good client was served during the attack");
    assert.ok((await good.stop()) > 0);
  } finally {
    await good.stop().catch(() => undefined);
    for (const a of attackers) a.sock.destroy();
    await server.close(200);
  }
});

test("ws:// a connection with no message under way is not cut, and nothing stays charged", async () => {
  const budget = new MemoryBudget(BUDGET);
  const server = echoServer({ memoryBudget: budget, frameTimeoutMs: 300 });
  const addr = await server.listen("ws://127.0.0.1:0/t");
  const quiet = await RawWs.open(addr);
  const good = goodClient(addr);
  try {
    await sleep(700);
    assert.ok(!quiet.closed, "a connection with no message under way stays");
    assert.ok((await good.stop()) > 0);
    assert.equal(budget.used, 0);
  } finally {
    await good.stop().catch(() => undefined);
    quiet.sock.destroy();
    await server.close(200);
  }
});

// A server that ends a WebSocket connection (here: no topspin handshake within its timeout) sends
// a close frame; a peer that never answers it has its socket destroyed a second later, as the
// Rust server does — not after the `ws` package's own 30 s close timeout.
test("ws:// a peer that never answers the server's close is cut a second later", async () => {
  const server = echoServer({ handshakeTimeoutMs: 300 });
  const addr = await server.listen("ws://127.0.0.1:0/t");
  const silent = await RawWs.open(addr); // upgraded, then silent: no hello, no close reply
  const t0 = Date.now();
  try {
    assert.ok(await until(() => silent.closed, 5000), "the silent peer's socket was closed");
    const took = Date.now() - t0;
    assert.ok(took >= 250 && took < 2500, `closed after ${took} ms: the handshake timeout (300 ms) and the 1 s close grace`);
  } finally {
    silent.sock.destroy();
    await server.close(200);
  }
});
