// The WebSocket transport without a network: a fake WebSocket class.
import { test } from "node:test";
import assert from "node:assert/strict";
import { WS_MAX_MESSAGE, sendAsMessages, webSocketDialer, type WebSocketLike } from "../src/index.js";

class FakeWs implements WebSocketLike {
  static last: FakeWs | null = null;
  binaryType = "blob";
  protocol = "";
  readyState = 0;
  sent: Uint8Array[] = [];
  onopen: ((ev: unknown) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onclose: ((ev: { code: number; reason: string }) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;
  constructor(
    readonly url: string,
    readonly protocols: string | string[],
  ) {
    FakeWs.last = this;
  }
  send(data: Uint8Array): void {
    this.sent.push(data.slice());
  }
  close(code?: number): void {
    this.readyState = 3;
    this.onclose?.({ code: code ?? 1005, reason: "" });
  }
  /** The server's answer and its first bytes in one read: open, then a message, same tick. */
  openWith(subprotocol: string, first?: Uint8Array): void {
    this.protocol = subprotocol;
    this.readyState = 1;
    this.onopen?.({});
    if (first) this.onmessage?.({ data: first.buffer.slice(first.byteOffset, first.byteOffset + first.byteLength) });
  }
}

test("ws: bytes that arrive in the same tick as the open are not lost (regression)", async () => {
  const dial = webSocketDialer("ws://x/topspin", FakeWs);
  const p = dial();
  const ws = FakeWs.last as FakeWs;
  assert.deepEqual(ws.protocols, ["topspin.v1"]);
  ws.openWith("topspin.v1", new Uint8Array([0x54, 0x4f, 0x50]));
  const io = await p;
  const got: number[] = [];
  io.onData = (b) => got.push(...b);
  assert.deepEqual(got, [0x54, 0x4f, 0x50]);
  io.onData = (b) => got.push(...b);
  ws.onmessage?.({ data: new Uint8Array([1, 2]).buffer });
  assert.deepEqual(got, [0x54, 0x4f, 0x50, 1, 2]);
});

test("ws: a server that answers without the topspin.v1 subprotocol is refused", async () => {
  const p = webSocketDialer("ws://x/topspin", FakeWs)();
  (FakeWs.last as FakeWs).openWith("");
  await assert.rejects(p, /did not answer with the topspin.v1 subprotocol/);
});

test("ws: writes go out as binary messages of at most 256 KiB, in order (a large chunk uncopied, cut)", async () => {
  const p = webSocketDialer("ws://x/topspin", FakeWs)();
  const ws = FakeWs.last as FakeWs;
  ws.openWith("topspin.v1");
  const io = await p;
  const a = new Uint8Array(300 * 1024).fill(1);
  const b = new Uint8Array(10).fill(2);
  io.write([new Uint8Array([9]), a, b]);
  assert.deepEqual(ws.sent.map((m) => m.length), [1, 256 * 1024, 300 * 1024 - 256 * 1024, 10]);
  const all = new Uint8Array(300 * 1024 + 11);
  let off = 0;
  for (const m of ws.sent) {
    all.set(m, off);
    off += m.length;
  }
  assert.equal(all[0], 9);
  assert.equal(all[1], 1);
  assert.equal(all[all.length - 1], 2);
});

test("ws: a text message closes the connection with 1003", async () => {
  const p = webSocketDialer("ws://x/topspin", FakeWs)();
  const ws = FakeWs.last as FakeWs;
  ws.openWith("topspin.v1");
  const io = await p;
  let closed = "";
  io.onClose = (r) => (closed = r);
  ws.onmessage?.({ data: "hello" });
  assert.match(closed, /1003/);
});

test("sendAsMessages: the stream comes out whole, small chunks coalesced, large ones cut at 256 KiB", () => {
  const chunk = (n: number, seed: number): Uint8Array => Uint8Array.from({ length: n }, (_, i) => (i * 31 + seed) & 0xff);
  const cases: number[][] = [[12, 20], [12, 1 << 20], [12, 20, 12, 300 * 1024, 12, 5], Array.from({ length: 3000 }, () => 100), [WS_MAX_MESSAGE + 1], [0, 7]];
  for (const sizes of cases) {
    const chunks = sizes.map((n, i) => chunk(n, i));
    const sent: Uint8Array[] = [];
    sendAsMessages(chunks, (m) => sent.push(m.slice()));
    const all = (xs: Uint8Array[]): number[] => xs.flatMap((x) => [...x]);
    assert.deepEqual(all(sent), all(chunks), `stream of ${sizes.length} chunks`);
    for (const m of sent) {
      assert.ok(m.length > 0 && m.length <= WS_MAX_MESSAGE, `message of ${m.length} B`);
    }
    const total = sizes.reduce((a, b) => a + b, 0);
    if (sizes.every((n) => n < 16 * 1024)) assert.equal(sent.length, Math.ceil(total / WS_MAX_MESSAGE), "small chunks share messages");
  }
});
