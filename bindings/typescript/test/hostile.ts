// Helpers for the hostile-peer tests: a raw client that speaks frames by hand over loopback (it
// records every frame the server sends and when the server closed), a server with an echo
// route, and a well-behaved client that keeps calling throughout an attack.
import assert from "node:assert/strict";
import * as net from "node:net";
import { Connection, FrameDecoder, PREFACE, encodeFrame, encodeHeader, type Frame, type Metadata } from "../src/index.js";
import { Server, connect, type ServerOptions } from "../src/node/index.js";

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Waits until `cond()` holds, checking every 5 ms, for at most `ms`; false if it never did. */
export async function until(cond: () => boolean, ms = 10_000): Promise<boolean> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) return false;
    await sleep(5);
  }
  return true;
}

/** A raw connection to a server: frames in, bytes out. */
export class Raw {
  readonly frames: Frame[] = [];
  closed = false;
  private readonly decoder = new FrameDecoder(1 << 24);
  private prefaceLeft = PREFACE.length;

  private constructor(readonly sock: net.Socket) {
    sock.on("data", (b: Buffer) => this.onData(b));
    sock.on("error", () => undefined);
    sock.on("close", () => (this.closed = true));
  }

  /** Connects to `tcp://host:port` or `unix:///path`. */
  static async open(addr: string): Promise<Raw> {
    const sock = addr.startsWith("unix://") ? net.connect({ path: addr.slice(7) }) : net.connect(Number(addr.split(":").pop()), "127.0.0.1");
    await new Promise<void>((resolve, reject) => {
      sock.once("connect", resolve);
      sock.once("error", reject);
    });
    return new Raw(sock);
  }

  /** Everything the server sent, as bytes (also what is not topspin, such as an HTTP answer). */
  readonly bytes: Buffer[] = [];
  private garbage = false;

  private onData(b: Buffer): void {
    this.bytes.push(b);
    const skip = Math.min(this.prefaceLeft, b.length);
    this.prefaceLeft -= skip;
    if (this.garbage) return;
    this.decoder.push(b.subarray(skip));
    try {
      for (let f = this.decoder.next(); f !== null; f = this.decoder.next()) this.frames.push(f);
    } catch {
      this.garbage = true; // not frames: `bytes` has it
    }
  }

  /** Sends bytes or a frame. */
  send(x: Uint8Array | Frame): void {
    this.sock.write(x instanceof Uint8Array ? x : encodeFrame(x));
  }

  /** Sends the preface and an empty SETTINGS: the handshake. */
  handshake(): void {
    this.send(PREFACE);
    this.send({ type: "SETTINGS", flags: 0, callId: 0, entries: [] });
  }

  /** Opens call `id` on `method` (named) with `metadata`. */
  call(id: number, method: string, metadata: Metadata = []): void {
    this.send({ type: "CALL", flags: 1, callId: id, methodId: 0, methodName: method, codec: 0, timeoutUs: 0n, metadata });
  }

  /** Sends one whole message on call `id`, half-closing. */
  message(id: number, payload: Uint8Array): void {
    this.send({ type: "MESSAGE", flags: 1, callId: id, endStream: true, totalLen: null, chunk: payload });
  }

  /** The first frame of `type` the server sent, waiting up to `ms` for it. */
  async frame<T extends Frame["type"]>(type: T, ms = 10_000): Promise<Extract<Frame, { type: T }>> {
    const find = (): Frame | undefined => this.frames.find((f) => f.type === type);
    assert.ok(await until(() => find() !== undefined, ms), `a ${type} frame (got ${this.frames.map((f) => f.type).join(", ") || "none"})`);
    return find() as Extract<Frame, { type: T }>;
  }

  /** Waits for the server to close the connection (at most `ms`). */
  async closedByServer(ms = 10_000): Promise<void> {
    assert.ok(await until(() => this.closed, ms), "the server closed the connection");
  }

  destroy(): void {
    this.sock.destroy();
  }
}

/** The 12-byte header of an extension frame (type 0x80) announcing `length` bytes. */
export const extensionHeader = (length: number): Uint8Array => encodeHeader(length, 0x80, 0, 0);

/** A server with `/t.T/Echo` (unary) and `/t.T/Hang` (unary, answers when the call is cancelled). */
export function echoServer(opts: ServerOptions = {}): Server {
  const id = { kind: "unary" as const, decode: (b: Uint8Array) => b, encode: (v: unknown) => v as Uint8Array };
  return new Server(opts)
    .route("/t.T/Echo", { ...id, handler: (r) => r })
    .route("/t.T/Hang", {
      ...id,
      handler: (_r, ctx) => new Promise((resolve) => ctx.signal.addEventListener("abort", () => resolve(new Uint8Array(0)))),
    });
}

/**
 * A well-behaved client calling `/t.T/Echo` on `addr` every 10 ms until stopped (at most
 * `max` calls); `stop()` resolves with the number of calls that succeeded and throws the first
 * failure.
 */
export function goodClient(addr: string, max = 5000): { stop: () => Promise<number>; served: () => number } {
  const ch = connect(addr);
  let running = true;
  let ok = 0;
  const loop = (async (): Promise<number> => {
    for (let i = 0; running && i < max; i++) {
      const call = await ch.start("/t.T/Echo", { timeoutMs: 10_000 });
      await call.send(new Uint8Array([i & 0xff]), true);
      const got = await call.receive();
      await call.end();
      assert.deepEqual([...(got ?? [])], [i & 0xff]);
      ok++;
      await sleep(10);
    }
    return ok;
  })();
  loop.catch(() => undefined);
  return {
    served: () => ok,
    stop: async () => {
      running = false;
      try {
        return await loop;
      } finally {
        ch.close();
      }
    },
  };
}

/** A client engine on a raw socket: answers PINGs itself (a live peer that makes no call). */
export async function livePeer(addr: string): Promise<{ raw: Raw; engine: Connection }> {
  const raw = await Raw.open(addr);
  const engine = new Connection("client");
  raw.sock.removeAllListeners("data");
  raw.sock.on("data", (b: Buffer) => {
    engine.receive(b);
    engine.takeEvents();
    for (const o of engine.takeOutput()) raw.sock.write(o);
  });
  for (const o of engine.takeOutput()) raw.sock.write(o);
  return { raw, engine };
}
