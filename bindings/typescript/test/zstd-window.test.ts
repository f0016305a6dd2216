// zstd frames that ask for more memory than this side gives (RFC 8878 frame header: the
// Window_Descriptor, or Frame_Content_Size for a single-segment frame): refused from the header
// before fzstd allocates anything, in every decoder path (the Node server, the Node and browser
// codec sets the clients use); declared content sizes over max_message_size are refused too.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as net from "node:net";
import { Code, Connection, TopspinError } from "../src/index.js";
import { ENCODING_KEY, ZSTD_MAX_WINDOW, checkZstdFrames, decodeMessage, webCodecs, zstd } from "../src/compression.js";
import { connect, nodeCodecs, nodeServerCodecs } from "../src/node/index.js";
import { Raw, echoServer, goodClient, until } from "./hostile.js";

const MAGIC = [0x28, 0xb5, 0x2f, 0xfd];
const LAST_EMPTY_RAW_BLOCK = [0x01, 0x00, 0x00];
/** A frame with Window_Descriptor `wd` (exponent << 3 | mantissa) and one empty block. */
const windowFrame = (wd: number): Uint8Array => Uint8Array.from([...MAGIC, 0x00, wd, ...LAST_EMPTY_RAW_BLOCK]);
/** A single-segment frame declaring an 8-byte Frame_Content_Size of `size`. */
function singleSegment(size: number): Uint8Array {
  const fcs = new Uint8Array(8);
  new DataView(fcs.buffer).setBigUint64(0, BigInt(size), true);
  return Uint8Array.from([...MAGIC, 0xe0, ...fcs, ...LAST_EMPTY_RAW_BLOCK]);
}
const GiB = 2 ** 30;
const flagged = (b: Uint8Array): Uint8Array => Uint8Array.from([1, ...b]);

async function refusedWith(p: Promise<unknown>, code: Code, pattern: RegExp): Promise<void> {
  await assert.rejects(p, (e: unknown) => e instanceof TopspinError && e.code === code && pattern.test(e.rawMessage));
}

test("zstd: a window over 8 MiB (or a single-segment frame over it) is refused from its header, nothing allocated", async () => {
  assert.equal(ZSTD_MAX_WINDOW, 8 << 20);
  // every TS decoder path uses the same checked decoder
  assert.equal(nodeCodecs.decoders.zstd, zstd);
  assert.equal(webCodecs.decoders.zstd, zstd);
  const before = process.memoryUsage().arrayBuffers;
  const bombs = [windowFrame(20 << 3) /* 1 GiB */, windowFrame((31 << 3) | 7) /* 3.75 TiB */, windowFrame((13 << 3) | 1) /* 9 MiB */];
  for (const b of bombs) await refusedWith(decodeMessage(flagged(b), zstd, 64 << 20), Code.RESOURCE_EXHAUSTED, /window of \d+ bytes/);
  // one segment: the declared content is the window, bounded by the message limit
  await refusedWith(decodeMessage(flagged(singleSegment(GiB)), zstd, 64 << 20), Code.RESOURCE_EXHAUSTED, /./);
  const grew = process.memoryUsage().arrayBuffers - before;
  assert.ok(grew < 16 << 20, `arrayBuffers grew ${grew} bytes`);
  // at the limit: 8 MiB windows pass
  assert.equal((await decodeMessage(flagged(windowFrame(13 << 3)), zstd, 1024)).length, 0);
  // a declared content size over the limit: RESOURCE_EXHAUSTED before decoding
  const fcs = Uint8Array.from([...MAGIC, 0xc0, 0x50, 0, 0, 0, 0x80, 0, 0, 0, 0, ...LAST_EMPTY_RAW_BLOCK]);
  await refusedWith(decodeMessage(flagged(fcs), zstd, 64 << 20), Code.RESOURCE_EXHAUSTED, /max_message_size/);
  // a second frame is checked as well as the first; a block over 128 KiB is corrupt
  await refusedWith(decodeMessage(flagged(Uint8Array.from([...windowFrame(0x50), ...windowFrame(20 << 3)])), zstd, 1024), Code.RESOURCE_EXHAUSTED, /window/);
  assert.throws(() => checkZstdFrames(Uint8Array.from([...MAGIC, 0x00, 0x50, 0x01 | (0x20001 << 3) & 0xff, (0x20001 << 3) >> 8 & 0xff, (0x20001 << 3) >> 16]), 1 << 20), /Block_Maximum_Size/);
});

test("zstd bomb against the Node server: refused RESOURCE_EXHAUSTED without allocating; the default server does not decode zstd", async () => {
  const server = echoServer({ codecs: nodeCodecs });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const plain = echoServer();
  const plainAddr = await plain.listen("tcp://127.0.0.1:0");
  const good = goodClient(addr);
  try {
    const before = process.memoryUsage();
    const r = await Raw.open(addr);
    r.handshake();
    for (const [id, bomb] of [[1, windowFrame(20 << 3)], [3, singleSegment(GiB + 1)]] as const) {
      r.call(id, "/t.T/Echo", [{ key: ENCODING_KEY, value: "zstd" }]);
      r.message(id, flagged(bomb));
    }
    assert.ok(await until(() => r.frames.filter((f) => f.type === "END").length === 2));
    for (const f of r.frames) if (f.type === "END") assert.equal(f.code, Code.RESOURCE_EXHAUSTED, f.message);
    const after = process.memoryUsage();
    assert.ok(after.arrayBuffers - before.arrayBuffers < 32 << 20 && after.rss - before.rss < 100 << 20, "no GiB allocated");
    assert.ok(!r.closed, "a call error, the connection goes on");
    r.destroy();
    // by default the Node server decodes gzip only: zstd requests are UNIMPLEMENTED
    assert.equal(nodeServerCodecs.decoders.zstd, undefined);
    const p = await Raw.open(plainAddr);
    p.handshake();
    p.call(1, "/t.T/Echo", [{ key: ENCODING_KEY, value: "zstd" }]);
    p.message(1, flagged(windowFrame(20 << 3)));
    const end = await p.frame("END");
    assert.equal(end.code, Code.UNIMPLEMENTED);
    assert.match(end.message, /accepted: gzip/);
    p.destroy();
    assert.ok((await good.stop()) > 0);
  } finally {
    await good.stop().catch(() => undefined);
    await server.close(100);
    await plain.close(100);
  }
});

test("zstd bomb in a response: the Node client cancels the call RESOURCE_EXHAUSTED without allocating", async () => {
  // a hand-made server engine answering every call with HEADERS (zstd) and a bomb
  const srv = net.createServer((s) => {
    const engine = new Connection("server");
    const flush = (): void => void s.write(Buffer.concat(engine.takeOutput()));
    s.on("error", () => undefined);
    s.on("data", (b: Buffer) => {
      engine.receive(b);
      for (const e of engine.takeEvents()) {
        if (e.type !== "CallStarted") continue;
        engine.sendHeaders(e.callId, [{ key: ENCODING_KEY, value: "zstd" }]);
        engine.sendMessage(e.callId, flagged(windowFrame(20 << 3)));
      }
      flush();
    });
    flush();
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const ch = connect(`tcp://127.0.0.1:${(srv.address() as net.AddressInfo).port}`, { compression: "gzip" });
  try {
    const before = process.memoryUsage().arrayBuffers;
    const call = await ch.start("/t.T/Echo");
    await call.send(new Uint8Array([1]), true);
    await refusedWith(call.receive(), Code.RESOURCE_EXHAUSTED, /window/);
    assert.ok(process.memoryUsage().arrayBuffers - before < 32 << 20);
  } finally {
    ch.close();
    srv.close();
  }
});
