// Node client benchmark over loopback TCP: topspin (this package, client and server) against
// @grpc/grpc-js (client and server) and a floor (raw length-prefixed echo on `net`, no framework).
// Each server runs in its own child process. Workloads: unary echo of 20 B and of 1 MiB (one
// call at a time: median and p99 latency, client CPU per call), and 20 B echo throughput with
// 64 calls in flight. Counts are bounded; the whole run takes well under a minute.
//
// Usage: node dist/bench/bench.js [--quick]
import { fork, type ChildProcess } from "node:child_process";
import * as net from "node:net";
import * as grpc from "@grpc/grpc-js";
import { Server, connect } from "../src/node/index.js";
import type { Channel } from "../src/index.js";

const quick = process.argv.includes("--quick");
const N_SMALL = quick ? 500 : 5000;
const N_BIG = quick ? 20 : 100;
const N_TPUT = quick ? 5000 : 40000;
const IN_FLIGHT = 64;

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
  if (kind === "topspin") {
    const s = new Server().route("/bench.Echo/Echo", { kind: "unary", decode: (b) => b, encode: (v) => v as Uint8Array, handler: (b) => b });
    port = Number((await s.listen("tcp://127.0.0.1:0")).split(":").pop());
  } else if (kind === "grpc") {
    const s = new grpc.Server({ "grpc.max_receive_message_length": 64 << 20, "grpc.max_send_message_length": 64 << 20 });
    const id = (b: Buffer): Buffer => b;
    s.addService(
      { echo: { path: "/bench.Echo/Echo", requestStream: false, responseStream: false, requestSerialize: id, requestDeserialize: id, responseSerialize: id, responseDeserialize: id } },
      { echo: (call: grpc.ServerUnaryCall<Buffer, Buffer>, cb: grpc.sendUnaryData<Buffer>) => cb(null, call.request) },
    );
    port = await new Promise<number>((res, rej) => s.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? rej(e) : res(p))));
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

function topspinClient(port: number): System {
  const ch: Channel = connect(`tcp://127.0.0.1:${port}`);
  return {
    name: "topspin",
    echo: async (b) => {
      const call = await ch.start("/bench.Echo/Echo");
      await call.send(b, true);
      const r = await call.receive();
      await call.end();
      return r as Uint8Array;
    },
    close: () => ch.close(),
  };
}

function grpcClient(port: number): System {
  const id = (b: Buffer): Buffer => b;
  const C = grpc.makeGenericClientConstructor(
    { echo: { path: "/bench.Echo/Echo", requestStream: false, responseStream: false, requestSerialize: id, requestDeserialize: id, responseSerialize: id, responseDeserialize: id } },
    "Echo",
  );
  const c = new C(`127.0.0.1:${port}`, grpc.credentials.createInsecure(), { "grpc.max_receive_message_length": 64 << 20, "grpc.max_send_message_length": 64 << 20 });
  return {
    name: "grpc-js",
    echo: (b) =>
      new Promise((res, rej) =>
        (c as unknown as { echo: (b: Buffer, cb: (e: Error | null, r: Buffer) => void) => void }).echo(Buffer.from(b.buffer, b.byteOffset, b.byteLength), (e, r) => (e ? rej(e) : res(r))),
      ),
    close: () => c.close(),
  };
}

async function rawClient(port: number): Promise<System> {
  const sock = net.connect(port, "127.0.0.1");
  sock.setNoDelay(true);
  await new Promise((r) => sock.once("connect", r));
  const waiting: { n: number; res: (b: Uint8Array) => void }[] = [];
  const r = new Reassembler((frame) => waiting.shift()?.res(frame.subarray(4)));
  sock.on("data", (d: Buffer) => r.push(d));
  return {
    name: "raw (floor)",
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

async function latency(sys: System, size: number, n: number, serverProc: ChildProcess): Promise<Row> {
  const msg = new Uint8Array(size).fill(7);
  for (let i = 0; i < Math.min(200, n); i++) await sys.echo(msg); // warm-up
  const times = new Float64Array(n);
  const c0 = process.cpuUsage();
  const s0 = await childCpu(serverProc);
  for (let i = 0; i < n; i++) {
    const t = process.hrtime.bigint();
    const r = await sys.echo(msg);
    times[i] = Number(process.hrtime.bigint() - t) / 1000;
    if (r.length !== size) throw new Error(`${sys.name}: echo of ${size} B came back as ${r.length} B`);
  }
  const c = process.cpuUsage(c0);
  const s = (await childCpu(serverProc)) - s0;
  times.sort();
  return { median: times[n >> 1] as number, p99: times[Math.floor(n * 0.99)] as number, cpu: (c.user + c.system + s) / n };
}

async function throughput(sys: System, n: number): Promise<number> {
  const msg = new Uint8Array(20).fill(7);
  let next = 0;
  const t = process.hrtime.bigint();
  await Promise.all(
    Array.from({ length: IN_FLIGHT }, async () => {
      while (next < n) {
        next++;
        await sys.echo(msg);
      }
    }),
  );
  return n / (Number(process.hrtime.bigint() - t) / 1e9);
}

async function main(): Promise<void> {
  const results: Record<string, { small: Row; big: Row; tput: number }> = {};
  for (const kind of ["raw", "topspin", "grpc"]) {
    const { proc, port } = await child(kind);
    const sys = kind === "topspin" ? topspinClient(port) : kind === "grpc" ? grpcClient(port) : await rawClient(port);
    const small = await latency(sys, 20, N_SMALL, proc);
    const big = await latency(sys, 1 << 20, N_BIG, proc);
    const tput = await throughput(sys, N_TPUT);
    results[sys.name] = { small, big, tput };
    sys.close();
    proc.kill();
  }
  const floor = results["raw (floor)"] as { small: Row; big: Row; tput: number };
  const grpcR = results["grpc-js"] as { small: Row; big: Row; tput: number };
  const f = (x: number): string => x.toFixed(1).padStart(8);
  console.log(`Node ${process.version}, loopback TCP, client and server in separate processes${quick ? " (quick)" : ""}`);
  console.log(`${"system".padEnd(12)} | ${"20 B med µs".padStart(11)} ${"p99".padStart(8)} ${"CPU µs".padStart(8)} | ${"1 MiB med µs".padStart(12)} ${"p99".padStart(8)} ${"CPU µs".padStart(8)} | ${"calls/s @64".padStart(11)} | 20 B median ×floor ×grpc-js`);
  for (const [name, r] of Object.entries(results)) {
    console.log(
      `${name.padEnd(12)} | ${f(r.small.median).padStart(11)} ${f(r.small.p99)} ${f(r.small.cpu)} | ${f(r.big.median).padStart(12)} ${f(r.big.p99)} ${f(r.big.cpu)} | ${r.tput.toFixed(0).padStart(11)} | ${(r.small.median / floor.small.median).toFixed(2)} ${(r.small.median / grpcR.small.median).toFixed(2)}`,
    );
  }
}

if (process.argv[2] === "--serve") await serve(process.argv[3] as string);
else await main();
