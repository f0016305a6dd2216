/**
 * Message compression (protocol.md §14): the flag byte and bounded decoders. Decoding never
 * produces more than the receiver's MAX_MESSAGE_SIZE: a zip bomb is `RESOURCE_EXHAUSTED` before
 * anything past the limit is kept; a bad flag or a corrupt body is `INTERNAL`.
 *
 * `zstd` (the `fzstd` package, pure JS) and `gzipWeb` (the platform's `DecompressionStream`)
 * work in browsers; Node's `zlib` gzip is in `@topspin/client/node` as `gzip`. Not yet wired
 * into the call paths (the Rust runtime does not negotiate compression yet either).
 * @module
 */
import { Decompress } from "fzstd";
import { Code, TopspinError } from "./status.js";

/** Thrown by a decoder whose output would pass the limit. */
export class LimitExceeded extends Error {
  constructor(limit: number) {
    super(`decompressed message exceeds the limit of ${limit} bytes (max_message_size)`);
    this.name = "LimitExceeded";
  }
}

/** Decompresses `body`, producing at most `limit` bytes (else throws {@link LimitExceeded}). */
export type Decoder = (body: Uint8Array, limit: number) => Uint8Array | Promise<Uint8Array>;

function concat(parts: Uint8Array[], total: number): Uint8Array {
  const out = new Uint8Array(total);
  let off = 0;
  for (const p of parts) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}

/** zstd (RFC 8878), streaming, bounded. */
export const zstd: Decoder = (body, limit) => {
  const parts: Uint8Array[] = [];
  let total = 0;
  let done = false;
  const d = new Decompress((chunk, final) => {
    total += chunk.length;
    if (total > limit) throw new LimitExceeded(limit);
    parts.push(chunk.slice());
    if (final) done = true;
  });
  d.push(body, true);
  if (!done && total === 0 && body.length > 0) throw new Error("zstd: no complete frame");
  return concat(parts, total);
};

/** gzip (RFC 1952) with the platform's `DecompressionStream` (browsers, Node 18+), bounded. */
export const gzipWeb: Decoder = async (body, limit) => {
  const ds = new DecompressionStream("gzip");
  const writer = ds.writable.getWriter();
  void writer.write(body as unknown as BufferSource).catch(() => undefined);
  void writer.close().catch(() => undefined);
  const reader = ds.readable.getReader();
  const parts: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.length;
    if (total > limit) {
      await reader.cancel();
      throw new LimitExceeded(limit);
    }
    parts.push(value);
  }
  return concat(parts, total);
};

/**
 * Decodes one message payload of a compressed direction: the flag byte (0 as is, 1 compressed
 * with `decoder`), bounded by `limit`. Throws {@link TopspinError} `INTERNAL` (missing or
 * unknown flag, corrupt body) or `RESOURCE_EXHAUSTED` (over the limit).
 */
export async function decodeMessage(payload: Uint8Array, decoder: Decoder, limit: number): Promise<Uint8Array> {
  if (payload.length === 0) throw new TopspinError(Code.INTERNAL, "compressed direction: message without its flag byte");
  const flag = payload[0];
  const body = payload.subarray(1);
  if (flag === 0) return body;
  if (flag !== 1) throw new TopspinError(Code.INTERNAL, `compressed direction: unknown flag byte ${String(flag)}`);
  try {
    return await decoder(body, limit);
  } catch (e) {
    if (e instanceof LimitExceeded) throw new TopspinError(Code.RESOURCE_EXHAUSTED, e.message);
    throw new TopspinError(Code.INTERNAL, `compressed message does not decode: ${e instanceof Error ? e.message : String(e)}`);
  }
}
