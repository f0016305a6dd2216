/**
 * The preface and SETTINGS exchange (§2, §4): the first 8 bytes, then the peer's SETTINGS as
 * its first frame.
 * @module
 */
import { ErrorCode, PREFACE, ProtocolError, effectiveSettings, type FrameDecoder, type Frame, type Settings } from "../frame.js";

/**
 * Reads the peer's preface from the decoder: `true` once it is complete and good (the decoder
 * then holds what follows it), `false` while it is incomplete (what arrived is checked and kept).
 * Throws `BAD_PREFACE` or `UNSUPPORTED_VERSION`.
 */
export function readPreface(decoder: FrameDecoder): boolean {
  if (decoder.pending < PREFACE.length) {
    const b = decoder.take(decoder.pending);
    checkMagic(b);
    decoder.push(b);
    return false;
  }
  const p = decoder.take(PREFACE.length);
  checkMagic(p);
  if (p[7] !== 1) {
    throw new ProtocolError(ErrorCode.UNSUPPORTED_VERSION, `protocol version ${p[7] ?? 0} is not supported; this peer speaks version 1`);
  }
  return true;
}

function checkMagic(b: Uint8Array): void {
  for (let i = 0; i < Math.min(b.length, 7); i++) {
    if (b[i] !== PREFACE[i]) throw new ProtocolError(ErrorCode.BAD_PREFACE, "the peer did not start with the TOPSPIN preface");
  }
}

/** The peer's settings from its first frame, which must be SETTINGS (ERROR is handled before). */
export function firstSettings(f: Frame): Settings {
  if (f.type !== "SETTINGS") throw new ProtocolError(ErrorCode.SETTINGS_ERROR, `the first frame was ${f.type}, not SETTINGS`);
  return effectiveSettings(f.entries);
}
