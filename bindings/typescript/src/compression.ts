/**
 * Message compression (protocol.md §14): the flag byte and bounded decoders. Decoding never
 * produces more than the receiver's MAX_MESSAGE_SIZE: a zip bomb is `RESOURCE_EXHAUSTED` before
 * anything past the limit is kept; a bad flag or a corrupt body is `INTERNAL`.
 *
 * `zstd` (the `fzstd` package, pure JS) and `gzipWeb` (the platform's `DecompressionStream`)
 * work in browsers; Node's `zlib` gzip is in `@topspin/topspin/node` as `gzip`. Negotiation
 * (§15): {@link Codecs} name what a peer can encode and decode; {@link webCodecs} is the browser
 * set, `nodeCodecs` (in `@topspin/topspin/node`) the Node one. Sending zstd needs an encoder that
 * neither set has (no well-kept pure-JS/wasm zstd *encoder* is used here; Node 20's zlib has
 * none), so both offer gzip for sending and decode both gzip and zstd.
 * @module
 */
import { Decompress } from "fzstd";
import { Code, TopspinError } from "./status.js";
import { ZstdWindowTooLarge, checkZstdFrames } from "./zstd-frames.js";

export { ZSTD_MAX_WINDOW, ZstdWindowTooLarge, checkZstdFrames } from "./zstd-frames.js";

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

/**
 * zstd (RFC 8878), streaming, bounded: every frame header is checked first
 * ({@link checkZstdFrames}: a window over 8 MiB is refused before `fzstd` allocates it, declared
 * content sizes over `limit` are {@link LimitExceeded}), then output stops past `limit`.
 */
export const zstd: Decoder = (body, limit) => {
  if (checkZstdFrames(body, limit)) throw new LimitExceeded(limit);
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
    if (e instanceof LimitExceeded || e instanceof ZstdWindowTooLarge) throw new TopspinError(Code.RESOURCE_EXHAUSTED, e.message);
    throw new TopspinError(Code.INTERNAL, `compressed message does not decode: ${e instanceof Error ? e.message : String(e)}`);
  }
}

/** Compresses a whole message body. */
export type Encoder = (message: Uint8Array) => Uint8Array | Promise<Uint8Array>;

/** An encoding name of §15. */
export type Compression = "gzip" | "zstd";

/** Metadata key naming the encoding of its sender's messages on the call. */
export const ENCODING_KEY = "topspin-encoding";
/** Metadata key listing the encodings its sender can decode, comma-separated. */
export const ACCEPT_ENCODING_KEY = "topspin-accept-encoding";

/** What a peer can encode (send compressed) and decode, by encoding name. */
export interface Codecs {
  encoders: Partial<Record<string, Encoder>>;
  decoders: Partial<Record<string, Decoder>>;
}

/** Messages below this size go with flag 0 (§15: RECOMMENDED below 1 KiB). */
export const COMPRESSION_THRESHOLD = 1024;

/** gzip with the platform's `CompressionStream` (browsers, Node 18+). */
export const gzipWebEncode: Encoder = async (message) => {
  const cs = new CompressionStream("gzip");
  const writer = cs.writable.getWriter();
  void writer.write(message as unknown as BufferSource).catch(() => undefined);
  void writer.close().catch(() => undefined);
  const reader = cs.readable.getReader();
  const parts: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.length;
    parts.push(value);
  }
  return concat(parts, total);
};

/** The browser set: gzip both ways (Compression/DecompressionStream), zstd decoding (fzstd). */
export const webCodecs: Codecs = { encoders: { gzip: gzipWebEncode }, decoders: { zstd, gzip: gzipWeb } };

/** The names `codecs` can decode, as sent in `topspin-accept-encoding` (zstd first). */
export function acceptList(codecs: Codecs): string {
  return Object.keys(codecs.decoders)
    .filter((k) => codecs.decoders[k] !== undefined)
    .sort((a, b) => (a === "zstd" ? -1 : b === "zstd" ? 1 : 0))
    .join(",");
}

/** Whether a `topspin-accept-encoding` value lists `name`. */
export function accepts(value: string | undefined, name: string): boolean {
  return value !== undefined && value.split(",").some((n) => n.trim() === name);
}

/**
 * Encodes one message for a compressed direction: flag 0 and the message when it is small
 * (below {@link COMPRESSION_THRESHOLD}) or would not shrink, else flag 1 and the compressed body.
 */
export async function encodeMessage(message: Uint8Array, encoder: Encoder, threshold = COMPRESSION_THRESHOLD): Promise<Uint8Array> {
  if (message.length >= threshold) {
    const body = await encoder(message);
    if (body.length < message.length) {
      const out = new Uint8Array(body.length + 1);
      out[0] = 1;
      out.set(body, 1);
      return out;
    }
  }
  const out = new Uint8Array(message.length + 1);
  out.set(message, 1);
  return out;
}
