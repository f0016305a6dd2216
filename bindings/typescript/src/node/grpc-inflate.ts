/**
 * gzip and deflate requests of the gRPC face, held to the bounds the Rust server and the Go
 * face keep: inflated when the handler takes the message (not as it arrives), never past
 * `maxMessageSize`, every byte charged to the memory budget before it is produced (see
 * {@link inflate}) — a message that finds no room is refused `RESOURCE_EXHAUSTED`, as one past
 * the size.
 *
 * `@grpc/grpc-js` would inflate each message as it arrives, whole and uncharged, and queue up
 * to 16 of a stream's for its handler. {@link inflateLater}, a grpc-js server interceptor,
 * replaces that decompression for the calls whose `grpc-encoding` is gzip or deflate (the
 * call's internal `decompressMessage`): their compressed messages are handed on as they came,
 * marked, and {@link inflate} inflates them when the handler takes one (grpc-calls.ts). Other
 * calls are left to grpc-js as they were (identity at no cost; zstd and the rest refused
 * `UNIMPLEMENTED` by grpc-js); so are all calls of a grpc-js without that method.
 * @module
 */
import type * as grpc from "@grpc/grpc-js";
import { createGunzip, createInflate } from "node:zlib";
import { LimitExceeded } from "../compression.js";
import type { MemoryBudget } from "../connection.js";
import { Code, TopspinError } from "../status.js";

/** The encodings inflated here (grpc-js's own list of what it decodes). */
type Encoding = "gzip" | "deflate";

/** Request messages handed on compressed (by their Buffer, which the raw deserializer passes through), with their encoding. */
const compressed = new WeakMap<Buffer, Encoding>();

/** The most deflate inflates one byte to (its longest match, 258 bytes, in a 2-bit code: 1032 to 1; RFC 1951). */
const DEFLATE_RATIO = 1032;
/** The smallest zlib output buffer (so that a message larger than foreseen comes in few pieces). */
const MIN_PIECE = 64 * 1024;

/** What grpc-js's base server call has (internal, grpc-js 1.10 to 1.14 at least). */
interface BaseCall {
  incomingEncoding?: unknown;
  decompressMessage?: (message: Buffer, encoding: string) => Buffer | Promise<Buffer>;
  nextCall?: unknown;
}

/** The base call under a grpc-js intercepting call (itself, when no interceptor came before). */
function baseOf(call: unknown): BaseCall | undefined {
  let c = call;
  for (let i = 0; i < 16 && typeof c === "object" && c !== null; i++) {
    if (typeof (c as BaseCall).decompressMessage === "function") return c;
    c = (c as BaseCall).nextCall;
  }
  return undefined;
}

/**
 * The grpc-js server interceptor: a gzip or deflate call's messages are handed on compressed
 * (those whose prefix says so: the 5-byte prefix dropped, the body marked) instead of inflated.
 */
export const inflateLater: grpc.ServerInterceptor = (_method, call) => {
  const base = baseOf(call);
  const enc = base?.incomingEncoding;
  if (base !== undefined && (enc === "gzip" || enc === "deflate")) {
    base.decompressMessage = (message, encoding) => {
      const body = message.subarray(5);
      if (encoding === enc) compressed.set(body, enc);
      return body; // "identity": a message the client sent uncompressed
    };
  }
  // The call itself, not a wrapper (no cost per message): grpc-js types an interceptor's result
  // as its ServerInterceptingCall class but uses only the interface every call has.
  return call as grpc.ServerInterceptingCall;
};

/** The encoding of a request message handed on compressed by {@link inflateLater} (undefined: not compressed). */
export function compressedWith(b: Buffer): Encoding | undefined {
  return compressed.get(b);
}

/** Holds `n` more bytes of `budget` if they fit under its limit. */
function tryReserve(budget: MemoryBudget, n: number): boolean {
  if (budget.used + n > budget.limit) return false;
  budget.reserve(n);
  return true;
}

const noRoom = (enc: Encoding, budget: MemoryBudget): TopspinError =>
  new TopspinError(Code.RESOURCE_EXHAUSTED, `no room in the memory budget to decompress a ${enc} message (${budget.used} of ${budget.limit} bytes in use)`);

/**
 * What `body` inflates to at most, bytes (`limit + 1`: past the limit): a gzip member's own
 * size (ISIZE, RFC 1952 §2.3.1: the size mod 2^32, so a valid one past `limit` is past it), or
 * deflate's most per byte. -1: gzip past `limit`.
 */
function foreseen(body: Buffer, enc: Encoding, limit: number): number {
  if (enc === "gzip" && body.length >= 18) {
    const isize = body.readUInt32LE(body.length - 4);
    return isize > limit ? -1 : isize;
  }
  return Math.min(limit + 1, body.length * DEFLATE_RATIO + 1024);
}

/**
 * Inflates `body` (zlib, off the event loop), never past `limit` bytes. What it inflates to at
 * most (gzip's ISIZE; deflate's most) is charged to `budget` before anything is inflated, and
 * the message written in place in one buffer of that size, never copied (its untouched pages
 * cost no memory). Output past it (an ISIZE that lies, gzip members one after the other), or
 * all of a deflate message whose most finds no room, is charged piece by piece as it comes and
 * the pieces copied into one buffer, both charged meanwhile. Resolves with the message, whose
 * length stays charged (the caller releases it); rejects with `RESOURCE_EXHAUSTED` (past
 * `limit`, no room in the budget) or `INTERNAL` (not valid), or the reason `signal` aborted
 * with, nothing left charged.
 */
export function inflate(body: Buffer, enc: Encoding, limit: number, budget: MemoryBudget, signal: AbortSignal): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const most = foreseen(body, enc, limit);
    if (most < 0) return reject(new TopspinError(Code.RESOURCE_EXHAUSTED, new LimitExceeded(limit).message));
    let charged = tryReserve(budget, most) ? most : 0;
    if (charged === 0 && enc === "gzip" && most > 0) return reject(noRoom(enc, budget)); // its own size: no room for it
    let total = 0;
    let over = false;
    const pieces: Buffer[] = [];
    const chunkSize = Math.max(charged + 1, MIN_PIECE); // + 1: the end is seen with room left
    const z = enc === "gzip" ? createGunzip({ chunkSize }) : createInflate({ chunkSize });
    const end = (r: Buffer | TopspinError): void => {
      if (over) return;
      over = true;
      signal.removeEventListener("abort", aborted);
      z.destroy();
      if (r instanceof TopspinError) {
        budget.release(charged);
        reject(r);
      } else {
        budget.release(charged - r.length);
        resolve(r);
      }
    };
    const aborted = (): void => end(TopspinError.from(signal.reason, Code.CANCELLED));
    z.on("data", (piece: Buffer) => {
      total += piece.length;
      if (total > limit) return end(new TopspinError(Code.RESOURCE_EXHAUSTED, new LimitExceeded(limit).message));
      if (total > charged && !tryReserve(budget, total - charged)) return end(noRoom(enc, budget));
      charged = Math.max(charged, total);
      pieces.push(piece);
    });
    z.on("error", (e) => end(new TopspinError(Code.INTERNAL, `failed to decompress the ${enc} request message: ${e.message}`)));
    z.on("end", () => {
      if (over) return;
      const one = pieces.length === 1 ? (pieces[0] as Buffer) : undefined;
      if (one !== undefined && one.buffer.byteLength <= 2 * one.length) return end(one);
      // pieces, or a small message in a large buffer: copied into one of its size, both charged
      if (!tryReserve(budget, total)) return end(noRoom(enc, budget));
      const whole = Buffer.concat(pieces, total);
      budget.release(total);
      end(whole);
    });
    if (signal.aborted) return aborted();
    signal.addEventListener("abort", aborted, { once: true });
    z.end(body);
  });
}
