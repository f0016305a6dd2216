/**
 * gzip for Node with `zlib`, bounded by `maxOutputLength` (see `Decoder` in compression.ts).
 * @module
 */
import { gunzipSync } from "node:zlib";
import { LimitExceeded, type Decoder } from "../compression.js";

/** gzip (RFC 1952) with Node's zlib; never produces more than `limit` bytes. */
export const gzip: Decoder = (body, limit) => {
  try {
    return gunzipSync(body, { maxOutputLength: Math.max(1, limit) });
  } catch (e) {
    if ((e as { code?: string }).code === "ERR_BUFFER_TOO_LARGE") throw new LimitExceeded(limit);
    throw e;
  }
};
