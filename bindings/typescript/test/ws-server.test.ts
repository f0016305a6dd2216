// The Node server over WebSocket (protocol.md §14.2): the TypeScript client and the Rust
// `topspin` CLI call it on ws://; upgrades that §14.2 says to refuse are refused; a text
// message closes the connection with 1003.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import WebSocket from "ws";
import { Server, connect, originAllowed } from "../src/node/index.js";
import { WS_SUBPROTOCOL } from "../src/index.js";
import { Store } from "../gen/kv/v1/kv_pb.js";
import { kvStore } from "../examples/kvstore.js";
import { kvSuite } from "./suite.js";
import { binary, repoRoot, run } from "./procs.js";

test("TypeScript client ↔ Node server over ws://: every call kind, 1 MiB", async () => {
  const server = new Server().service(Store, kvStore());
  const addr = await server.listen("ws://127.0.0.1:0/topspin");
  assert.match(addr, /^ws:\/\/127\.0\.0\.1:\d+\/topspin$/);
  const ch = connect(addr);
  try {
    await kvSuite(ch, "ws/");
  } finally {
    ch.close();
    await server.close(1000);
  }
});

test("Rust topspin CLI → Node server over ws://", async () => {
  const cli = binary("TOPSPIN_CLI");
  const server = new Server().service(Store, kvStore());
  const addr = await server.listen("ws://127.0.0.1:0/topspin");
  const proto = ["--proto", "kv/v1/kv.proto", "-I", join(repoRoot, "examples/kvstore/proto")];
  const call = (method: string, args: string[], input?: string): Promise<{ code: number | null; stdout: string; stderr: string }> =>
    run(cli, ["call", ...proto, ...args, addr, `kv.v1.Store/${method}`], input);
  const dir = mkdtempSync(join(tmpdir(), "topspin-ts-ws-"));
  try {
    let r = await call("Put", ["-d", '{"key": "a", "value": "1"}']);
    assert.equal(r.code, 0, r.stderr);
    assert.equal((JSON.parse(r.stdout) as { version: string }).version, "1");
    r = await call("Get", ["-d", '{"key": "zz"}']);
    assert.equal(r.code, 69, r.stderr); // NOT_FOUND: exit 64 + 5
    r = await call("GetMany", [], '{"key": "a"}\n{"key": "a"}\n');
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(
      r.stdout.trim().split("\n").map((l) => (JSON.parse(l) as { value: string }).value),
      ["1", "1"],
    );
    // 1 MiB each way: the stream crosses many WebSocket messages (at most 256 KiB each).
    const big = "w".repeat(1 << 20);
    writeFileSync(join(dir, "big.json"), JSON.stringify({ key: "big", value: big }));
    r = await call("Put", ["-d", `@${join(dir, "big.json")}`]);
    assert.equal(r.code, 0, r.stderr);
    r = await call("Get", ["-d", '{"key": "big"}']);
    assert.equal(r.code, 0, r.stderr);
    assert.equal((JSON.parse(r.stdout) as { value: string }).value, big);
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await server.close(1000);
  }
});

/** Opens a WebSocket with `protocols` and `origin`; resolves with the HTTP status of a refusal, or "open". */
function upgrade(url: string, protocols: string[], origin?: string): Promise<number | "open"> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, protocols, origin === undefined ? {} : { origin });
    ws.on("open", () => {
      ws.close();
      resolve("open");
    });
    ws.on("unexpected-response", (_req, res) => {
      resolve(res.statusCode ?? 0);
      res.resume();
      ws.terminate();
    });
    ws.on("error", (e) => reject(e));
  });
}

test("Node server over ws://: 404 on another path, 400 without topspin.v1, 403 for an origin off the allow-list", async () => {
  const server = new Server({ webSocket: { allowedOrigins: ["http://good.example"] } }).service(Store, kvStore());
  const addr = await server.listen("ws://127.0.0.1:0/topspin");
  const other = addr.replace(/\/topspin$/, "/elsewhere");
  try {
    assert.equal(await upgrade(other, [WS_SUBPROTOCOL]), 404);
    assert.equal(await upgrade(addr, ["chat"]), 400);
    assert.equal(await upgrade(addr, [WS_SUBPROTOCOL], "http://evil.example"), 403);
    assert.equal(await upgrade(addr, ["chat", WS_SUBPROTOCOL], "http://good.example"), "open");
    assert.equal(await upgrade(addr, [WS_SUBPROTOCOL]), "open"); // no Origin: not a browser
  } finally {
    await server.close(1000);
  }
});

test("Node server over ws://: by default a foreign Origin is refused 403 (cross-site WebSocket hijacking); same-origin and no Origin pass; \"*\" opts out", async () => {
  const server = new Server().service(Store, kvStore());
  const addr = await server.listen("ws://127.0.0.1:0/topspin");
  const port = new URL(addr).port;
  const open = new Server({ webSocket: { allowedOrigins: "*" } }).service(Store, kvStore());
  const openAddr = await open.listen("ws://127.0.0.1:0/topspin");
  const ch = connect(addr); // a Node client sends no Origin: served throughout
  try {
    await kvSuite(ch, "origin/");
    assert.equal(await upgrade(addr, [WS_SUBPROTOCOL], "http://evil.example"), 403);
    assert.equal(await upgrade(addr, [WS_SUBPROTOCOL], `http://localhost:${port}`), 403, "another host name is another origin");
    assert.equal(await upgrade(addr, [WS_SUBPROTOCOL], "http://127.0.0.1:1"), 403, "another port is another origin");
    assert.equal(await upgrade(addr, [WS_SUBPROTOCOL], "null"), 403);
    assert.equal(await upgrade(addr, [WS_SUBPROTOCOL], `http://127.0.0.1:${port}`), "open", "same-origin");
    assert.equal(await upgrade(addr, [WS_SUBPROTOCOL]), "open", "no Origin: not a browser");
    assert.equal(await upgrade(openAddr, [WS_SUBPROTOCOL], "http://evil.example"), "open", "allowedOrigins: \"*\"");
    await kvSuite(ch, "origin2/");
  } finally {
    ch.close();
    await server.close(1000);
    await open.close(1000);
  }
});

test("originAllowed: host and port compared, default ports, case, Host headers that are not a bare host", () => {
  assert.ok(originAllowed(undefined, "a.example", undefined));
  assert.ok(originAllowed("https://App.Example", "app.example", undefined));
  assert.ok(originAllowed("https://app.example", "app.example:443", undefined));
  assert.ok(originAllowed("http://app.example", "app.example:80", undefined));
  assert.ok(!originAllowed("https://app.example", "app.example:80", undefined));
  assert.ok(!originAllowed("http://app.example", undefined, undefined));
  assert.ok(!originAllowed("http://evil.example", "evil.example@app.example", undefined));
  assert.ok(!originAllowed("http://app.example", "app.example/x", undefined));
  assert.ok(!originAllowed("file://app.example", "app.example", undefined));
  assert.ok(originAllowed("http://evil.example", "app.example", ["http://evil.example"]));
  assert.ok(originAllowed("http://evil.example", "app.example", "*"));
});

test("Node server over ws://: a text message closes the connection with 1003; the subprotocol is answered", async () => {
  const server = new Server().service(Store, kvStore());
  const addr = await server.listen("ws://127.0.0.1:0/topspin");
  try {
    const ws = new WebSocket(addr, [WS_SUBPROTOCOL]);
    const first = new Promise<Buffer>((r) => ws.once("message", (d: Buffer) => r(d)));
    await new Promise((r, j) => {
      ws.once("open", r);
      ws.once("error", j);
    });
    assert.equal(ws.protocol, WS_SUBPROTOCOL);
    // The server speaks first (§14.2): its preface arrives without ours.
    assert.equal((await first).subarray(0, 4).toString("latin1"), "TOPS");
    const closed = new Promise<number>((r) => ws.once("close", (code: number) => r(code)));
    ws.send("hello", { binary: false });
    assert.equal(await closed, 1003);
  } finally {
    await server.close(1000);
  }
});
