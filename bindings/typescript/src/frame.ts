/**
 * The topspin v1 frame codec (docs/protocol.md §2–§5): frame types, a streaming decoder that
 * checks what a frame says about itself, and an encoder. No I/O, no Node APIs.
 * @module
 */

/** The 8-byte connection preface: `TOPSPIN` and version 1 (§2). */
export const PREFACE = new Uint8Array([0x54, 0x4f, 0x50, 0x53, 0x50, 0x49, 0x4e, 0x01]);
/** Length of the fixed frame header (§3). */
export const HEADER_LEN = 12;

/** Frame type bytes (§5). */
export const FrameType = {
  SETTINGS: 0x01,
  CALL: 0x02,
  MESSAGE: 0x03,
  CONTINUATION: 0x04,
  HEADERS: 0x05,
  HALF_CLOSE: 0x06,
  END: 0x07,
  CANCEL: 0x08,
  CREDIT: 0x09,
  PING: 0x0a,
  GOAWAY: 0x0b,
  ERROR: 0x0c,
} as const;

/** Flag bits (§5). */
export const Flags = { NAMED: 0x01, END_STREAM: 0x01, SPLIT: 0x02, ACK: 0x01 } as const;

/** Protocol (connection) error codes (§10). */
export const ErrorCode = {
  NO_ERROR: 0,
  BAD_PREFACE: 1,
  UNSUPPORTED_VERSION: 2,
  SETTINGS_ERROR: 3,
  FRAME_TOO_LARGE: 4,
  UNKNOWN_FRAME_TYPE: 5,
  MALFORMED_FRAME: 6,
  ILLEGAL_FRAME: 7,
  UNKNOWN_CALL: 8,
  DUPLICATE_CALL: 9,
  METHOD_ID_ERROR: 10,
  FLOW_CONTROL: 11,
  MESSAGE_LENGTH_MISMATCH: 12,
  TIMEOUT: 13,
  INTERNAL_ERROR: 14,
  ENHANCE_YOUR_CALM: 15,
} as const;

/** Name of a protocol error code, or its number as text when unknown. */
export function errorCodeName(code: number): string {
  for (const [k, v] of Object.entries(ErrorCode)) if (v === code) return k;
  return String(code);
}

/** A connection error (§10): the byte stream can no longer be trusted. */
export class ProtocolError extends Error {
  /** The §10 error code. */
  readonly code: number;
  constructor(code: number, reason: string) {
    super(reason);
    this.name = "ProtocolError";
    this.code = code;
  }
}

/** One metadata entry (§5.1): a text value, or bytes for a key ending in `-bin`. */
export interface MetadataEntry {
  key: string;
  value: string | Uint8Array;
}
/** A metadata block: entries in wire order, keys may repeat. */
export type Metadata = MetadataEntry[];

/** The five settings (§4). */
export interface Settings {
  maxFrameSize: number;
  maxConcurrentCalls: number;
  initialCallWindow: number;
  maxMessageSize: number;
  maxMetadataSize: number;
}

/** The defaults of §4. */
export const DEFAULT_SETTINGS: Readonly<Settings> = Object.freeze({
  maxFrameSize: 16_777_216,
  maxConcurrentCalls: 1024,
  initialCallWindow: 1_048_576,
  maxMessageSize: 67_108_864,
  maxMetadataSize: 16_384,
});

const SETTING_KEYS: Record<number, keyof Settings> = {
  1: "maxFrameSize",
  2: "maxConcurrentCalls",
  3: "initialCallWindow",
  4: "maxMessageSize",
  5: "maxMetadataSize",
};
const SETTING_RANGES: Record<keyof Settings, [number, number]> = {
  maxFrameSize: [16_384, 2_147_483_647],
  maxConcurrentCalls: [0, 2_147_483_647],
  initialCallWindow: [0, 2_147_483_647],
  maxMessageSize: [0, 4_294_967_295],
  maxMetadataSize: [4, 4_294_967_295],
};

/** Applies SETTINGS entries to the defaults and checks the ranges (`SETTINGS_ERROR`). */
export function effectiveSettings(entries: readonly SettingEntry[]): Settings {
  const s: Settings = { ...DEFAULT_SETTINGS };
  for (const e of entries) {
    const k = SETTING_KEYS[e.id];
    if (k !== undefined) s[k] = e.value;
  }
  for (const [k, [lo, hi]] of Object.entries(SETTING_RANGES) as [keyof Settings, [number, number]][]) {
    if (s[k] < lo || s[k] > hi) {
      throw new ProtocolError(ErrorCode.SETTINGS_ERROR, `setting ${k} = ${s[k]} is outside ${lo}..=${hi}`);
    }
  }
  return s;
}

/** The SETTINGS entries that announce `s` (only the values that differ from the defaults). */
export function settingsEntries(s: Settings): SettingEntry[] {
  const out: SettingEntry[] = [];
  for (const [id, k] of Object.entries(SETTING_KEYS)) {
    if (s[k] !== DEFAULT_SETTINGS[k]) out.push({ id: Number(id), value: s[k] });
  }
  return out;
}

/** One SETTINGS entry. */
export interface SettingEntry {
  id: number;
  value: number;
}

interface Base {
  flags: number;
  callId: number;
}
/** A decoded or to-be-encoded frame. */
export type Frame =
  | (Base & { type: "SETTINGS"; entries: SettingEntry[] })
  | (Base & {
      type: "CALL";
      methodId: number;
      methodName: string | null;
      codec: number;
      timeoutUs: bigint;
      metadata: Metadata;
    })
  | (Base & { type: "MESSAGE"; endStream: boolean; totalLen: number | null; chunk: Uint8Array })
  | (Base & { type: "CONTINUATION"; chunk: Uint8Array })
  | (Base & { type: "HEADERS"; metadata: Metadata })
  | (Base & { type: "HALF_CLOSE" })
  | (Base & { type: "END"; code: number; message: string; trailers: Metadata })
  | (Base & { type: "CANCEL"; code: number })
  | (Base & { type: "CREDIT"; increment: number })
  | (Base & { type: "PING"; ack: boolean; data: Uint8Array })
  | (Base & { type: "GOAWAY"; lastCallId: number; code: number; reason: string })
  | (Base & { type: "ERROR"; code: number; reason: string })
  | (Base & { type: "EXTENSION"; extType: number; payload: Uint8Array });

const enc = new TextEncoder();
const dec = new TextDecoder("utf-8", { fatal: true });

function malformed(what: string): ProtocolError {
  return new ProtocolError(ErrorCode.MALFORMED_FRAME, what);
}

/** Decodes UTF-8 strictly (`MALFORMED_FRAME` on invalid bytes). */
function utf8(b: Uint8Array, what: string): string {
  try {
    return dec.decode(b);
  } catch {
    throw malformed(`${what} is not UTF-8`);
  }
}

/** Whether a metadata key is valid (§5.1): 1..=255 bytes of `0-9 a-z - _ .`. */
export function validKey(key: string): boolean {
  if (key.length < 1 || key.length > 255) return false;
  for (let i = 0; i < key.length; i++) {
    const c = key.charCodeAt(i);
    const ok = (c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x7a) || c === 0x2d || c === 0x5f || c === 0x2e;
    if (!ok) return false;
  }
  return true;
}

/** A bounds-checked little-endian reader over one payload. */
class Reader {
  pos = 0;
  private readonly view: DataView;
  constructor(readonly b: Uint8Array) {
    this.view = new DataView(b.buffer, b.byteOffset, b.byteLength);
  }
  need(n: number, what: string): void {
    if (this.b.length - this.pos < n) throw malformed(`${what}: payload too short`);
  }
  u8(what: string): number {
    this.need(1, what);
    return this.view.getUint8(this.pos++);
  }
  u16(what: string): number {
    this.need(2, what);
    const v = this.view.getUint16(this.pos, true);
    this.pos += 2;
    return v;
  }
  u32(what: string): number {
    this.need(4, what);
    const v = this.view.getUint32(this.pos, true);
    this.pos += 4;
    return v;
  }
  u64(what: string): bigint {
    this.need(8, what);
    const v = this.view.getBigUint64(this.pos, true);
    this.pos += 8;
    return v;
  }
  bytes(n: number, what: string): Uint8Array {
    this.need(n, what);
    const v = this.b.subarray(this.pos, this.pos + n);
    this.pos += n;
    return v;
  }
  rest(): Uint8Array {
    const v = this.b.subarray(this.pos);
    this.pos = this.b.length;
    return v;
  }
  end(what: string): void {
    if (this.pos !== this.b.length) throw malformed(`${what}: ${this.b.length - this.pos} trailing bytes`);
  }
}

function readMetadata(r: Reader): Metadata {
  const count = r.u16("metadata count");
  const md: Metadata = [];
  for (let i = 0; i < count; i++) {
    const kl = r.u8("metadata key_len");
    const vl = r.u16("metadata value_len");
    const kb = r.bytes(kl, "metadata key");
    const vb = r.bytes(vl, "metadata value");
    let key = "";
    for (const c of kb) key += String.fromCharCode(c);
    if (!validKey(key)) throw malformed(`invalid metadata key ${JSON.stringify(key)}`);
    md.push({ key, value: key.endsWith("-bin") ? vb.slice() : utf8(vb, `metadata value of ${key}`) });
  }
  return md;
}

/** The encoded size of a metadata block (§5.1). */
export function metadataSize(md: Metadata): number {
  let n = 2;
  for (const e of md) n += 3 + e.key.length + valueBytes(e.value).length;
  return n;
}

function valueBytes(v: string | Uint8Array): Uint8Array {
  return typeof v === "string" ? enc.encode(v) : v;
}

/** Maps a status code above 16 to UNKNOWN (§11). */
export function normalizeStatus(code: number): number {
  return code > 16 ? 2 : code;
}

const CONNECTION_TYPES = new Set<number>([FrameType.SETTINGS, FrameType.PING, FrameType.GOAWAY, FrameType.ERROR]);

/** Parsed frame header. */
export interface Header {
  length: number;
  type: number;
  flags: number;
  callId: number;
}

/**
 * Checks a frame header on its own (§3): `FRAME_TOO_LARGE`, `UNKNOWN_FRAME_TYPE`, the call id 0
 * rules. Called before the payload is buffered.
 */
export function checkHeader(h: Header, maxFrameSize: number): void {
  if (h.length > maxFrameSize) {
    throw new ProtocolError(ErrorCode.FRAME_TOO_LARGE, `frame of ${h.length} bytes exceeds MAX_FRAME_SIZE ${maxFrameSize}`);
  }
  if (h.type === 0 || (h.type >= 0x0d && h.type <= 0x7f)) {
    throw new ProtocolError(ErrorCode.UNKNOWN_FRAME_TYPE, `unknown frame type 0x${h.type.toString(16)}`);
  }
  if (h.type >= 0x80) return;
  const conn = CONNECTION_TYPES.has(h.type);
  if (conn && h.callId !== 0) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `connection frame type ${h.type} on call ${h.callId}`);
  if (!conn && h.callId === 0) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `call frame type ${h.type} on call id 0`);
}

/** Decodes one payload whose header passed {@link checkHeader}. */
export function decodePayload(h: Header, payload: Uint8Array): Frame {
  const r = new Reader(payload);
  const flags = h.flags;
  const callId = h.callId;
  switch (h.type) {
    case FrameType.SETTINGS: {
      if (payload.length % 6 !== 0) throw malformed(`SETTINGS length ${payload.length} is not a multiple of 6`);
      const entries: SettingEntry[] = [];
      while (r.pos < payload.length) entries.push({ id: r.u16("id"), value: r.u32("value") });
      effectiveSettings(entries);
      return { type: "SETTINGS", flags, callId, entries };
    }
    case FrameType.CALL:
      return decodeCall(r, flags, callId);
    case FrameType.MESSAGE: {
      let totalLen: number | null = null;
      if (flags & Flags.SPLIT) totalLen = r.u32("MESSAGE total_len");
      return { type: "MESSAGE", flags, callId, endStream: (flags & Flags.END_STREAM) !== 0, totalLen, chunk: r.rest() };
    }
    case FrameType.CONTINUATION:
      return { type: "CONTINUATION", flags, callId, chunk: r.rest() };
    case FrameType.HEADERS: {
      const metadata = readMetadata(r);
      r.end("HEADERS");
      return { type: "HEADERS", flags, callId, metadata };
    }
    case FrameType.HALF_CLOSE:
      r.end("HALF_CLOSE");
      return { type: "HALF_CLOSE", flags, callId };
    case FrameType.END:
      return decodeEnd(r, flags, callId);
    case FrameType.CANCEL: {
      if (payload.length !== 2) throw malformed(`CANCEL payload of ${payload.length} bytes`);
      return { type: "CANCEL", flags, callId, code: normalizeStatus(r.u16("CANCEL code")) };
    }
    case FrameType.CREDIT: {
      if (payload.length !== 4) throw malformed(`CREDIT payload of ${payload.length} bytes`);
      const increment = r.u32("CREDIT increment");
      if (increment === 0 || increment > 0x7fffffff) throw malformed(`CREDIT increment ${increment}`);
      return { type: "CREDIT", flags, callId, increment };
    }
    case FrameType.PING: {
      if (payload.length !== 8) throw malformed(`PING payload of ${payload.length} bytes`);
      return { type: "PING", flags, callId, ack: (flags & Flags.ACK) !== 0, data: payload.slice() };
    }
    case FrameType.GOAWAY: {
      const lastCallId = r.u32("GOAWAY last_call_id");
      const code = r.u16("GOAWAY code");
      const rl = r.u16("GOAWAY reason_len");
      const reason = utf8(r.bytes(rl, "GOAWAY reason"), "GOAWAY reason");
      r.end("GOAWAY");
      return { type: "GOAWAY", flags, callId, lastCallId, code, reason };
    }
    case FrameType.ERROR: {
      const code = r.u16("ERROR code");
      const rl = r.u16("ERROR reason_len");
      const reason = utf8(r.bytes(rl, "ERROR reason"), "ERROR reason");
      r.end("ERROR");
      return { type: "ERROR", flags, callId, code, reason };
    }
    default:
      return { type: "EXTENSION", flags, callId, extType: h.type, payload: payload.slice() };
  }
}

function decodeCall(r: Reader, flags: number, callId: number): Frame {
  const methodId = r.u16("CALL method_id");
  const codec = r.u8("CALL codec");
  r.u8("CALL rsv");
  const timeoutUs = r.u64("CALL timeout_us");
  let methodName: string | null = null;
  if (flags & Flags.NAMED) {
    const nl = r.u16("CALL name_len");
    if (nl < 1 || nl > 1024) throw malformed(`method name of ${nl} bytes (1..=1024)`);
    methodName = utf8(r.bytes(nl, "CALL name"), "method name");
  }
  const metadata = readMetadata(r);
  r.end("CALL");
  return { type: "CALL", flags, callId, methodId, methodName, codec, timeoutUs, metadata };
}

function decodeEnd(r: Reader, flags: number, callId: number): Frame {
  const code = normalizeStatus(r.u16("END code"));
  const ml = r.u16("END msg_len");
  const message = utf8(r.bytes(ml, "END message"), "END message");
  const trailers = readMetadata(r);
  r.end("END");
  return { type: "END", flags, callId, code, message, trailers };
}

/**
 * A streaming frame decoder: feed it bytes in any pieces, take whole frames out. Header checks
 * happen as soon as 12 bytes are there, before the payload is buffered.
 */
export class FrameDecoder {
  private chunks: Uint8Array[] = [];
  private buffered = 0;
  private header: Header | null = null;
  /** `maxFrameSize`: the local MAX_FRAME_SIZE. */
  constructor(public maxFrameSize: number = DEFAULT_SETTINGS.maxFrameSize) {}

  /** Appends received bytes. */
  push(b: Uint8Array): void {
    if (b.length === 0) return;
    this.chunks.push(b);
    this.buffered += b.length;
  }

  /** Bytes held and not yet consumed. */
  get pending(): number {
    return this.buffered;
  }

  /** Whether a frame has started to arrive and is not complete (its header read, or part of it). */
  get midFrame(): boolean {
    return this.header !== null || this.buffered > 0;
  }

  /** The length its header announced for the frame being received (0 when no header is read yet). */
  get announced(): number {
    return this.header?.length ?? 0;
  }

  /** Takes exactly `n` buffered bytes (n ≤ buffered). */
  take(n: number): Uint8Array {
    if (n === 0) return new Uint8Array(0);
    const first = this.chunks[0];
    if (first !== undefined && first.length >= n) {
      const out = first.subarray(0, n);
      if (first.length === n) this.chunks.shift();
      else this.chunks[0] = first.subarray(n);
      this.buffered -= n;
      return out;
    }
    const out = new Uint8Array(n);
    let off = 0;
    while (off < n) {
      const c = this.chunks[0] as Uint8Array;
      const k = Math.min(c.length, n - off);
      out.set(c.subarray(0, k), off);
      off += k;
      if (k === c.length) this.chunks.shift();
      else this.chunks[0] = c.subarray(k);
    }
    this.buffered -= n;
    return out;
  }

  /** The next whole frame, or `null` when more bytes are needed. Throws {@link ProtocolError}. */
  next(): Frame | null {
    if (this.header === null) {
      if (this.buffered < HEADER_LEN) return null;
      const hb = this.take(HEADER_LEN);
      const v = new DataView(hb.buffer, hb.byteOffset, HEADER_LEN);
      const h: Header = { length: v.getUint32(0, true), type: v.getUint8(4), flags: v.getUint8(5), callId: v.getUint32(8, true) };
      checkHeader(h, this.maxFrameSize);
      this.header = h;
    }
    const h = this.header;
    if (this.buffered < h.length) return null;
    this.header = null;
    return decodePayload(h, this.take(h.length));
  }
}

/** Decodes exactly one frame from `b` (tests, tools). */
export function decodeFrame(b: Uint8Array, maxFrameSize: number = DEFAULT_SETTINGS.maxFrameSize): { frame: Frame | null; consumed: number } {
  const d = new FrameDecoder(maxFrameSize);
  d.push(b);
  const frame = d.next();
  return { frame, consumed: b.length - d.pending };
}

/** A growable little-endian writer. */
class Writer {
  buf: Uint8Array;
  view: DataView;
  pos = 0;
  constructor(cap: number) {
    this.buf = new Uint8Array(cap);
    this.view = new DataView(this.buf.buffer);
  }
  u8(v: number): void {
    this.view.setUint8(this.pos++, v);
  }
  u16(v: number): void {
    this.view.setUint16(this.pos, v, true);
    this.pos += 2;
  }
  u32(v: number): void {
    this.view.setUint32(this.pos, v, true);
    this.pos += 4;
  }
  u64(v: bigint): void {
    this.view.setBigUint64(this.pos, v, true);
    this.pos += 8;
  }
  bytes(b: Uint8Array): void {
    this.buf.set(b, this.pos);
    this.pos += b.length;
  }
}

/** Cuts UTF-8 bytes at the last character boundary at or before `max` bytes (§5). */
export function truncateUtf8(b: Uint8Array, max: number): Uint8Array {
  if (b.length <= max) return b;
  let n = max;
  while (n > 0 && ((b[n] as number) & 0xc0) === 0x80) n--;
  return b.subarray(0, n);
}

function encodedMetadata(md: Metadata): { key: Uint8Array; value: Uint8Array }[] {
  return md.map((e) => ({ key: enc.encode(e.key), value: valueBytes(e.value) }));
}

function writeMetadata(w: Writer, md: { key: Uint8Array; value: Uint8Array }[]): void {
  w.u16(md.length);
  for (const e of md) {
    w.u8(e.key.length);
    w.u16(e.value.length);
    w.bytes(e.key);
    w.bytes(e.value);
  }
}

function mdLen(md: { key: Uint8Array; value: Uint8Array }[]): number {
  let n = 2;
  for (const e of md) n += 3 + e.key.length + e.value.length;
  return n;
}

/** The header of a frame, 12 bytes. */
export function encodeHeader(length: number, type: number, flags: number, callId: number): Uint8Array {
  const h = new Uint8Array(HEADER_LEN);
  const v = new DataView(h.buffer);
  v.setUint32(0, length, true);
  v.setUint8(4, type);
  v.setUint8(5, flags);
  v.setUint32(8, callId, true);
  return h;
}

/**
 * Encodes a frame into one buffer (header and payload). For MESSAGE and CONTINUATION prefer
 * {@link encodeMessageParts}, which does not copy the chunk.
 */
export function encodeFrame(f: Frame): Uint8Array {
  const parts = encodeParts(f);
  if (parts.length === 1) return parts[0] as Uint8Array;
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let off = 0;
  for (const p of parts) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}

/** Encodes a frame as a list of buffers to write in order (the chunk of a message is not copied). */
export function encodeParts(f: Frame): Uint8Array[] {
  let w: Writer;
  let type: number;
  switch (f.type) {
    case "SETTINGS":
      w = new Writer(6 * f.entries.length);
      for (const e of f.entries) {
        w.u16(e.id);
        w.u32(e.value);
      }
      type = FrameType.SETTINGS;
      break;
    case "CALL":
      w = callPayload(f);
      type = FrameType.CALL;
      break;
    case "MESSAGE": {
      if (f.totalLen === null) return [encodeHeader(f.chunk.length, FrameType.MESSAGE, f.flags, f.callId), f.chunk];
      const h = new Uint8Array(HEADER_LEN + 4);
      h.set(encodeHeader(f.chunk.length + 4, FrameType.MESSAGE, f.flags, f.callId));
      new DataView(h.buffer).setUint32(HEADER_LEN, f.totalLen, true);
      return [h, f.chunk];
    }
    case "CONTINUATION":
      return [encodeHeader(f.chunk.length, FrameType.CONTINUATION, f.flags, f.callId), f.chunk];
    case "HEADERS": {
      const md = encodedMetadata(f.metadata);
      w = new Writer(mdLen(md));
      writeMetadata(w, md);
      type = FrameType.HEADERS;
      break;
    }
    case "HALF_CLOSE":
      w = new Writer(0);
      type = FrameType.HALF_CLOSE;
      break;
    case "END":
      w = endPayload(f);
      type = FrameType.END;
      break;
    case "CANCEL":
      w = new Writer(2);
      w.u16(f.code);
      type = FrameType.CANCEL;
      break;
    case "CREDIT":
      w = new Writer(4);
      w.u32(f.increment);
      type = FrameType.CREDIT;
      break;
    case "PING":
      w = new Writer(8);
      w.bytes(f.data);
      type = FrameType.PING;
      break;
    case "GOAWAY":
      w = reasonPayload(f.lastCallId, f.code, f.reason);
      type = FrameType.GOAWAY;
      break;
    case "ERROR":
      w = reasonPayload(null, f.code, f.reason);
      type = FrameType.ERROR;
      break;
    case "EXTENSION":
      return [encodeHeader(f.payload.length, f.extType, f.flags, f.callId), f.payload];
  }
  const out = new Uint8Array(HEADER_LEN + w.pos);
  out.set(encodeHeader(w.pos, type, f.flags, f.callId));
  out.set(w.buf.subarray(0, w.pos), HEADER_LEN);
  return [out];
}

function callPayload(f: Extract<Frame, { type: "CALL" }>): Writer {
  const name = f.methodName === null ? null : enc.encode(f.methodName);
  const md = encodedMetadata(f.metadata);
  const w = new Writer(12 + (name ? 2 + name.length : 0) + mdLen(md));
  w.u16(f.methodId);
  w.u8(f.codec);
  w.u8(0);
  w.u64(f.timeoutUs);
  if (name) {
    w.u16(name.length);
    w.bytes(name);
  }
  writeMetadata(w, md);
  return w;
}

function endPayload(f: Extract<Frame, { type: "END" }>): Writer {
  const msg = truncateUtf8(enc.encode(f.message), 0xffff);
  const md = encodedMetadata(f.trailers);
  const w = new Writer(4 + msg.length + mdLen(md));
  w.u16(f.code);
  w.u16(msg.length);
  w.bytes(msg);
  writeMetadata(w, md);
  return w;
}

/** GOAWAY's (with `lastCallId`) or ERROR's payload: the code and the reason, cut to 65535 bytes. */
function reasonPayload(lastCallId: number | null, code: number, reason: string): Writer {
  const r = truncateUtf8(enc.encode(reason), 0xffff);
  const w = new Writer((lastCallId === null ? 4 : 8) + r.length);
  if (lastCallId !== null) w.u32(lastCallId);
  w.u16(code);
  w.u16(r.length);
  w.bytes(r);
  return w;
}
