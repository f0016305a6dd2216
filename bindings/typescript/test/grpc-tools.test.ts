// The Node server as the command-line tools see it: the Rust `topspin` CLI (native protocol:
// list and describe through topspin.reflection.v1, a call, health) and grpcurl (the gRPC face:
// list and describe through grpc.reflection, a call, grpc.health.v1), on TCP and a Unix socket.
// grpcurl is looked up as $GRPCURL, on PATH, or where scripts/setup-grpc.sh puts it
// (target/grpc-tools/grpcurl); with TOPSPIN_INTEROP=1 a missing grpcurl fails the test.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { Server, ServingStatus } from "../src/node/index.js";
import { Store } from "../gen/kv/v1/kv_pb.js";
import { kvStore } from "../examples/kvstore.js";
import { binary, repoRoot, run } from "./procs.js";

async function kvServer(address: string): Promise<{ server: Server; addr: string }> {
  const server = new Server().service(Store, kvStore());
  server.addHealth().setStatus("kv.v1.Store", ServingStatus.SERVING);
  server.addReflection();
  return { server, addr: await server.listen(address) };
}

test("topspin CLI → Node server: list, describe, call and health through reflection and the native face", async () => {
  const cli = binary("TOPSPIN_CLI");
  const { server, addr } = await kvServer("tcp://127.0.0.1:0");
  const a = addr.replace("tcp://", "");
  try {
    const list = await run(cli, ["list", a]);
    assert.equal(list.code, 0, list.stderr);
    assert.match(list.stdout, /^kv\.v1\.Store$/m);
    assert.match(list.stdout, /^ {2}Watch\(kv\.v1\.WatchRequest\) returns \(stream kv\.v1\.Event\)$/m);
    assert.match(list.stdout, /^grpc\.health\.v1\.Health$/m);
    const desc = await run(cli, ["describe", a, "kv.v1.Store"]);
    assert.equal(desc.code, 0, desc.stderr);
    assert.match(desc.stdout, /service Store \{/);
    assert.match(desc.stdout, /rpc GetMany\(stream kv\.v1\.GetRequest\) returns \(stream kv\.v1\.Entry\);/);
    const msg = await run(cli, ["describe", a, "kv.v1.Entry"]);
    assert.match(msg.stdout, /message Entry \{[^}]*string key = 1;/);
    const put = await run(cli, ["call", a, "kv.v1.Store/Put", "-d", '{"key": "a", "value": "1"}']);
    assert.equal(put.code, 0, put.stderr);
    const get = await run(cli, ["call", a, "kv.v1.Store/Get", "-d", '{"key": "a"}']);
    assert.equal(get.code, 0, get.stderr);
    assert.deepEqual(JSON.parse(get.stdout), { key: "a", value: "1", version: "1" });
    const missing = await run(cli, ["call", a, "kv.v1.Store/Get", "-d", '{"key": "nope"}']);
    assert.equal(missing.code, 64 + 5, "NOT_FOUND");
    // health: the server, a service, a service with no status, then NOT_SERVING
    for (const [args, code, out] of [[[], 0, "SERVING"], [["kv.v1.Store"], 0, "SERVING"], [["no.Such"], 2, ""]] as const) {
      const h = await run(cli, ["health", a, ...args]);
      assert.equal(h.code, code, `health ${args.join(" ")}: ${h.stdout}${h.stderr}`);
      assert.equal(h.stdout.trim(), out);
    }
    server.health?.setStatus("kv.v1.Store", ServingStatus.NOT_SERVING);
    const down = await run(cli, ["health", a, "kv.v1.Store"]);
    assert.equal(down.code, 1);
    assert.equal(down.stdout.trim(), "NOT_SERVING");
  } finally {
    await server.close(500);
  }
});

test("topspin CLI → Node server over a Unix socket: list and health", async () => {
  const cli = binary("TOPSPIN_CLI");
  const path = join(mkdtempSync(join(tmpdir(), "topspin-cli-")), "kv.sock");
  const { server, addr } = await kvServer(`unix://${path}`);
  try {
    const list = await run(cli, ["list", addr]);
    assert.equal(list.code, 0, list.stderr);
    assert.match(list.stdout, /^kv\.v1\.Store$/m);
    const h = await run(cli, ["health", addr]);
    assert.equal(h.code, 0, h.stderr);
    assert.equal(h.stdout.trim(), "SERVING");
  } finally {
    await server.close(500);
  }
});

/** grpcurl's path, or undefined. */
function grpcurl(): string | undefined {
  const env = process.env.GRPCURL;
  if (env !== undefined && env !== "") return env;
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    if (dir !== "" && existsSync(join(dir, "grpcurl"))) return join(dir, "grpcurl");
  }
  const setup = join(repoRoot, "target", "grpc-tools", "grpcurl");
  return existsSync(setup) ? setup : undefined;
}

const grpcurlPath = grpcurl();
const required = process.env.TOPSPIN_INTEROP === "1";
const skip = grpcurlPath === undefined && !required ? "grpcurl is not installed (scripts/setup-grpc.sh; required with TOPSPIN_INTEROP=1)" : false;

test("grpcurl → Node server's gRPC face: list, describe, call, health, over TCP and a Unix socket", { skip }, async () => {
  assert.ok(grpcurlPath, "TOPSPIN_INTEROP=1: grpcurl must be installed (scripts/setup-grpc.sh, or GRPCURL=path)");
  const { server, addr } = await kvServer("tcp://127.0.0.1:0");
  const path = join(mkdtempSync(join(tmpdir(), "topspin-grpcurl-")), "kv.sock");
  await server.listen(`unix://${path}`);
  const a = addr.replace("tcp://", "");
  const g = (args: string[]): ReturnType<typeof run> => run(grpcurlPath, ["-plaintext", ...args]);
  try {
    const list = await g([a, "list"]);
    assert.equal(list.code, 0, list.stderr);
    for (const s of ["grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "kv.v1.Store"]) assert.match(list.stdout, new RegExp(`^${s.replaceAll(".", "\\.")}$`, "m"));
    const desc = await g([a, "describe", "kv.v1.Store"]);
    assert.equal(desc.code, 0, desc.stderr);
    assert.match(desc.stdout, /rpc GetMany \( stream \.kv\.v1\.GetRequest \) returns \( stream \.kv\.v1\.Entry \);/);
    const put = await g(["-d", '{"key": "g", "value": "grpcurl"}', a, "kv.v1.Store/Put"]);
    assert.equal(put.code, 0, put.stderr);
    const get = await g(["-d", '{"key": "g"}', a, "kv.v1.Store/Get"]);
    assert.equal(get.code, 0, get.stderr);
    assert.deepEqual(JSON.parse(get.stdout), { key: "g", value: "grpcurl", version: "1" });
    const missing = await g(["-d", '{"key": "nope"}', a, "kv.v1.Store/Get"]);
    assert.equal(missing.code, 64 + 5, `NOT_FOUND: ${missing.stderr}`);
    assert.match(missing.stderr, /no key "nope"/);
    const health = await g(["-d", '{"service": "kv.v1.Store"}', a, "grpc.health.v1.Health/Check"]);
    assert.equal(health.code, 0, health.stderr);
    assert.deepEqual(JSON.parse(health.stdout), { status: "SERVING" });
    const unix = await g([`unix://${path}`, "list"]);
    assert.equal(unix.code, 0, unix.stderr);
    assert.match(unix.stdout, /^kv\.v1\.Store$/m);
  } finally {
    await server.close(500);
  }
});
