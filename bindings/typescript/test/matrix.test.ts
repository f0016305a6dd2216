// The cross-language matrix's TypeScript pair (testdata/matrix/README.md): the Node server
// (dist/matrix/server.js) on tcp, unix and ws, the Node client (dist/matrix/client.js) run as a
// process against each — every check `ok`, exit 0 — and the server's exit on SIGTERM.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { run } from "./procs.js";
import { Server } from "../src/node/server.js";
import { connect } from "../src/node/net.js";
import { nodeCodecs } from "../src/node/gzip.js";
import { Matrix } from "../gen/matrix_pb.js";
import { CancelledTags, matrixImpl } from "../matrix/service.js";
import { CHECKS as checks, runChecks } from "../matrix/checks.js";

const dist = join(dirname(fileURLToPath(import.meta.url)), "..", "matrix");
const CHECKS = ["unary", "large", "server-stream", "quiet-stream", "client-stream", "bidi-open-then-send", "deadline", "cancel", "error-details", "compression", "trace"];

/** Starts the matrix server; resolves once it printed one `listening` line per listener. */
function startMatrixServer(listen: string[]): Promise<{ proc: ChildProcess; addresses: string[] }> {
  return new Promise((resolve, reject) => {
    const proc = spawn(process.execPath, [join(dist, "server.js"), ...listen.flatMap((a) => ["--listen", a])], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`the server printed no addresses in 20 s: ${out}`));
    }, 20_000);
    proc.stdout?.on("data", (b: Buffer) => {
      out += b.toString();
      const addresses = [...out.matchAll(/^listening (\S+)$/gm)].map((m) => m[1] ?? "");
      if (addresses.length === listen.length) {
        clearTimeout(timer);
        resolve({ proc, addresses });
      }
    });
    proc.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`the server exited with ${String(code)}: ${out}`));
    });
  });
}

test("matrix: the Node client against the Node server over tcp, unix and ws", { timeout: 120_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "topspin-matrix-"));
  const sock = join(dir, "m.sock");
  const { proc, addresses } = await startMatrixServer(["tcp://127.0.0.1:0", `unix://${sock}`, "ws://127.0.0.1:0/"]);
  try {
    assert.match(addresses[0] ?? "", /^tcp:\/\/127\.0\.0\.1:[1-9]\d*$/);
    assert.equal(addresses[1], `unix://${sock}`);
    assert.match(addresses[2] ?? "", /^ws:\/\/127\.0\.0\.1:[1-9]\d*\/$/);
    for (const target of addresses) {
      await t.test(target.split(":")[0] ?? target, async () => {
        const r = await run(process.execPath, [join(dist, "client.js"), "--target", target], undefined, 65_000);
        assert.deepEqual(r.stdout.trimEnd().split("\n"), CHECKS.map((c) => `ok ${c}`), `${r.stdout}\n${r.stderr}`);
        assert.equal(r.code, 0);
      });
    }
  } finally {
    const exited = new Promise<number | null>((r) => proc.once("exit", (code) => r(code)));
    const t0 = Date.now();
    proc.kill("SIGTERM");
    const kill = setTimeout(() => proc.kill("SIGKILL"), 5000);
    const code = await exited;
    clearTimeout(kill);
    rmSync(dir, { recursive: true, force: true });
    assert.equal(code, 0, "the server exits 0 on SIGTERM");
    assert.ok(Date.now() - t0 < 2000, `the server took ${Date.now() - t0} ms to exit`);
  }
});

test("matrix: a failing check is FAIL and exit 1 (no server)", { timeout: 90_000 }, async () => {
  const r = await run(process.execPath, [join(dist, "client.js"), "--target", "tcp://127.0.0.1:1"], undefined, 65_000);
  const lines = r.stdout.trimEnd().split("\n");
  assert.deepEqual(
    lines.map((l) => l.split(":")[0]),
    CHECKS.map((c) => `FAIL ${c}`),
    r.stdout,
  );
  assert.equal(r.code, 1);
});

test("matrix: bad arguments exit 2", async () => {
  const c = await run(process.execPath, [join(dist, "client.js"), "--nope"]);
  assert.equal(c.code, 2);
  const s = await run(process.execPath, [join(dist, "server.js")]);
  assert.equal(s.code, 2);
});

test("matrix: the compression check's requests name gzip (in process)", async () => {
  const impl = matrixImpl(new CancelledTags());
  const encodings: string[] = [];
  const server = new Server({ grpc: false }).service(Matrix, {
    ...impl,
    unary(req, ctx) {
      encodings.push(String(ctx.requestHeaders.find((m) => m.key === "topspin-encoding")?.value ?? "identity"));
      return impl.unary(req, ctx);
    },
  });
  const address = await server.listen("tcp://127.0.0.1:0");
  const channel = connect(address);
  const lines: string[] = [];
  try {
    const skip = Object.fromEntries(checks.filter((c) => c.name !== "compression").map((c) => [c.name, "not this test"]));
    const passed = await runChecks({ channel, codecs: nodeCodecs, tagPrefix: "ts-test", skip }, (l) => void lines.push(l));
    assert.ok(passed, lines.join("\n"));
    assert.ok(lines.includes("ok compression"), lines.join("\n"));
    assert.deepEqual(encodings, ["gzip"]);
  } finally {
    channel.close();
    await server.close(0);
  }
});
