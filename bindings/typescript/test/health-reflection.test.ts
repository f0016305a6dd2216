// Health (grpc.health.v1: Check and Watch) and reflection (topspin.reflection.v1 on the native
// face, grpc.reflection.v1 and v1alpha on the gRPC face) of the Node server, each from one
// implementation, asked over both faces of the same port.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { Code, createClient } from "../src/index.js";
import { HealthService, Server, ServingStatus, connect } from "../src/node/index.js";
import { HealthCheckRequestSchema, HealthCheckResponseSchema } from "../src/gen/grpc/health/v1/health_pb.js";
import * as v1 from "../src/gen/grpc/reflection/v1/reflection_pb.js";
import * as v1alpha from "../src/gen/grpc/reflection/v1alpha/reflection_pb.js";
import { Reflection } from "../src/gen/topspin/reflection/v1/reflection_pb.js";
import { Store } from "../gen/kv/v1/kv_pb.js";
import { kvStore } from "../examples/kvstore.js";
import { failsWith } from "./suite.js";
import { bidiRaw, collect, grpcClient, grpcError, serverStreamRaw, unary } from "./grpc-helpers.js";

async function kvServer(): Promise<{ server: Server; addr: string }> {
  const server = new Server().service(Store, kvStore());
  server.addHealth().setStatus("kv.v1.Store", ServingStatus.SERVING);
  server.addReflection();
  return { server, addr: await server.listen("tcp://127.0.0.1:0") };
}

const check = (c: grpc.Client, service: string): Promise<ServingStatus> =>
  unary(c, "/grpc.health.v1.Health/Check", HealthCheckRequestSchema, HealthCheckResponseSchema, create(HealthCheckRequestSchema, { service })).then((r) => r.status);

test("health Check on both faces, from one status table", async () => {
  const { server, addr } = await kvServer();
  const c = grpcClient(addr);
  const ch = connect(addr);
  const native = createClient(HealthService, ch);
  try {
    for (const s of ["", "kv.v1.Store"]) {
      assert.equal(await check(c, s), ServingStatus.SERVING);
      assert.equal((await native.check({ service: s })).status, ServingStatus.SERVING);
    }
    server.health?.setStatus("kv.v1.Store", ServingStatus.NOT_SERVING);
    assert.equal(await check(c, "kv.v1.Store"), ServingStatus.NOT_SERVING);
    assert.equal((await native.check({ service: "kv.v1.Store" })).status, ServingStatus.NOT_SERVING);
    // an unknown service: NOT_FOUND on both
    assert.equal((await grpcError(check(c, "no.Such"))).code, grpc.status.NOT_FOUND);
    await failsWith(native.check({ service: "no.Such" }), Code.NOT_FOUND);
  } finally {
    c.close();
    ch.close();
    await server.close(500);
  }
});

test("health Watch on both faces: the current status, every change, NOT_SERVING and the end on close()", async () => {
  const { server, addr } = await kvServer();
  const c = grpcClient(addr);
  const ch = connect(addr);
  try {
    const req = toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema, { service: "kv.v1.Store" }));
    const g = serverStreamRaw(c, "/grpc.health.v1.Health/Watch", req);
    const gSeen: ServingStatus[] = [];
    const gDone = new Promise<grpc.StatusObject>((r) => g.on("status", r));
    g.on("data", (b: Buffer) => gSeen.push(fromBinary(HealthCheckResponseSchema, b).status));
    g.on("error", () => undefined);
    const nSeen: ServingStatus[] = [];
    const nDone = (async () => {
      for await (const r of createClient(HealthService, ch).watch({ service: "kv.v1.Store" })) nSeen.push(r.status);
    })();
    const unknown = createClient(HealthService, ch).watch({ service: "later.Svc" });
    let first: ServingStatus | undefined;
    for await (const r of unknown) {
      first = r.status;
      break;
    }
    assert.equal(first, ServingStatus.SERVICE_UNKNOWN);
    const until = async (f: () => boolean): Promise<void> => {
      for (let i = 0; i < 500 && !f(); i++) await new Promise((r) => setTimeout(r, 10));
    };
    await until(() => gSeen.length === 1 && nSeen.length === 1);
    server.health?.setStatus("kv.v1.Store", ServingStatus.NOT_SERVING);
    await until(() => gSeen.length === 2 && nSeen.length === 2);
    server.health?.setStatus("kv.v1.Store", ServingStatus.SERVING);
    await until(() => gSeen.length === 3 && nSeen.length === 3);
    const S = ServingStatus;
    assert.deepEqual(gSeen, [S.SERVING, S.NOT_SERVING, S.SERVING]);
    assert.deepEqual(nSeen, [S.SERVING, S.NOT_SERVING, S.SERVING]);
    // close(): NOT_SERVING, then the watches end (not held open for the grace period)
    const t0 = Date.now();
    await server.close(3000);
    assert.ok(Date.now() - t0 < 2500, `close() did not wait for the watches (${Date.now() - t0} ms)`);
    assert.equal((await gDone).code, grpc.status.OK);
    await nDone;
    assert.equal(gSeen.at(-1), S.NOT_SERVING);
    assert.equal(nSeen.at(-1), S.NOT_SERVING);
  } finally {
    c.close();
    ch.close();
    await server.close(100);
  }
});

/** Asks gRPC reflection (v1 or v1alpha) some questions on one stream. */
async function askGrpc(c: grpc.Client, version: "v1" | "v1alpha", questions: v1.ServerReflectionRequest["messageRequest"][]): Promise<v1.ServerReflectionResponse[]> {
  const call = bidiRaw(c, `/grpc.reflection.${version}.ServerReflection/ServerReflectionInfo`);
  for (const q of questions) {
    const bytes = toBinary(v1.ServerReflectionRequestSchema, create(v1.ServerReflectionRequestSchema, { host: "h", messageRequest: q }));
    // v1alpha's messages are v1's under other names: the same bytes, checked by decoding with its schema
    if (version === "v1alpha") assert.equal(fromBinary(v1alpha.ServerReflectionRequestSchema, bytes).host, "h");
    call.write(Buffer.from(bytes));
  }
  call.end();
  return (await collect(call)).map((b) => fromBinary(v1.ServerReflectionResponseSchema, b));
}

const fileNames = (files: Uint8Array[]): string[] => files.map((f) => fromBinary(FileDescriptorProtoSchema, f).name);

test("gRPC reflection v1 and v1alpha: list services, file containing a symbol, file by name, unknown symbol", async () => {
  const { server, addr } = await kvServer();
  const c = grpcClient(addr);
  try {
    for (const version of ["v1", "v1alpha"] as const) {
      const [list, sym, method, byName, unknown] = await askGrpc(c, version, [
        { case: "listServices", value: "" },
        { case: "fileContainingSymbol", value: "kv.v1.Store" },
        { case: "fileContainingSymbol", value: "kv.v1.Store.Get" },
        { case: "fileByFilename", value: "grpc/health/v1/health.proto" },
        { case: "fileContainingSymbol", value: "no.Such" },
      ]);
      assert.equal(list?.messageResponse.case, "listServicesResponse");
      const names = list?.messageResponse.case === "listServicesResponse" ? list.messageResponse.value.service.map((s) => s.name) : [];
      for (const n of ["kv.v1.Store", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection", "topspin.reflection.v1.Reflection"]) {
        assert.ok(names.includes(n), `${version} lists ${n}: ${names.join(", ")}`);
      }
      assert.equal(list?.validHost, "h");
      for (const r of [sym, method]) {
        assert.equal(r?.messageResponse.case, "fileDescriptorResponse");
        const files = r?.messageResponse.case === "fileDescriptorResponse" ? r.messageResponse.value.fileDescriptorProto : [];
        assert.deepEqual(fileNames(files), ["kv/v1/kv.proto"]);
        const kv = fromBinary(FileDescriptorProtoSchema, files[0] ?? new Uint8Array());
        assert.deepEqual(
          kv.service[0]?.method.map((m) => m.name),
          ["Get", "Put", "Delete", "Watch", "Apply", "GetMany"],
        );
      }
      assert.equal(byName?.messageResponse.case, "fileDescriptorResponse");
      assert.equal(unknown?.messageResponse.case, "errorResponse");
      if (unknown?.messageResponse.case === "errorResponse") assert.equal(unknown.messageResponse.value.errorCode, grpc.status.NOT_FOUND);
    }
  } finally {
    c.close();
    await server.close(500);
  }
});

test("native reflection (topspin.reflection.v1): ListServices, FileContainingSymbol, FileByName", async () => {
  const { server, addr } = await kvServer();
  const ch = connect(addr);
  const r = createClient(Reflection, ch);
  try {
    const list = await r.listServices({});
    const names = list.services.map((s) => s.name);
    assert.deepEqual(names, [...names].sort());
    assert.ok(names.includes("kv.v1.Store") && names.includes("grpc.health.v1.Health") && names.includes("topspin.reflection.v1.Reflection"));
    assert.ok(!names.some((n) => n.startsWith("grpc.reflection.")), "gRPC's reflection is for gRPC tools (as Rust)");
    const store = list.services.find((s) => s.name === "kv.v1.Store");
    assert.equal(store?.file, "kv/v1/kv.proto");
    const watch = store?.methods.find((m) => m.name === "Watch");
    assert.deepEqual(
      { path: watch?.path, cs: watch?.clientStreaming, ss: watch?.serverStreaming, i: watch?.inputType, o: watch?.outputType },
      { path: "/kv.v1.Store/Watch", cs: false, ss: true, i: "kv.v1.WatchRequest", o: "kv.v1.Event" },
    );
    assert.deepEqual(fileNames((await r.fileContainingSymbol({ symbol: "kv.v1.Entry" })).files), ["kv/v1/kv.proto"]);
    assert.deepEqual(fileNames((await r.fileContainingSymbol({ symbol: "/kv.v1.Store/Get" })).files), ["kv/v1/kv.proto"]);
    assert.deepEqual(fileNames((await r.fileByName({ name: "topspin/reflection/v1/reflection.proto" })).files), ["topspin/reflection/v1/reflection.proto"]);
    await failsWith(r.fileContainingSymbol({ symbol: "no.Such" }), Code.NOT_FOUND);
    await failsWith(r.fileByName({ name: "no.proto" }), Code.NOT_FOUND);
  } finally {
    ch.close();
    await server.close(500);
  }
});
