// Unix socket paths bound as the Rust server binds them (crates/topspin/src/transport/listener.rs):
// a live server's socket is never taken over, a stale one is replaced, anything that is not a
// socket is left alone, the file gets the server's mode, and closing removes only its own file.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, lstatSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, TopspinError } from "../src/index.js";
import { connect } from "../src/node/index.js";
import { echoServer, until } from "./hostile.js";

async function echoOnce(addr: string, b: number): Promise<void> {
  const ch = connect(addr);
  try {
    const call = await ch.start("/t.T/Echo", { timeoutMs: 10_000 });
    await call.send(new Uint8Array([b]), true);
    assert.deepEqual([...((await call.receive()) ?? [])], [b]);
    await call.end();
  } finally {
    ch.close();
  }
}

/** Leaves a socket file at `path` that nothing listens on: a child binds it and is killed. */
async function staleSocket(path: string): Promise<void> {
  const child = spawn(process.execPath, ["-e", `require("net").createServer().listen(${JSON.stringify(path)}, () => console.log("up"))`], { stdio: ["ignore", "pipe", "inherit"] });
  try {
    assert.ok(await new Promise<boolean>((resolve) => {
      const t = setTimeout(() => resolve(false), 10_000);
      child.stdout.once("data", () => (clearTimeout(t), resolve(true)));
    }), "the child bound the socket");
  } finally {
    child.kill("SIGKILL");
  }
  await new Promise((r) => child.once("exit", r));
  assert.ok(lstatSync(path).isSocket(), "a stale socket file is left");
}

test("unix: a second server on a live socket path fails and the first one keeps serving; closing removes only its own file", async () => {
  const dir = mkdtempSync(join(tmpdir(), "topspin-unix-"));
  const path = join(dir, "s.sock");
  const first = echoServer();
  const second = echoServer();
  try {
    const addr = await first.listen(`unix://${path}`);
    assert.equal(statSync(path).mode & 0o777, 0o660, "the socket file has the default mode");
    assert.ok(!existsSync(`${path}.lock`), "the lock is gone once bound");
    await assert.rejects(second.listen(`unix://${path}`), (e: unknown) => e instanceof TopspinError && e.code === Code.UNAVAILABLE && /address in use: another server answers/.test(e.rawMessage));
    await echoOnce(addr, 1); // the first one still serves on its file
    // a path that holds something other than a socket is not removed
    const file = join(dir, "not-a-socket");
    writeFileSync(file, "keep me");
    await assert.rejects(second.listen(`unix://${file}`), /not a socket/);
    assert.ok(existsSync(file));
    // a file put at the path after we bound it is not ours to remove on close
    rmSync(path);
    writeFileSync(path, "someone else's");
    await first.close(100);
    assert.ok(existsSync(path), "another file at the path stays");
  } finally {
    await first.close(100);
    await second.close(100);
    rmSync(dir, { recursive: true, force: true });
  }
});

test("unix: a stale socket (its server died) is replaced; a mode can be set; a dead server's lock file is taken over", async () => {
  const dir = mkdtempSync(join(tmpdir(), "topspin-unix-"));
  const path = join(dir, "s.sock");
  const server = echoServer({ unixSocketMode: 0o600 });
  try {
    await staleSocket(path);
    // a lock file left by a process that is gone
    writeFileSync(`${path}.lock`, "999999999\n");
    const addr = await server.listen(`unix://${path}`);
    assert.equal(statSync(path).mode & 0o777, 0o600);
    assert.ok(!existsSync(`${path}.lock`));
    await echoOnce(addr, 2);
    await server.close(100);
    assert.ok(await until(() => !existsSync(path)), "its own socket file is removed on close");
  } finally {
    await server.close(100);
    rmSync(dir, { recursive: true, force: true });
  }
});
