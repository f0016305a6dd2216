/**
 * A look at the frames of a zstd body (RFC 8878 §3.1) before any of it is decoded: the window
 * each frame asks for, its declared content size and its blocks' sizes. `fzstd` allocates
 * whatever window a frame header declares (up to 2 GiB: a 22-byte message once took 1 GiB and
 * seconds of CPU) and has no option to bound it, so {@link checkZstdFrames} refuses such a body
 * from its headers alone, as Go's decoder does (`WithDecoderMaxWindow(8 MiB)`).
 * @module
 */

/** The largest window a zstd frame may ask for: 8 MiB (the Go implementation's bound). */
export const ZSTD_MAX_WINDOW = 8 << 20;

/** Largest block (RFC 8878 §3.1.1.2.3: Block_Maximum_Size is at most 128 KiB). */
const MAX_BLOCK = 128 * 1024;

/** A zstd body that asks for a window over {@link ZSTD_MAX_WINDOW} (→ `RESOURCE_EXHAUSTED`, protocol.md §15). */
export class ZstdWindowTooLarge extends Error {
  constructor(window: number) {
    super(`zstd frame asks for a window of ${window} bytes, more than the ${ZSTD_MAX_WINDOW} this side allows`);
    this.name = "ZstdWindowTooLarge";
  }
}

/** One frame's header: where its blocks start, its window and its declared content size (-1: none). */
interface FrameHeader {
  blocksAt: number;
  /** One segment: the output is the window, bounded by the message limit instead. */
  single: boolean;
  window: number;
  contentSize: number;
  checksum: boolean;
}

/** Reads `n` (0, 1, 2, 4 or 8) little-endian bytes at `at` as a number (exact below 2^53). */
function readLe(b: Uint8Array, at: number, n: number): number {
  let v = 0;
  for (let i = n - 1; i >= 0; i--) v = v * 256 + (b[at + i] as number);
  return v;
}

/** Parses a zstd frame header at `at` (magic already checked); null when the body ends inside it. */
function frameHeader(b: Uint8Array, at: number): FrameHeader | null {
  const fhd = b[at + 4];
  if (fhd === undefined) return null;
  const fcsFlag = fhd >> 6;
  const single = (fhd & 0x20) !== 0;
  if ((fhd & 0x08) !== 0) throw new Error("zstd: reserved bit set in the frame header");
  const dictBytes = [0, 1, 2, 4][fhd & 3] as number;
  const fcsBytes = fcsFlag === 0 ? (single ? 1 : 0) : 1 << fcsFlag;
  let p = at + 5;
  let window = 0;
  if (!single) {
    const wd = b[p++];
    if (wd === undefined) return null;
    const base = 2 ** (10 + (wd >> 3));
    window = base + (base / 8) * (wd & 7);
  }
  p += dictBytes;
  if (p + fcsBytes > b.length) return null;
  let contentSize = fcsBytes === 0 ? -1 : readLe(b, p, fcsBytes);
  if (fcsBytes === 2) contentSize += 256;
  p += fcsBytes;
  if (single) window = contentSize; // §3.1.1.1.2: the window is the content
  return { blocksAt: p, single, window, contentSize, checksum: (fhd & 0x04) !== 0 };
}

/**
 * Walks a frame's blocks from `at`; returns where the frame ends (null: the body ends first).
 * Throws for a reserved block type or a block over Block_Maximum_Size.
 */
function skipBlocks(b: Uint8Array, at: number, h: FrameHeader): number | null {
  const maxBlock = Math.min(Math.max(h.window, 1), MAX_BLOCK);
  let p = at;
  for (;;) {
    if (p + 3 > b.length) return null;
    const bh = (b[p] as number) | ((b[p + 1] as number) << 8) | ((b[p + 2] as number) << 16);
    p += 3;
    const type = (bh >> 1) & 3;
    const size = bh >>> 3;
    if (type === 3) throw new Error("zstd: reserved block type");
    if (size > maxBlock) throw new Error(`zstd: block of ${size} bytes exceeds Block_Maximum_Size ${maxBlock}`);
    p += type === 1 ? 1 : size;
    if ((bh & 1) !== 0) return p + (h.checksum ? 4 : 0);
  }
}

/**
 * Checks every frame of a zstd body before it is decoded: a window over
 * {@link ZSTD_MAX_WINDOW} throws {@link ZstdWindowTooLarge} (a one-segment frame has no window
 * of its own: its declared content size counts against `limit`); declared content sizes adding up
 * to more than `limit` bytes return `true` (the caller refuses the message as over the limit);
 * a reserved bit or block type, or a block over 128 KiB, throws. A body that ends early is left
 * to the decoder (it reports the truncation). Costs one step per block; allocates nothing.
 */
export function checkZstdFrames(body: Uint8Array, limit: number): boolean {
  let p = 0;
  let declared = 0;
  while (p + 4 <= body.length) {
    const magic = readLe(body, p, 4);
    if (magic >= 0x184d2a50 && magic <= 0x184d2a5f) {
      if (p + 8 > body.length) return false;
      p += 8 + readLe(body, p + 4, 4); // skippable frame
      continue;
    }
    if (magic !== 0xfd2fb528) throw new Error("zstd: not a zstd frame");
    const h = frameHeader(body, p);
    if (h === null) return false;
    if (!h.single && h.window > ZSTD_MAX_WINDOW) throw new ZstdWindowTooLarge(h.window);
    if (h.contentSize >= 0) {
      declared += h.contentSize;
      if (declared > limit) return true;
    }
    const end = skipBlocks(body, h.blocksAt, h);
    if (end === null) return false;
    p = end;
  }
  return false;
}
