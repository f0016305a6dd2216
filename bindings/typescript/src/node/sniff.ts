/**
 * Telling the faces of one listener apart by the client's first byte (as the Rust server's
 * `transport/sniff.rs`): `P` of HTTP/2's `PRI * HTTP/2.0` preface is gRPC with prior
 * knowledge; anything else (the `T` of topspin's preface, or garbage the engine refuses) is
 * native. The byte is put back (`unshift`), so whichever face takes the socket reads it whole.
 * And the answer to a gRPC client over `maxConnections`: a gRPC status, in hand-made HTTP/2.
 * @module
 */
import type * as net from "node:net";

/** What a connection speaks ("stalled": a gRPC client that did not finish its HTTP/2 handshake in time). */
export type Face = "native" | "grpc" | "silent" | "stalled";

/** HTTP/2's client connection preface (RFC 9113 §3.4). */
const H2_PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");

/**
 * Whether `b` (starting with `P`) holds HTTP/2's whole client handshake: the preface and the
 * SETTINGS frame that must follow it; false while more is needed. A preface that is not
 * HTTP/2's is "whole" at once (grpc-js refuses it).
 */
function h2HandshakeDone(b: Buffer): boolean {
  const n = Math.min(b.length, H2_PREFACE.length);
  if (!b.subarray(0, n).equals(H2_PREFACE.subarray(0, n))) return true;
  if (b.length < H2_PREFACE.length + 9) return false;
  return b.length >= H2_PREFACE.length + 9 + b.readUIntBE(H2_PREFACE.length, 3);
}

/**
 * Waits for a socket's first bytes, for at most `ms` (0: no bound), and says which face they
 * are; the bytes go back into the socket, which is left paused. A gRPC client's whole HTTP/2
 * handshake (preface and SETTINGS) must arrive within that time too (as the Rust server's
 * `handshake_timeout` covers it), since grpc-js itself has no bound on it.
 */
export function sniff(socket: net.Socket, ms: number, grpcOn: boolean): Promise<Face> {
  return new Promise((resolve) => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    let got: Buffer | null = null;
    const done = (f: Face): void => {
      clearTimeout(timer);
      socket.off("data", onData);
      socket.off("close", onClose);
      socket.pause();
      if (got !== null) socket.unshift(got);
      resolve(f);
    };
    const onData = (b: Buffer): void => {
      got = got === null ? b : Buffer.concat([got, b]);
      if (!grpcOn || got[0] !== 0x50) done("native");
      else if (h2HandshakeDone(got)) done("grpc");
    };
    const onClose = (): void => done("silent");
    socket.on("data", onData);
    socket.once("close", onClose);
    if (ms > 0) timer = setTimeout(() => done(got === null ? "silent" : "stalled"), ms);
  });
}

/** An HTTP/2 frame (RFC 9113 §4.1). */
function frame(type: number, flags: number, stream: number, payload: Uint8Array): Buffer {
  const b = Buffer.alloc(9 + payload.length);
  b.writeUIntBE(payload.length, 0, 3);
  b[3] = type;
  b[4] = flags;
  b.writeUInt32BE(stream & 0x7fffffff, 5);
  b.set(payload, 9);
  return b;
}

/** An HPACK literal header field without indexing, new name, no Huffman (RFC 7541 §6.2.2). */
function literal(name: string, value: string): Buffer {
  const n = Buffer.from(name);
  const v = Buffer.from(value);
  const len = (x: number): Buffer => (x < 127 ? Buffer.from([x]) : Buffer.from([127, ...varint(x - 127)]));
  return Buffer.concat([Buffer.from([0]), len(n.length), n, len(v.length), v]);
}

function varint(x: number): number[] {
  const out: number[] = [];
  while (x >= 128) {
    out.push((x % 128) + 128);
    x = Math.floor(x / 128);
  }
  out.push(x);
  return out;
}

/** A GOAWAY frame. */
function goAway(lastStream: number, code: number, debug: string): Buffer {
  const p = Buffer.alloc(8);
  p.writeUInt32BE(lastStream & 0x7fffffff, 0);
  p.writeUInt32BE(code, 4);
  return frame(7, 0, 0, Buffer.concat([p, Buffer.from(debug)]));
}

/**
 * Answers a gRPC connection the server takes no more of: its first call ends `UNAVAILABLE`
 * with `message` (a trailers-only response), then GOAWAY and close; a client that starts no
 * call within `waitMs` gets the GOAWAY alone. Reads at most `maxRead` bytes.
 */
export function refuseGrpc(socket: net.Socket, message: string, waitMs: number, maxRead: number, done: () => void): void {
  const preface = 24;
  let buf = Buffer.alloc(0);
  let read = 0;
  let over = false;
  const finish = (lastStream: number): void => {
    if (over) return;
    over = true;
    clearTimeout(timer);
    socket.off("data", onData);
    socket.end(goAway(lastStream, 0, message));
    setTimeout(() => socket.destroy(), waitMs).unref();
    done();
  };
  const onData = (b: Buffer): void => {
    read += b.length;
    buf = Buffer.concat([buf, b]);
    let at = preface;
    while (buf.length >= at + 9) {
      const len = buf.readUIntBE(at, 3);
      const type = buf[at + 3];
      const stream = buf.readUInt32BE(at + 5) & 0x7fffffff;
      if (type === 1 && stream > 0) {
        const block = Buffer.concat([literal(":status", "200"), literal("content-type", "application/grpc"), literal("grpc-status", "14"), literal("grpc-message", encodeURIComponent(message))]);
        socket.write(frame(1, 0x5, stream, block)); // END_STREAM | END_HEADERS
        return finish(stream);
      }
      at += 9 + len;
    }
    if (read > maxRead) finish(0);
  };
  const timer = setTimeout(() => finish(0), waitMs);
  socket.on("data", onData);
  socket.once("close", () => finish(0));
  socket.write(Buffer.concat([frame(4, 0, 0, new Uint8Array(0)), frame(4, 1, 0, new Uint8Array(0))])); // our SETTINGS, and an ACK of theirs
  socket.resume();
}
