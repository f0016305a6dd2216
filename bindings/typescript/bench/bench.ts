// Node client benchmark over loopback: topspin (this package, client and server, over TCP and
// over WebSocket) against @grpc/grpc-js (client and server), connect-es (@connectrpc/connect-node
// client → connectNodeAdapter server, with the gRPC protocol over HTTP/2, the Connect protocol
// over HTTP/2 and over HTTP/1.1) and a floor (raw length-prefixed echo on `net`, no framework).
// Every framework echoes the same protobuf message (bench/proto: `bytes data`, protobuf-es on
// both sides). Each server runs in its own child process. Workloads: unary echo of 20 B and of
// 1 MiB (one call at a time: median and p99 latency, client + server CPU per call), and 20 B
// echo throughput with 64 calls in flight. Counts are bounded; the whole run takes about a minute.
//
// Usage: node dist/bench/bench.js [--quick]   (npm run bench)
import { fork, type ChildProcess } from "node:child_process";
import * as http from "node:http";
import * as http2 from "node:http2";
import * as net from "node:net";
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { createClient as createConnectClient, type ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter, createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { Server, connect } from "../src/node/index.js";
import { createClient } from "../src/index.js";
import { Echo as EchoService, PayloadSchema } from "../gen/bench/v1/echo_pb.js";

const quick = process.argv.includes("--quick");
const N_SMALL = quick ? 500 : 5000;
const N_BIG = quick ? 20 : 100;
const N_TPUT = quick ? 5000 : 40000;
const IN_FLIGHT = 64;
/** Time caps (ms) per measurement, so that a slow system or a busy machine cannot stretch the run. */
const CAP_SMALL_MS = quick ? 2000 : 6000;
const CAP_BIG_MS = quick ? 1500 : 4000;
const CAP_TPUT_MS = quick ? 2000 : 5000;
/** Measurements cut short by a cap: "system: what (n done)". */
const capped: string[] = [];

type Echo = (b: Uint8Array) => Promise<Uint8Array>;
type System = { name: string; echo: Echo; close: () => void };

/** Splits a byte stream into u32-length-prefixed frames (header included), copying once per frame. */
class Reassembler {
  private chunks: Buffer[] = [];
  private have = 0;
  constructor(private readonly onFrame: (frame: Buffer) => void) {}
  push(d: Buffer): void {
    this.chunks.push(d);
    this.have += d.length;
    for (;;) {
      if (this.have < 4) return;
      let head = this.chunks[0] as Buffer;
      if (head.length < 4) {
        head = Buffer.concat(this.chunks);
        this.chunks = [head];
      }
      const need = 4 + head.readUInt32LE(0);
      if (this.have < need) return;
      const all = this.chunks.length === 1 ? head : Buffer.concat(this.chunks);
      this.onFrame(all.subarray(0, need));
      const rest = all.subarray(need);
      this.chunks = rest.length > 0 ? [rest] : [];
      this.have = rest.length;
    }
  }
}

// ---- servers (child processes) ----------------------------------------------------------------

async function serve(kind: string): Promise<void> {
  let port = 0;
  const routes = (router: ConnectRouter): void => void router.service(EchoService, { echo: (req) => req });
  if (kind === "topspin" || kind === "topspin-ws") {
    const s = new Server().service(EchoService, { echo: (req) => req });
    const bound = await s.listen(kind === "topspin" ? "tcp://127.0.0.1:0" : "ws://127.0.0.1:0/topspin");
    port = Number(/:(\d+)(\/|$)/.exec(bound.replace(/^\w+:\/\//, ""))?.[1]);
  } else if (kind === "grpc") {
    const s = new grpc.Server({ "grpc.max_receive_message_length": 64 << 20, "grpc.max_send_message_length": 64 << 20 });
    const id = (b: Buffer): Buffer => b;
    s.addService(
      { echo: { path: "/bench.v1.Echo/Echo", requestStream: false, responseStream: false, requestSerialize: id, requestDeserialize: id, responseSerialize: id, responseDeserialize: id } },
      {
        echo: (call: grpc.ServerUnaryCall<Buffer, Buffer>, cb: grpc.sendUnaryData<Buffer>) => {
          // protobuf-es on the server too, as the other frameworks do
          const req = fromBinary(PayloadSchema, call.request);
          cb(null, Buffer.from(toBinary(PayloadSchema, req)));
        },
      },
    );
    port = await new Promise<number>((res, rej) => s.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? rej(e) : res(p))));
  } else if (kind === "connect-h2" || kind === "connect-h1") {
    const handler = connectNodeAdapter({ routes, readMaxBytes: 64 << 20, writeMaxBytes: 64 << 20 });
    const s = kind === "connect-h2" ? http2.createServer(handler) : http.createServer(handler);
    await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
    port = (s.address() as net.AddressInfo).port;
  } else {
    // raw: u32 length + payload, echoed back as is
    const s = net.createServer((sock) => {
      sock.setNoDelay(true);
      const r = new Reassembler((frame) => sock.write(frame));
      sock.on("data", (d: Buffer) => r.push(d));
    });
    await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
    port = (s.address() as net.AddressInfo).port;
  }
  process.send?.({ port });
  process.on("message", (m) => {
    if (m === "cpu") process.send?.({ cpu: process.cpuUsage() });
  });
}

function child(kind: string): Promise<{ proc: ChildProcess; port: number }> {
  const proc = fork(process.argv[1] as string, ["--serve", kind]);
  return new Promise((res) => proc.once("message", (m: { port: number }) => res({ proc, port: m.port })));
}

function childCpu(proc: ChildProcess): Promise<number> {
  return new Promise((res) => {
    proc.once("message", (m: { cpu: NodeJS.CpuUsage }) => res(m.cpu.user + m.cpu.system));
    proc.send("cpu");
  });
}

// ---- clients ----------------------------------------------------------------------------------

function topspinClient(address: string, name: string): System {
  const ch = connect(address);
  const c = createClient(EchoService, ch);
  return { name, echo: async (b) => (await c.echo({ data: b })).data, close: () => ch.close() };
}

function grpcClient(port: number): System {
  const C = grpc.makeGenericClientConstructor(
    {
      echo: {
        path: "/bench.v1.Echo/Echo",
        requestStream: false,
        responseStream: false,
        requestSerialize: (b: Uint8Array) => Buffer.from(toBinary(PayloadSchema, create(PayloadSchema, { data: b }))),
        requestDeserialize: (b: Buffer) => b,
        responseSerialize: (b: Buffer) => b,
        responseDeserialize: (b: Buffer) => fromBinary(PayloadSchema, b).data,
      },
    },
    "Echo",
  );
  const c = new C(`127.0.0.1:${port}`, grpc.credentials.createInsecure(), { "grpc.max_receive_message_length": 64 << 20, "grpc.max_send_message_length": 64 << 20 });
  return {
    name: "grpc-js",
    echo: (b) => new Promise((res, rej) => (c as unknown as { echo: (b: Uint8Array, cb: (e: Error | null, r: Uint8Array) => void) => void }).echo(b, (e, r) => (e ? rej(e) : res(r)))),
    close: () => c.close(),
  };
}

function connectClient(port: number, protocol: "grpc" | "connect", httpVersion: "2" | "1.1", name: string): System {
  const opts = { baseUrl: `http://127.0.0.1:${port}`, readMaxBytes: 64 << 20, writeMaxBytes: 64 << 20 };
  // The gRPC transport is HTTP/2 only; the Connect one sends binary protobuf (not JSON).
  const transport = protocol === "grpc" ? createGrpcTransport(opts) : createConnectTransport({ ...opts, httpVersion, useBinaryFormat: true });
  const c = createConnectClient(EchoService, transport);
  return { name, echo: async (b) => (await c.echo({ data: b })).data, close: () => undefined };
}

async function rawClient(port: number): Promise<System> {
  const sock = net.connect(port, "127.0.0.1");
  sock.setNoDelay(true);
  await new Promise((r) => sock.once("connect", r));
  const waiting: { n: number; res: (b: Uint8Array) => void }[] = [];
  const r = new Reassembler((frame) => waiting.shift()?.res(frame.subarray(4)));
  sock.on("data", (d: Buffer) => r.push(d));
  return {
    name: "raw `net` (floor)",
    echo: (b) =>
      new Promise((res) => {
        waiting.push({ n: b.length, res });
        const h = Buffer.alloc(4);
        h.writeUInt32LE(b.length);
        sock.cork();
        sock.write(h);
        sock.write(b);
        sock.uncork();
      }),
    close: () => sock.destroy(),
  };
}

// ---- measurement ------------------------------------------------------------------------------

interface Row {
  median: number;
  p99: number;
  cpu: number;
}

async function latency(sys: System, size: number, max: number, capMs: number, serverProc: ChildProcess): Promise<Row> {
  const msg = new Uint8Array(size).fill(7);
  for (let i = 0; i < Math.min(200, max / 10); i++) await sys.echo(msg); // warm-up
  const all = new Float64Array(max);
  const c0 = process.cpuUsage();
  const s0 = await childCpu(serverProc);
  const until = performance.now() + capMs;
  let n = 0;
  while (n < max && (n < 20 || performance.now() < until)) {
    const t = process.hrtime.bigint();
    const r = await sys.echo(msg);
    all[n++] = Number(process.hrtime.bigint() - t) / 1000;
    if (r.length !== size) throw new Error(`${sys.name}: echo of ${size} B came back as ${r.length} B`);
  }
  const c = process.cpuUsage(c0);
  const s = (await childCpu(serverProc)) - s0;
  if (n < max) capped.push(`${sys.name}: ${size} B (${n} calls)`);
  const times = all.subarray(0, n).sort();
  return { median: times[n >> 1] as number, p99: times[Math.floor(n * 0.99)] as number, cpu: (c.user + c.system + s) / n };
}

async function throughput(sys: System, max: number): Promise<number> {
  const msg = new Uint8Array(20).fill(7);
  let next = 0;
  const t = process.hrtime.bigint();
  const until = performance.now() + CAP_TPUT_MS;
  await Promise.all(
    Array.from({ length: IN_FLIGHT }, async () => {
      while (next < max && performance.now() < until) {
        next++;
        await sys.echo(msg);
      }
    }),
  );
  if (next < max) capped.push(`${sys.name}: throughput (${next} calls)`);
  return next / (Number(process.hrtime.bigint() - t) / 1e9);
}

const SYSTEMS: { kind: string; name: string; client: (port: number) => System | Promise<System> }[] = [
  { kind: "raw", name: "raw `net` (floor)", client: rawClient },
  { kind: "topspin", name: "topspin TCP", client: (p) => topspinClient(`tcp://127.0.0.1:${p}`, "topspin TCP") },
  { kind: "topspin-ws", name: "topspin ws://", client: (p) => topspinClient(`ws://127.0.0.1:${p}/topspin`, "topspin ws://") },
  { kind: "grpc", name: "grpc-js (h2)", client: grpcClient },
  { kind: "connect-h2", name: "connect-es gRPC (h2)", client: (p) => connectClient(p, "grpc", "2", "connect-es gRPC (h2)") },
  { kind: "connect-h2", name: "connect-es Connect (h2)", client: (p) => connectClient(p, "connect", "2", "connect-es Connect (h2)") },
  { kind: "connect-h1", name: "connect-es Connect (h1.1)", client: (p) => connectClient(p, "connect", "1.1", "connect-es Connect (h1.1)") },
];

async function main(): Promise<void> {
  const only = process.argv.find((a) => a.startsWith("--only="))?.slice("--only=".length);
  const results: { name: string; small: Row; big: Row; tput: number }[] = [];
  for (const s of SYSTEMS) {
    if (only !== undefined && !s.name.includes(only) && s.kind !== "topspin") continue;
    const { proc, port } = await child(s.kind);
    try {
      const sys = await s.client(port);
      const small = await latency(sys, 20, N_SMALL, CAP_SMALL_MS, proc);
      const big = await latency(sys, 1 << 20, N_BIG, CAP_BIG_MS, proc);
      const tput = await throughput(sys, N_TPUT);
      results.push({ name: s.name, small, big, tput });
      sys.close();
    } finally {
      proc.kill();
    }
  }
  const ref = results.find((r) => r.name === "topspin TCP");
  if (ref === undefined) throw new Error("no topspin TCP row");
  const f = (x: number): string => x.toFixed(1);
  const x = (a: number, b: number): string => (a / b).toFixed(2);
  console.log(`Node ${process.version}, loopback, client and server in separate processes, ${N_SMALL} × 20 B, ${N_BIG} × 1 MiB, ${N_TPUT} calls at ${IN_FLIGHT} in flight (each capped at ${CAP_SMALL_MS / 1000} s / ${CAP_BIG_MS / 1000} s / ${CAP_TPUT_MS / 1000} s)${quick ? " (quick)" : ""}.`);
  console.log("Latency in µs; CPU = client + server µs per 20 B call; × topspin = this system's figure / topspin TCP's (calls/s: topspin's / this one's; > 1: topspin is faster).\n");
  console.log("| system | 20 B median | p99 | CPU µs/call | 1 MiB median | p99 | CPU µs/call | calls/s, 20 B, 64 in flight | × topspin: 20 B median | 1 MiB median | CPU (20 B) | calls/s |");
  console.log("|---|---|---|---|---|---|---|---|---|---|---|---|");
  for (const r of results) {
    console.log(
      `| ${r.name} | ${f(r.small.median)} | ${f(r.small.p99)} | ${f(r.small.cpu)} | ${f(r.big.median)} | ${f(r.big.p99)} | ${f(r.big.cpu)} | ${r.tput.toFixed(0)} | ${x(r.small.median, ref.small.median)} | ${x(r.big.median, ref.big.median)} | ${x(r.small.cpu, ref.small.cpu)} | ${x(ref.tput, r.tput)} |`,
    );
  }
  if (capped.length > 0) console.log(`\nCut short by the time cap: ${capped.join("; ")}.`);
}

if (process.argv[2] === "--serve") await serve(process.argv[3] as string);
else await main();
