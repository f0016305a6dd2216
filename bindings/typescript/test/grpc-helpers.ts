// Helpers for the gRPC face tests: a @grpc/grpc-js client for raw-bytes or protobuf-es
// messages, promisified, and a counting TCP proxy (to see what went over the wire).
import * as grpc from "@grpc/grpc-js";
import * as net from "node:net";
import { fromBinary, toBinary, type DescMessage, type MessageShape } from "@bufbuild/protobuf";

/** A grpc-js client to a `tcp://host:port` or `unix:///path` address of the Node server. */
export function grpcClient(address: string, options: grpc.ClientOptions = {}): grpc.Client {
  const target = address.startsWith("unix://") ? `unix:${address.slice("unix://".length)}` : address.replace("tcp://", "");
  // A connection of its own (grpc-js shares connections between clients by default).
  return new grpc.Client(target, grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1, ...options });
}

const raw = (b: Buffer): Buffer => b;

/** A unary call's outcome: the response, its headers and trailers. */
export interface UnaryResult<T> {
  value: T;
  headers: grpc.Metadata;
  trailers: grpc.Metadata;
}

/** A unary call with raw bytes; rejects with the grpc-js ServiceError. */
export function unaryRaw(c: grpc.Client, path: string, req: Uint8Array, md = new grpc.Metadata(), opts: grpc.CallOptions = {}): Promise<UnaryResult<Buffer>> {
  return new Promise((resolve, reject) => {
    let headers = new grpc.Metadata();
    let result: Buffer | null = null;
    const call = c.makeUnaryRequest(path, raw, raw, Buffer.from(req), md, opts, (err, value) => {
      if (err !== null) reject(err);
      else result = value as Buffer;
    });
    call.on("metadata", (m) => (headers = m));
    // the trailers come with the status, which may follow the callback
    call.on("status", (s) => setImmediate(() => result !== null && resolve({ value: result, headers, trailers: s.metadata })));
  });
}

/** A unary call with protobuf-es messages. */
export async function unary<I extends DescMessage, O extends DescMessage>(c: grpc.Client, path: string, i: I, o: O, req: MessageShape<I>, md?: grpc.Metadata, opts?: grpc.CallOptions): Promise<MessageShape<O>> {
  const r = await unaryRaw(c, path, toBinary(i, req), md, opts);
  return fromBinary(o, r.value);
}

/** Collects a readable call's messages (raw). */
export async function collect(call: grpc.ClientReadableStream<Buffer> | grpc.ClientDuplexStream<Buffer, Buffer>): Promise<Buffer[]> {
  const out: Buffer[] = [];
  for await (const m of call as AsyncIterable<Buffer>) out.push(m);
  return out;
}

/** A server-streaming call with raw bytes. */
export function serverStreamRaw(c: grpc.Client, path: string, req: Uint8Array, md = new grpc.Metadata(), opts: grpc.CallOptions = {}): grpc.ClientReadableStream<Buffer> {
  return c.makeServerStreamRequest(path, raw, raw, Buffer.from(req), md, opts);
}

/** A client-streaming call with raw bytes: sends `reqs`, resolves with the response. */
export function clientStreamRaw(c: grpc.Client, path: string, reqs: Uint8Array[], md = new grpc.Metadata()): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const call = c.makeClientStreamRequest(path, raw, raw, md, {}, (err, value) => (err !== null ? reject(err) : resolve(value as Buffer)));
    for (const r of reqs) call.write(Buffer.from(r));
    call.end();
  });
}

/** A bidi call with raw bytes. */
export function bidiRaw(c: grpc.Client, path: string, md = new grpc.Metadata()): grpc.ClientDuplexStream<Buffer, Buffer> {
  return c.makeBidiStreamRequest(path, raw, raw, md, {});
}

/** The error a promise rejects with (fails if it resolves). */
export async function grpcError(p: Promise<unknown>): Promise<grpc.ServiceError> {
  try {
    await p;
  } catch (e) {
    return e as grpc.ServiceError;
  }
  throw new Error("the call succeeded; an error was expected");
}

/** A TCP proxy to `target` (host:port) counting the bytes the client sent. */
export async function countingProxy(target: string): Promise<{ address: string; sent: () => number; close: () => void }> {
  let sent = 0;
  const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
  const socks = new Set<net.Socket>();
  const srv = net.createServer((client) => {
    const up = net.connect(port, host);
    socks.add(client).add(up);
    client.on("data", (b: Buffer) => (sent += b.length));
    client.pipe(up).pipe(client);
    const end = (): void => {
      client.destroy();
      up.destroy();
    };
    client.on("error", end).on("close", end);
    up.on("error", end).on("close", end);
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const a = srv.address() as net.AddressInfo;
  return {
    address: `127.0.0.1:${a.port}`,
    sent: () => sent,
    close: () => {
      for (const s of socks) s.destroy();
      srv.close();
    },
  };
}
