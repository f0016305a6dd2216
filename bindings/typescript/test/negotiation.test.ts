// Compression negotiation (protocol.md §15) on calls: the client's `compression` option (per
// channel and per call), the Node server decoding requests per their encoding and compressing
// responses for clients that accept it, bounded decompression, and interop with Rust.
import { test } from "node:test";
import assert from "node:assert/strict";
import { gzipSync } from "node:zlib";
import { Code, createClient, type Metadata } from "../src/index.js";
import { ACCEPT_ENCODING_KEY, ENCODING_KEY, encodeMessage, gzipWebEncode, gzipWeb, type Codecs } from "../src/compression.js";
import { Server, connect, gzip, gzipEncode, nodeCodecs } from "../src/node/index.js";
import { Store } from "../gen/kv/v1/kv_pb.js";
import { kvStore } from "../examples/kvstore.js";
import { failsWith, kvSuite } from "./suite.js";
import { binary, repoRoot, run, startServer, stop } from "./procs.js";
import { join } from "node:path";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";

/** nodeCodecs with counters on every encode and decode. */
function counted(): { codecs: Codecs; n: { enc: number; dec: number } } {
  const n = { enc: 0, dec: 0 };
  const codecs: Codecs = {
    encoders: { gzip: (m) => (n.enc++, gzipEncode(m)) },
    decoders: {
      gzip: (b, l) => (n.dec++, gzip(b, l)),
      zstd: nodeCodecs.decoders.zstd,
    },
  };
  return { codecs, n };
}

const value = (md: Metadata, key: string): unknown => md.find((m) => m.key === key)?.value;

test("encodeMessage: flag 0 below 1 KiB and for what does not shrink, flag 1 otherwise; round trips", async () => {
  const small = new Uint8Array(1023).fill(7);
  const s = await encodeMessage(small, gzipEncode);
  assert.equal(s[0], 0);
  assert.deepEqual(s.subarray(1), small);
  const big = new Uint8Array(4096).fill(7);
  for (const enc of [gzipEncode, gzipWebEncode]) {
    const b = await encodeMessage(big, enc);
    assert.equal(b[0], 1);
    assert.ok(b.length < 200);
    assert.deepEqual(await gzipWeb(b.subarray(1), 4096), big);
  }
  const noise = new Uint8Array(4096).map(() => Math.floor(Math.random() * 256));
  const r = await encodeMessage(noise, gzipEncode);
  assert.equal(r[0], 0);
  assert.deepEqual(r.subarray(1), noise);
});

test("node client (gzip) ↔ node server (gzip): every call kind, compressed both ways", async () => {
  const srv = counted();
  const cli = counted();
  const server = new Server({ compression: "gzip", codecs: srv.codecs }).service(Store, kvStore());
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr, { compression: "gzip", codecs: cli.codecs });
  try {
    await kvSuite(ch, "z/");
    // the 1 MiB messages went compressed each way (small ones go with flag 0, not counted)
    assert.ok(cli.n.enc >= 1 && srv.n.dec >= 1, `requests compressed: ${JSON.stringify([cli.n, srv.n])}`);
    assert.ok(srv.n.enc >= 10 && cli.n.dec >= 10, `responses compressed: ${JSON.stringify([cli.n, srv.n])}`);
    // the server announced its encoding in HEADERS
    const kv = createClient(Store, ch);
    let headers: Metadata = [];
    await kv.get({ key: "z/a" }, { onHeader: (h) => (headers = h) });
    assert.equal(value(headers, ENCODING_KEY), "gzip");
    // per call: "identity" turns it off on a compressing channel; the server then does not compress
    headers = [];
    const before = { ...srv.n };
    assert.equal((await kv.get({ key: "z/big" }, { compression: "identity", onHeader: (h) => (headers = h) })).value.length, 1 << 20);
    assert.equal(value(headers, ENCODING_KEY), undefined);
    assert.deepEqual(srv.n, before);
  } finally {
    ch.close();
    await server.close(1000);
  }
});

test("per-call compression on a plain channel; a server without compression answers plainly", async () => {
  const srv = counted();
  const server = new Server({ codecs: srv.codecs }).service(Store, kvStore());
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr);
  try {
    const kv = createClient(Store, ch);
    await kv.put({ key: "p/big", value: "q".repeat(1 << 20) }, { compression: "gzip" });
    assert.equal(srv.n.dec, 1);
    let headers: Metadata = [];
    assert.equal((await kv.get({ key: "p/big" }, { compression: "gzip", onHeader: (h) => (headers = h) })).value.length, 1 << 20);
    assert.equal(value(headers, ENCODING_KEY), undefined);
    assert.equal(srv.n.enc, 0);
    // zstd: this build has no zstd encoder, the call fails locally and says so
    await failsWith(kv.get({ key: "p/big" }, { compression: "zstd" }), Code.UNIMPLEMENTED);
  } finally {
    ch.close();
    await server.close(1000);
  }
});

test("server: an encoding it cannot decode is UNIMPLEMENTED naming the accepted ones (and in trailers)", async () => {
  const server = new Server({ codecs: { encoders: {}, decoders: { zstd: nodeCodecs.decoders.zstd } } }).service(Store, kvStore());
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr);
  try {
    const err = await failsWith(createClient(Store, ch).get({ key: "a" }, { compression: "gzip" }), Code.UNIMPLEMENTED);
    assert.match(err.rawMessage, /gzip.*accepted: zstd/);
    assert.equal(value(err.metadata, ACCEPT_ENCODING_KEY), "zstd");
  } finally {
    ch.close();
    await server.close(1000);
  }
});

test("zip bombs: decompression is bounded by MAX_MESSAGE_SIZE each way → RESOURCE_EXHAUSTED", async () => {
  const zeros = new Uint8Array(4 << 20);
  const server = new Server({ settings: { maxMessageSize: 1 << 20 }, compression: "gzip" })
    .route("/t.T/Echo", { kind: "unary", decode: (b) => b, encode: (v) => v as Uint8Array, handler: (r) => r })
    .route("/t.T/Bomb", { kind: "unary", decode: (b) => b, encode: (v) => v as Uint8Array, handler: () => zeros });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const ch = connect(addr, { settings: { maxMessageSize: 1 << 20 }, compression: "gzip" });
  try {
    assert.ok(gzipSync(zeros).length < 8192, "a small payload on the wire");
    // request: 4 MiB of zeros, a few KiB compressed, decodes past the server's 1 MiB
    let call = await ch.start("/t.T/Echo");
    await call.send(zeros, true);
    await failsWith(call.end(), Code.RESOURCE_EXHAUSTED);
    // response: the client stops decoding at its 1 MiB and cancels
    call = await ch.start("/t.T/Bomb");
    await call.send(new Uint8Array(0), true);
    await failsWith(call.receive(), Code.RESOURCE_EXHAUSTED);
    // the connection goes on
    call = await ch.start("/t.T/Echo");
    await call.send(new Uint8Array(2000).fill(1), true);
    assert.equal((await call.receive())?.length, 2000);
  } finally {
    ch.close();
    await server.close(1000);
  }
});

test("TypeScript client with gzip → Rust kvstore-server (decodes gzip): every call kind", async () => {
  const { proc, address } = await startServer(binary("KVSTORE_SERVER"), ["tcp://127.0.0.1:0"]);
  const cli = counted();
  const ch = connect(address, { compression: "gzip", codecs: cli.codecs });
  try {
    await kvSuite(ch, "tsz/");
    assert.ok(cli.n.enc >= 1, "the 1 MiB requests went compressed");
  } finally {
    ch.close();
    await stop(proc);
  }
});

test("Rust topspin CLI → TypeScript server that compresses for clients that accept it: unaffected", async () => {
  const srv = counted();
  const server = new Server({ compression: "gzip", codecs: srv.codecs }).service(Store, kvStore());
  const addr = (await server.listen("tcp://127.0.0.1:0")).replace("tcp://", "");
  const proto = ["--proto", "kv/v1/kv.proto", "-I", join(repoRoot, "examples/kvstore/proto")];
  const call = (method: string, data: string): ReturnType<typeof run> => run(binary("TOPSPIN_CLI"), ["call", ...proto, "-d", data, addr, `kv.v1.Store/${method}`]);
  try {
    const big = "w".repeat(1 << 20);
    const dir = mkdtempSync(join(tmpdir(), "topspin-ts-"));
    writeFileSync(join(dir, "big.json"), JSON.stringify({ key: "big", value: big }));
    let r = await call("Put", `@${join(dir, "big.json")}`);
    assert.equal(r.code, 0, r.stderr);
    r = await call("Get", '{"key": "big"}');
    assert.equal(r.code, 0, r.stderr);
    assert.equal((JSON.parse(r.stdout) as { value: string }).value, big);
    r = await call("Apply", '{"put": {"key": "b", "value": "2"}} {"delete": {"key": "b"}}');
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), { puts: 1, deletes: 1 });
    assert.equal(srv.n.enc, 0, "the CLI accepts no encoding: nothing compressed for it");
  } finally {
    await server.close(1000);
  }
});

test("server compresses only with an encoding the client accepts", async () => {
  const srv = counted();
  const server = new Server({ compression: "gzip", codecs: srv.codecs }).service(Store, kvStore());
  const addr = await server.listen("tcp://127.0.0.1:0");
  // this client sends gzip but decodes only zstd: `topspin-accept-encoding: zstd`
  const ch = connect(addr, { compression: "gzip", codecs: { encoders: { gzip: gzipEncode }, decoders: { zstd: nodeCodecs.decoders.zstd } } });
  try {
    const kv = createClient(Store, ch);
    await kv.put({ key: "acc/big", value: "v".repeat(1 << 20) });
    let headers: Metadata = [];
    assert.equal((await kv.get({ key: "acc/big" }, { onHeader: (h) => (headers = h) })).value.length, 1 << 20);
    assert.equal(value(headers, ENCODING_KEY), undefined);
    assert.equal(srv.n.enc, 0);
    assert.equal(srv.n.dec, 1, "the request was gzip-compressed and decoded");
  } finally {
    ch.close();
    await server.close(1000);
  }
});
