// Interop with the Rust implementation over TCP, both ways:
// - the TypeScript client against the Rust kvstore-server (examples/kvstore): every call kind,
//   a deadline, a cancel, error statuses, 1 MiB messages;
// - the Rust `topspin` CLI against the TypeScript (Node) server: the same.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync, writeFileSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Server, connect } from "../src/node/index.js";
import { Store } from "../gen/kv/v1/kv_pb.js";
import { kvStore } from "../examples/kvstore.js";
import { kvSuite } from "./suite.js";
import { binary, repoRoot, run, startServer, stop } from "./procs.js";

test("TypeScript client → Rust kvstore-server over TCP", async () => {
  const { proc, address } = await startServer(binary("KVSTORE_SERVER"), ["tcp://127.0.0.1:0"]);
  const ch = connect(address);
  try {
    await kvSuite(ch, "ts/");
  } finally {
    ch.close();
    await stop(proc);
  }
});

test("TypeScript client with small frames and window → Rust: the server's 1 MiB replies come split", async () => {
  const { proc, address } = await startServer(binary("KVSTORE_SERVER"), ["tcp://127.0.0.1:0"]);
  const ch = connect(address, { settings: { maxFrameSize: 16384, initialCallWindow: 32768 } });
  try {
    await kvSuite(ch, "tss/");
  } finally {
    ch.close();
    await stop(proc);
  }
});

test("TypeScript client → Rust kvstore-server over a Unix socket", async () => {
  const path = join(mkdtempSync(join(tmpdir(), "topspin-ts-")), "kv.sock");
  const { proc } = await startServer(binary("KVSTORE_SERVER"), [`unix://${path}`]);
  const ch = connect(`unix://${path}`);
  try {
    await kvSuite(ch, "tsu/");
  } finally {
    ch.close();
    await stop(proc);
  }
});

test("Rust topspin CLI → TypeScript server over TCP", async () => {
  const cli = binary("TOPSPIN_CLI");
  const stats = { watching: 0 };
  const server = new Server().service(Store, kvStore(stats));
  const bound = await server.listen("tcp://127.0.0.1:0");
  const addr = bound.replace("tcp://", "");
  const proto = ["--proto", "kv/v1/kv.proto", "-I", join(repoRoot, "examples/kvstore/proto")];
  const call = (method: string, args: string[], input?: string): Promise<{ code: number | null; stdout: string; stderr: string }> =>
    run(cli, ["call", ...proto, ...args, addr, `kv.v1.Store/${method}`], input);
  try {
    // unary
    let r = await call("Put", ["-d", '{"key": "a", "value": "1"}']);
    assert.equal(r.code, 0, r.stderr);
    assert.equal((JSON.parse(r.stdout) as { version: string }).version, "1");
    r = await call("Get", ["-d", '{"key": "a"}']);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), { key: "a", value: "1", version: "1" });

    // error status: NOT_FOUND is exit 64 + 5, with the server's message
    r = await call("Get", ["-d", '{"key": "zz"}']);
    assert.equal(r.code, 69, r.stderr);
    assert.match(r.stderr, /NOT_FOUND.*no key "zz"/);

    // client streaming: several JSON values in -d
    r = await call("Apply", ["-d", '{"put": {"key": "b", "value": "2"}} {"put": {"key": "c", "value": "3"}} {"delete": {"key": "c"}}']);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), { puts: 2, deletes: 1 });

    // bidi: JSON lines on stdin
    r = await call("GetMany", [], '{"key": "a"}\n{"key": "b"}\n');
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(
      r.stdout.trim().split("\n").map((l) => (JSON.parse(l) as { value: string }).value),
      ["1", "2"],
    );

    // server streaming with a deadline: existing entries, then DEADLINE_EXCEEDED (exit 64 + 4)
    r = await call("Watch", ["--timeout", "300ms", "-d", '{"includeExisting": true}']);
    assert.equal(r.code, 68, r.stderr);
    assert.deepEqual(
      r.stdout.trim().split("\n").map((l) => (JSON.parse(l) as { put: { key: string } }).put.key),
      ["a", "b"],
    );

    // 1 MiB request and response
    const dir = mkdtempSync(join(tmpdir(), "topspin-ts-"));
    const big = "y".repeat(1 << 20);
    writeFileSync(join(dir, "big.json"), JSON.stringify({ key: "big", value: big }));
    r = await call("Put", ["-d", `@${join(dir, "big.json")}`]);
    assert.equal(r.code, 0, r.stderr);
    r = await call("Get", ["-d", '{"key": "big"}']);
    assert.equal(r.code, 0, r.stderr);
    assert.equal((JSON.parse(r.stdout) as { value: string }).value, big);

    // cancel: the CLI is interrupted during a watch; the handler sees its call end
    const watcher = spawn(cli, ["call", ...proto, addr, "kv.v1.Store/Watch", "-d", "{}"], { stdio: "ignore" });
    const until = Date.now() + 10_000;
    const watching = (): number => stats.watching;
    while (watching() === 0 && Date.now() < until) await new Promise((res) => setTimeout(res, 10));
    assert.equal(watching(), 1, "the watch reached the handler");
    watcher.kill("SIGINT");
    while (watching() !== 0 && Date.now() < until) await new Promise((res) => setTimeout(res, 10));
    assert.equal(watching(), 0, "the handler saw the cancel");
    if (watcher.exitCode === null) watcher.kill("SIGKILL");
  } finally {
    await server.close(1000);
  }
});

test("README quick start against the Rust kvstore-server prints what the README says", async () => {
  const { proc, address } = await startServer(binary("KVSTORE_SERVER"), ["tcp://127.0.0.1:0"]);
  try {
    const pkg = join(repoRoot, "bindings", "typescript");
    const r = await run(process.execPath, [join(pkg, "dist", "examples", "quickstart.js"), address]);
    assert.equal(r.code, 0, r.stderr);
    const readme = readFileSync(join(pkg, "README.md"), "utf8");
    const printed = /It prints:\n\n```text\n([\s\S]*?)```/.exec(readme)?.[1];
    assert.equal(r.stdout, printed);
  } finally {
    await stop(proc);
  }
});
