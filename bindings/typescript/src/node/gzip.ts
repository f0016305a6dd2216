/**
 * gzip for Node with `zlib`, bounded by `maxOutputLength` (see `Decoder` in compression.ts), and
 * the Node set of codecs.
 * @module
 */
import { gunzipSync, gzipSync } from "node:zlib";
import { LimitExceeded, zstd, type Codecs, type Decoder, type Encoder } from "../compression.js";

/** gzip (RFC 1952) with Node's zlib; never produces more than `limit` bytes. */
export const gzip: Decoder = (body, limit) => {
  try {
    return gunzipSync(body, { maxOutputLength: Math.max(1, limit) });
  } catch (e) {
    if ((e as { code?: string }).code === "ERR_BUFFER_TOO_LARGE") throw new LimitExceeded(limit);
    throw e;
  }
};

/** gzip compression with Node's zlib (level 6, zlib's default). */
export const gzipEncode: Encoder = (message) => gzipSync(message);

/** The Node set: gzip both ways (zlib), zstd decoding (fzstd). */
export const nodeCodecs: Codecs = { encoders: { gzip: gzipEncode }, decoders: { zstd, gzip } };

/**
 * The Node server's default set: gzip both ways, and no zstd decoding. `fzstd` bounds what a
 * hostile zstd message can make it allocate (the window check, `max_message_size`), not the CPU
 * time its sequence decoder spends on one crafted block (seconds for a few KiB; see README): a
 * server accepts zstd requests only when told to (`codecs: nodeCodecs`), from clients it trusts.
 */
export const nodeServerCodecs: Codecs = { encoders: { gzip: gzipEncode }, decoders: { gzip } };
