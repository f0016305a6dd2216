/**
 * The sans-IO connection engine (docs/protocol.md §2–§10) for either side. Feed it received
 * bytes with {@link Connection.receive}, give it the application's commands, and take the bytes
 * to send ({@link Connection.takeOutput}) and the events ({@link Connection.takeEvents}). It owns
 * no socket and no timer: deadlines and keep-alive are the runtime's.
 * @module
 */
import {
  DEFAULT_SETTINGS,
  ErrorCode,
  FrameDecoder,
  HEADER_LEN,
  Flags,
  PREFACE,
  ProtocolError,
  effectiveSettings,
  encodeParts,
  metadataSize,
  settingsEntries,
  truncateUtf8,
  type Frame,
  type Metadata,
  type Settings,
} from "./frame.js";
import { Code, TopspinError } from "./status.js";

/** Which side of the connection this engine is. */
export type Role = "client" | "server";

/** The local flood budgets of §9 (token buckets: a burst, then a rate). */
export interface Limits {
  /** PINGs the peer may send at once (default 20), then one per `pingRefillMs` (100). */
  pingBurst: number;
  pingRefillMs: number;
  /** Calls cancelled before an answer (default 1000), then one per `rapidResetRefillMs` (1). */
  rapidResetBurst: number;
  rapidResetRefillMs: number;
  /** CALLs refused over MAX_CONCURRENT_CALLS (default 100), then one per `refusedCallRefillMs` (10). */
  refusedCallBurst: number;
  refusedCallRefillMs: number;
}

/** The RECOMMENDED local limits of §9. */
export const DEFAULT_LIMITS: Readonly<Limits> = Object.freeze({
  pingBurst: 20,
  pingRefillMs: 100,
  rapidResetBurst: 1000,
  rapidResetRefillMs: 1,
  refusedCallBurst: 100,
  refusedCallRefillMs: 10,
});

/** What the engine reports to the application. */
export type Event =
  | { type: "Established" }
  | { type: "CallStarted"; callId: number; method: string; codec: number; timeoutUs: bigint; metadata: Metadata }
  | { type: "Headers"; callId: number; metadata: Metadata }
  /** `creditDue`: wire bytes to pass to {@link Connection.consumed} once the application took it. */
  | { type: "Message"; callId: number; message: Uint8Array; creditDue: number }
  | { type: "HalfClosed"; callId: number }
  | { type: "Ended"; callId: number; code: number; message: string; trailers: Metadata }
  | { type: "Cancelled"; callId: number; code: number; message: string }
  | { type: "Writable"; callId: number }
  | { type: "Pong"; data: Uint8Array }
  | { type: "GoAway"; lastCallId: number; code: number; reason: string }
  | { type: "Closed"; error: number | null; reason: string };

class Bucket {
  private tokens: number;
  private last: number;
  constructor(
    private readonly burst: number,
    private readonly refillMs: number,
    now: number,
  ) {
    this.tokens = burst;
    this.last = now;
  }
  take(now: number): boolean {
    if (now > this.last) {
      this.tokens = Math.min(this.burst, this.tokens + (now - this.last) / this.refillMs);
      this.last = now;
    }
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }
}

/**
 * The memory a process holds for incomplete split messages (§9 "Local limits"), shared by its
 * connections: while it is spent, servers refuse new calls with `RESOURCE_EXHAUSTED` and
 * receivers withhold the credit for chunks of split messages (§7), letting one split message per
 * connection go on, and grant it again once memory is released.
 */
export class MemoryBudget {
  private usedBytes = 0;
  private readonly waiters = new Set<() => void>();

  /** `limit`: bytes (default 1 GiB, the RECOMMENDED default). */
  constructor(readonly limit: number = 1 << 30) {}

  /** Bytes held now. */
  get used(): number {
    return this.usedBytes;
  }

  /** Whether the budget is spent. */
  get exhausted(): boolean {
    return this.usedBytes >= this.limit;
  }

  /** Holds `n` bytes (data that already arrived is held even past the limit). */
  reserve(n: number): void {
    this.usedBytes += n;
  }

  /** Releases `n` bytes; wakes the connections waiting for memory. */
  release(n: number): void {
    if (n <= 0) return;
    this.usedBytes = Math.max(0, this.usedBytes - n);
    if (!this.exhausted) for (const w of [...this.waiters]) w();
  }

  /** @internal Calls `w` when memory is released while not exhausted; returns the unsubscribe. */
  subscribe(w: () => void): () => void {
    this.waiters.add(w);
    return () => this.waiters.delete(w);
  }
}

/** The process-wide budget every connection shares unless told otherwise (1 GiB). */
export const processMemoryBudget = new MemoryBudget();

interface Split {
  total: number;
  got: number;
  /** Grows as chunks arrive: its length is never more than twice `got` (nor above `total`). */
  buf: Uint8Array;
  endStream: boolean;
}

interface OutMessage {
  data: Uint8Array;
  offset: number;
}

interface Call {
  id: number;
  /** What we may still send (§7). */
  sendCredit: number;
  /** What the peer may still send, as we count it. */
  recvCredit: number;
  split: Split | null;
  /** Client: we half-closed. Server: the client half-closed. */
  halfClosed: boolean;
  /** Client: HEADERS seen. Server: HEADERS sent. */
  headers: boolean;
  /** Client: a MESSAGE seen. Server: we answered (HEADERS, MESSAGE or END sent). */
  answered: boolean;
  /** Rest of a split message we are sending. */
  out: OutMessage | null;
  /** A HALF_CLOSE or END waiting behind `out`. */
  tail: Frame | null;
  /** Credit owed to the peer for consumed messages, not yet sent. */
  owed: number;
  /** Chunk credit withheld while the memory budget is spent. */
  withheld: number;
}

/** Options of a {@link Connection}. */
export interface ConnectionOptions {
  /** Overrides of the local settings (§4); the rest are defaults. */
  settings?: Partial<Settings>;
  /** Overrides of the local flood budgets (§9). */
  limits?: Partial<Limits>;
  /** Milliseconds clock for the flood budgets; default `Date.now`. */
  now?: () => number;
  /** Memory for incomplete split messages, shared across connections (default {@link processMemoryBudget}). */
  memoryBudget?: MemoryBudget;
}

const MAX_CREDIT = 0x7fffffff;

/** Frames announced larger than this (one 64 KiB read) are charged to the memory budget while they arrive. */
export const LARGE_FRAME = 64 * 1024;

/** One topspin connection, either side, without I/O. */
export class Connection {
  /** This side. */
  readonly role: Role;
  /** Our settings (what the peer may send us). */
  readonly local: Settings;
  /** The peer's settings (defaults until its SETTINGS arrive). */
  peer: Settings = { ...DEFAULT_SETTINGS };
  private readonly limits: Limits;
  private readonly now: () => number;
  private readonly decoder: FrameDecoder;
  private out: Uint8Array[] = [];
  private outBytes = 0;
  private events: Event[] = [];
  private phase: "preface" | "settings" | "open" | "closed" = "preface";
  private readonly calls = new Map<number, Call>();
  private highest = 0;
  /** Server: method ids bound by the client. */
  private readonly boundIds = new Map<number, string>();
  /** Client: our own bindings, name → id. */
  private readonly boundNames = new Map<string, number>();
  private nextMethodId = 1;
  private goawaySent: number | null = null;
  private goawayReceived: number | null = null;
  private pingAnswerQueued = false;
  private readonly pingsSent: Uint8Array[] = [];
  private readonly pingBucket: Bucket;
  private readonly resetBucket: Bucket;
  private readonly refusedBucket: Bucket;
  /** The connection error or close reason, once closed. */
  closeError: number | null = null;
  /** The shared memory budget for incomplete split messages. */
  readonly memoryBudget: MemoryBudget;
  /** Bytes of a large frame still arriving, charged to {@link memoryBudget}. */
  private frameCharge = 0;
  /** The call whose split message goes on while the budget is spent (one per connection, §7). */
  private privileged: number | null = null;
  private unsubscribe: (() => void) | null = null;
  /**
   * Called when withheld chunk credit was granted again (memory came back) outside `receive`:
   * the output has new frames to write. The driver sets it.
   */
  onWake: (() => void) | null = null;

  constructor(role: Role, options: ConnectionOptions = {}) {
    this.role = role;
    this.local = { ...DEFAULT_SETTINGS, ...options.settings };
    effectiveSettings(settingsEntries(this.local));
    this.limits = { ...DEFAULT_LIMITS, ...options.limits };
    this.now = options.now ?? Date.now;
    const t = this.now();
    this.pingBucket = new Bucket(this.limits.pingBurst, this.limits.pingRefillMs, t);
    this.resetBucket = new Bucket(this.limits.rapidResetBurst, this.limits.rapidResetRefillMs, t);
    this.refusedBucket = new Bucket(this.limits.refusedCallBurst, this.limits.refusedCallRefillMs, t);
    this.decoder = new FrameDecoder(this.local.maxFrameSize);
    this.memoryBudget = options.memoryBudget ?? processMemoryBudget;
    this.pushBytes(PREFACE);
    this.send({ type: "SETTINGS", flags: 0, callId: 0, entries: settingsEntries(this.local) });
  }

  // ---- output and events ------------------------------------------------------------------

  /** The bytes to write to the transport, in order; empties the queue. */
  takeOutput(): Uint8Array[] {
    const o = this.out;
    this.out = [];
    this.outBytes = 0;
    this.pingAnswerQueued = false;
    return o;
  }

  /** Bytes queued and not yet taken. */
  get outputBytes(): number {
    return this.outBytes;
  }

  /** The events since the last call; empties the queue. */
  takeEvents(): Event[] {
    const e = this.events;
    this.events = [];
    return e;
  }

  /** Whether the peer's SETTINGS arrived and the connection is not closed. */
  get established(): boolean {
    return this.phase === "open";
  }

  /** Whether the connection is closed (error, or both sides done). */
  get closed(): boolean {
    return this.phase === "closed";
  }

  /** Calls open now. */
  get openCalls(): number {
    return this.calls.size;
  }

  /** Whether a GOAWAY was sent or received (no new calls). */
  get goingAway(): boolean {
    return this.goawaySent !== null || this.goawayReceived !== null;
  }

  private pushBytes(b: Uint8Array): void {
    this.out.push(b);
    this.outBytes += b.length;
  }

  private send(f: Frame): void {
    for (const p of encodeParts(f)) this.pushBytes(p);
  }

  // ---- input -------------------------------------------------------------------------------

  /**
   * Hands received bytes to the engine. Throws nothing: a connection error queues ERROR, ends
   * every call and reports `Closed` (see {@link closeError}).
   */
  receive(bytes: Uint8Array): void {
    if (this.phase === "closed") return;
    this.decoder.push(bytes);
    this.decode();
    this.chargeFrame();
  }

  /** Whether a frame (or the preface) has started to arrive and is not complete (§9: frame timeout). */
  get partialInput(): boolean {
    return this.phase !== "closed" && this.decoder.midFrame;
  }

  /**
   * Charges the memory budget with the bytes held for a large frame still arriving (one whose
   * header announced more than {@link LARGE_FRAME}): they are held as they arrive (never
   * allocated at the announced size), and counted with the split messages being reassembled.
   */
  private chargeFrame(): void {
    const held = this.phase !== "closed" && this.decoder.announced > LARGE_FRAME ? this.decoder.pending : 0;
    if (held > this.frameCharge) this.memoryBudget.reserve(held - this.frameCharge);
    else if (held < this.frameCharge) this.memoryBudget.release(this.frameCharge - held);
    this.frameCharge = held;
  }

  private decode(): void {
    try {
      if (this.phase === "preface") {
        if (this.decoder.pending < PREFACE.length) {
          const b = this.decoder.take(this.decoder.pending);
          this.checkMagic(b);
          this.decoder.push(b);
          return;
        }
        const p = this.decoder.take(PREFACE.length);
        this.checkMagic(p);
        if (p[7] !== 1) {
          throw new ProtocolError(ErrorCode.UNSUPPORTED_VERSION, `protocol version ${p[7] ?? 0} is not supported; this peer speaks version 1`);
        }
        this.phase = "settings";
      }
      for (;;) {
        if (this.closed) return;
        const f = this.decoder.next();
        if (f === null) return;
        this.onFrame(f);
      }
    } catch (e) {
      if (e instanceof ProtocolError) this.fail(e.code, e.message, true);
      else throw e;
    }
  }

  /** The transport ended (end of file or a socket error): every open call fails with UNAVAILABLE. */
  transportClosed(reason: string): void {
    if (this.phase === "closed") return;
    this.fail(null, reason, false);
  }

  private checkMagic(b: Uint8Array): void {
    for (let i = 0; i < Math.min(b.length, 7); i++) {
      if (b[i] !== PREFACE[i]) throw new ProtocolError(ErrorCode.BAD_PREFACE, "the peer did not start with the TOPSPIN preface");
    }
  }

  /** Closes with a connection error: ERROR out (unless `sendError` is false), calls end, Closed. */
  private fail(code: number | null, reason: string, sendError: boolean): void {
    if (sendError && code !== null) this.send({ type: "ERROR", flags: 0, callId: 0, code, reason });
    const why = code === null ? reason : `connection error ${reason}`;
    this.phase = "closed";
    for (const c of [...this.calls.values()]) {
      this.forget(c.id);
      if (this.role === "client") this.events.push({ type: "Ended", callId: c.id, code: Code.UNAVAILABLE, message: why, trailers: [] });
      else this.events.push({ type: "Cancelled", callId: c.id, code: Code.UNAVAILABLE, message: why });
    }
    this.phase = "closed";
    this.chargeFrame();
    this.unsubscribe?.();
    this.unsubscribe = null;
    this.closeError = code;
    this.events.push({ type: "Closed", error: code, reason });
  }

  private calm(what: string): void {
    this.send({ type: "GOAWAY", flags: 0, callId: 0, lastCallId: this.highest, code: ErrorCode.ENHANCE_YOUR_CALM, reason: what });
    throw new ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, what);
  }

  private onFrame(f: Frame): void {
    if (this.phase === "settings") {
      if (f.type === "ERROR") {
        this.fail(f.code, `peer sent ERROR: ${f.reason}`, false);
        return;
      }
      if (f.type !== "SETTINGS") throw new ProtocolError(ErrorCode.SETTINGS_ERROR, `the first frame was ${f.type}, not SETTINGS`);
      this.peer = effectiveSettings(f.entries);
      this.phase = "open";
      this.events.push({ type: "Established" });
      return;
    }
    switch (f.type) {
      case "SETTINGS":
        throw new ProtocolError(ErrorCode.SETTINGS_ERROR, "a second SETTINGS frame");
      case "PING":
        if (f.ack) {
          const i = this.pingsSent.findIndex((d) => d.every((x, j) => x === f.data[j]));
          if (i >= 0) {
            this.pingsSent.splice(i, 1);
            this.events.push({ type: "Pong", data: f.data });
          }
          return;
        }
        if (!this.pingBucket.take(this.now())) this.calm("too_many_pings");
        if (!this.pingAnswerQueued) {
          this.send({ type: "PING", flags: Flags.ACK, callId: 0, ack: true, data: f.data });
          this.pingAnswerQueued = true;
        }
        return;
      case "GOAWAY":
        this.onGoAway(f.lastCallId, f.code, f.reason);
        return;
      case "ERROR":
        this.fail(f.code, `peer sent ERROR: ${f.reason}`, false);
        return;
      case "EXTENSION":
        return;
      case "CALL":
        if (this.role === "client") throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, "CALL from the server");
        this.onCall(f);
        return;
      default:
        this.onCallFrame(f);
    }
  }

  private onGoAway(lastCallId: number, code: number, reason: string): void {
    if (this.goawayReceived !== null && lastCallId > this.goawayReceived) {
      throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `GOAWAY raised last_call_id from ${this.goawayReceived} to ${lastCallId}`);
    }
    this.goawayReceived = lastCallId;
    this.events.push({ type: "GoAway", lastCallId, code, reason });
    if (this.role === "client") {
      for (const c of [...this.calls.values()]) {
        if (c.id > lastCallId) {
          this.forget(c.id);
          this.events.push({ type: "Ended", callId: c.id, code: Code.UNAVAILABLE, message: `the server went away (GOAWAY ${reason}); the call was not processed`, trailers: [] });
        }
      }
    }
  }

  private newCall(id: number): Call {
    const c: Call = {
      id,
      sendCredit: this.peer.initialCallWindow,
      recvCredit: this.local.initialCallWindow,
      split: null,
      halfClosed: false,
      headers: false,
      answered: false,
      out: null,
      tail: null,
      owed: 0,
      withheld: 0,
    };
    this.calls.set(id, c);
    if (this.local.initialCallWindow === 0) {
      c.recvCredit += 1;
      this.send({ type: "CREDIT", flags: 0, callId: id, increment: 1 });
    }
    return c;
  }

  private onCall(f: Extract<Frame, { type: "CALL" }>): void {
    if (f.callId <= this.highest) throw new ProtocolError(ErrorCode.DUPLICATE_CALL, `CALL ${f.callId} is not above ${this.highest}`);
    this.highest = f.callId;
    if (this.goawayReceived !== null) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `CALL ${f.callId} after the client's GOAWAY`);
    let method: string;
    if (f.methodId > 1023) {
      throw new ProtocolError(ErrorCode.METHOD_ID_ERROR, f.methodName !== null ? `NAMED CALL binds method id ${f.methodId}, above 1023` : `method id ${f.methodId} is above 1023`);
    }
    if (f.methodName !== null) {
      method = f.methodName;
      if (f.methodId !== 0) {
        if (this.boundIds.has(f.methodId)) throw new ProtocolError(ErrorCode.METHOD_ID_ERROR, `method id ${f.methodId} is already bound`);
        this.boundIds.set(f.methodId, method);
      }
    } else {
      if (f.methodId === 0) throw new ProtocolError(ErrorCode.METHOD_ID_ERROR, "CALL without a name and method id 0");
      const m = this.boundIds.get(f.methodId);
      if (m === undefined) throw new ProtocolError(ErrorCode.METHOD_ID_ERROR, `method id ${f.methodId} is not bound`);
      method = m;
    }
    if (this.goawaySent !== null && f.callId > this.goawaySent) return;
    const end = (message: string): void =>
      this.send({ type: "END", flags: 0, callId: f.callId, code: Code.RESOURCE_EXHAUSTED, message, trailers: [] });
    const mds = metadataSize(f.metadata);
    if (mds > this.local.maxMetadataSize) {
      end(`request metadata of ${mds} bytes exceeds max_metadata_size ${this.local.maxMetadataSize}`);
      return;
    }
    if (this.memoryBudget.exhausted) {
      end(`process memory budget for incoming messages exhausted (${this.memoryBudget.limit} bytes)`);
      return;
    }
    if (this.calls.size >= this.local.maxConcurrentCalls) {
      if (!this.refusedBucket.take(this.now())) this.calm("too_many_refused_calls");
      end("too many concurrent calls");
      return;
    }
    this.newCall(f.callId);
    this.events.push({ type: "CallStarted", callId: f.callId, method, codec: f.codec, timeoutUs: f.timeoutUs, metadata: f.metadata });
  }

  private onCallFrame(f: Exclude<Frame, { type: "CALL" | "SETTINGS" | "PING" | "GOAWAY" | "ERROR" | "EXTENSION" }>): void {
    const client = this.role === "client";
    if (client && (f.type === "HALF_CLOSE" || f.type === "CANCEL")) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `${f.type} from the server`);
    if (!client && (f.type === "HEADERS" || f.type === "END")) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `${f.type} from the client`);
    const c = this.calls.get(f.callId);
    if (c === undefined) {
      if (f.callId > this.highest) throw new ProtocolError(ErrorCode.UNKNOWN_CALL, `${f.type} for call ${f.callId}, which was never opened`);
      return; // crossed an END or CANCEL (§6)
    }
    switch (f.type) {
      case "MESSAGE": {
        if (client && f.endStream) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, "END_STREAM from the server");
        if (!client && c.halfClosed) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `MESSAGE on call ${c.id} after its half-close`);
        if (c.split !== null) throw new ProtocolError(ErrorCode.MESSAGE_LENGTH_MISMATCH, `MESSAGE on call ${c.id} while a split message is open`);
        this.chargeRecv(c, f.chunk.length + (f.totalLen === null ? 0 : 4));
        if (f.totalLen !== null && f.chunk.length >= f.totalLen) {
          throw new ProtocolError(ErrorCode.MESSAGE_LENGTH_MISMATCH, `SPLIT first chunk of ${f.chunk.length} bytes already holds total_len ${f.totalLen}`);
        }
        const size = f.totalLen ?? f.chunk.length;
        if (size > this.local.maxMessageSize) {
          this.tooLarge(c, size);
          return;
        }
        if (client) c.answered = true;
        if (f.totalLen === null) {
          this.deliver(c, f.chunk.slice(), HEADER_LEN + f.chunk.length);
          if (f.endStream) this.halfClosedByClient(c);
        } else {
          const buf = new Uint8Array(Math.min(f.totalLen, 2 * f.chunk.length));
          buf.set(f.chunk);
          this.memoryBudget.reserve(buf.length);
          c.split = { total: f.totalLen, got: f.chunk.length, buf, endStream: f.endStream };
          this.chunkCredit(c, HEADER_LEN + 4 + f.chunk.length);
        }
        return;
      }
      case "CONTINUATION": {
        const s = c.split;
        if (s === null) throw new ProtocolError(ErrorCode.MESSAGE_LENGTH_MISMATCH, `CONTINUATION on call ${c.id} with no split message open`);
        this.chargeRecv(c, f.chunk.length);
        if (s.got + f.chunk.length > s.total) {
          throw new ProtocolError(ErrorCode.MESSAGE_LENGTH_MISMATCH, `CONTINUATION goes past total_len ${s.total}`);
        }
        const need = s.got + f.chunk.length;
        if (need > s.buf.length) {
          const grown = new Uint8Array(Math.min(s.total, 2 * need));
          grown.set(s.buf.subarray(0, s.got));
          this.memoryBudget.reserve(grown.length - s.buf.length);
          s.buf = grown;
        }
        s.buf.set(f.chunk, s.got);
        s.got = need;
        if (s.got < s.total) this.chunkCredit(c, HEADER_LEN + f.chunk.length);
        else {
          this.dropSplit(c);
          this.grantNow(c, HEADER_LEN + f.chunk.length);
          this.deliver(c, s.buf, 0);
          if (s.endStream) this.halfClosedByClient(c);
        }
        return;
      }
      case "HEADERS": {
        if (c.headers || c.answered) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `HEADERS on call ${c.id} after HEADERS or a message`);
        c.headers = true;
        const size = metadataSize(f.metadata);
        if (size > this.local.maxMetadataSize) {
          this.forget(c.id);
          this.send({ type: "CANCEL", flags: 0, callId: c.id, code: Code.RESOURCE_EXHAUSTED });
          this.events.push({ type: "Ended", callId: c.id, code: Code.RESOURCE_EXHAUSTED, message: `response headers of ${size} bytes exceed max_metadata_size ${this.local.maxMetadataSize}`, trailers: [] });
          return;
        }
        this.events.push({ type: "Headers", callId: c.id, metadata: f.metadata });
        return;
      }
      case "END": {
        this.forget(c.id);
        const statusSize = 2 + new TextEncoder().encode(f.message).length + metadataSize(f.trailers);
        if (statusSize > this.local.maxMetadataSize) {
          this.events.push({ type: "Ended", callId: c.id, code: Code.RESOURCE_EXHAUSTED, message: `END status of ${statusSize} bytes exceeds max_metadata_size ${this.local.maxMetadataSize}`, trailers: [] });
          return;
        }
        this.events.push({ type: "Ended", callId: c.id, code: f.code, message: f.message, trailers: f.trailers });
        return;
      }
      case "HALF_CLOSE": {
        if (c.halfClosed) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `second half-close on call ${c.id}`);
        if (c.split !== null) throw new ProtocolError(ErrorCode.MESSAGE_LENGTH_MISMATCH, `HALF_CLOSE on call ${c.id} inside a split message`);
        this.halfClosedByClient(c);
        return;
      }
      case "CANCEL": {
        if (!c.answered && !this.resetBucket.take(this.now())) this.calm("too_many_resets");
        this.forget(c.id);
        this.events.push({ type: "Cancelled", callId: c.id, code: f.code, message: "the client cancelled the call" });
        return;
      }
      case "CREDIT": {
        const before = c.sendCredit;
        if (before + f.increment > MAX_CREDIT) throw new ProtocolError(ErrorCode.FLOW_CONTROL, `CREDIT raises call ${c.id}'s credit above 2^31-1`);
        c.sendCredit += f.increment;
        if (before <= 0 && c.sendCredit > 0) {
          this.flush(c);
          if (this.calls.has(c.id) && c.out === null) this.events.push({ type: "Writable", callId: c.id });
        }
        return;
      }
    }
  }

  private chargeRecv(c: Call, payload: number): void {
    if (c.recvCredit <= 0) throw new ProtocolError(ErrorCode.FLOW_CONTROL, `message frame on call ${c.id} without credit`);
    c.recvCredit -= HEADER_LEN + payload;
  }

  /** Credit for a chunk of a split message: granted now, or withheld while memory is spent (§7). */
  private chunkCredit(c: Call, n: number): void {
    if (this.memoryBudget.exhausted && this.privileged !== c.id) {
      if (this.privileged === null || !this.calls.has(this.privileged)) {
        this.privileged = c.id;
      } else {
        c.withheld += n;
        this.unsubscribe ??= this.memoryBudget.subscribe(() => this.regrant());
        return;
      }
    }
    this.grantNow(c, n);
  }

  /** Memory came back: grants the withheld chunk credit. */
  private regrant(): void {
    if (this.phase === "closed") return;
    let any = false;
    for (const c of this.calls.values()) {
      if (c.withheld > 0 && !this.memoryBudget.exhausted) {
        const n = c.withheld;
        c.withheld = 0;
        this.grantNow(c, n);
        any = true;
      }
    }
    if (![...this.calls.values()].some((c) => c.withheld > 0)) {
      this.unsubscribe?.();
      this.unsubscribe = null;
    }
    if (any) this.onWake?.();
  }

  /** Releases the memory of the call's split message, if one is open. */
  private dropSplit(c: Call): void {
    const s = c.split;
    if (s === null) return;
    c.split = null;
    if (this.privileged === c.id) this.privileged = null;
    this.memoryBudget.release(s.buf.length);
    this.promote();
  }

  /** Budget still spent and no split message going on: lets a waiting one go on (§7). */
  private promote(): void {
    if (this.privileged !== null || !this.memoryBudget.exhausted || this.phase === "closed") return;
    for (const c of this.calls.values()) {
      if (c.withheld > 0 && c.split !== null) {
        this.privileged = c.id;
        const n = c.withheld;
        c.withheld = 0;
        this.grantNow(c, n);
        this.onWake?.();
        return;
      }
    }
  }

  /** Removes a call, releasing what its split message held. */
  private forget(id: number): void {
    const c = this.calls.get(id);
    if (c === undefined) return;
    this.calls.delete(id);
    this.dropSplit(c);
    if (this.privileged === id) {
      this.privileged = null;
      this.promote();
    }
  }

  private grantNow(c: Call, n: number): void {
    c.recvCredit += n;
    this.send({ type: "CREDIT", flags: 0, callId: c.id, increment: n });
  }

  private deliver(c: Call, message: Uint8Array, creditDue: number): void {
    this.events.push({ type: "Message", callId: c.id, message, creditDue });
  }

  private halfClosedByClient(c: Call): void {
    c.halfClosed = true;
    this.events.push({ type: "HalfClosed", callId: c.id });
  }

  private tooLarge(c: Call, size: number): void {
    const message = `message of ${size} bytes exceeds the limit of ${this.local.maxMessageSize} bytes (max_message_size)`;
    this.forget(c.id);
    if (this.role === "server") {
      this.send({ type: "END", flags: 0, callId: c.id, code: Code.RESOURCE_EXHAUSTED, message, trailers: [] });
      this.events.push({ type: "Cancelled", callId: c.id, code: Code.RESOURCE_EXHAUSTED, message });
    } else {
      this.send({ type: "CANCEL", flags: 0, callId: c.id, code: Code.RESOURCE_EXHAUSTED });
      this.events.push({ type: "Ended", callId: c.id, code: Code.RESOURCE_EXHAUSTED, message, trailers: [] });
    }
  }

  // ---- commands ----------------------------------------------------------------------------

  private open(callId: number): Call | undefined {
    return this.phase === "closed" ? undefined : this.calls.get(callId);
  }

  /** Client: whether a new call may be sent now (else queue it, or fail it when {@link refusesCalls}). */
  canStartCall(): boolean {
    return this.phase === "open" && this.goawayReceived === null && this.goawaySent === null && this.calls.size < this.peer.maxConcurrentCalls;
  }

  /** Client: whether the server takes no calls at all (MAX_CONCURRENT_CALLS 0) or is going away. */
  get refusesCalls(): boolean {
    return this.phase === "closed" || this.goingAway || (this.phase === "open" && this.peer.maxConcurrentCalls === 0);
  }

  /**
   * Client: starts a call and returns its id. Throws {@link TopspinError} to refuse it locally
   * (`UNAVAILABLE` when the server takes no calls or went away, `RESOURCE_EXHAUSTED` for
   * metadata over the server's limit).
   */
  startCall(method: string, codec: number, timeoutUs: bigint, metadata: Metadata): number {
    if (this.role !== "client") throw new Error("startCall on a server connection");
    if (this.phase !== "open") throw new TopspinError(Code.UNAVAILABLE, this.phase === "closed" ? "the connection is closed" : "the connection is not established");
    if (this.goingAway) throw new TopspinError(Code.UNAVAILABLE, "the connection is going away");
    if (this.peer.maxConcurrentCalls === 0) throw new TopspinError(Code.UNAVAILABLE, "the server takes no calls (MAX_CONCURRENT_CALLS 0)");
    if (this.calls.size >= this.peer.maxConcurrentCalls) throw new TopspinError(Code.RESOURCE_EXHAUSTED, "too many concurrent calls");
    let methodId = this.boundNames.get(method);
    let methodName: string | null = null;
    if (methodId === undefined) {
      methodName = method;
      methodId = 0;
      if (this.nextMethodId <= 1023) {
        methodId = this.nextMethodId++;
        this.boundNames.set(method, methodId);
      }
    }
    const nameLen = methodName === null ? 0 : 2 + new TextEncoder().encode(methodName).length;
    const mds = metadataSize(metadata);
    const limit = Math.min(this.peer.maxMetadataSize, this.peer.maxFrameSize - 12 - nameLen);
    if (mds > limit) {
      if (methodName !== null && methodId !== 0) this.boundNames.delete(method);
      throw new TopspinError(Code.RESOURCE_EXHAUSTED, `request metadata of ${mds} bytes exceeds the server's limit of ${limit} bytes (max_metadata_size)`);
    }
    const id = ++this.highest;
    this.send({ type: "CALL", flags: methodName === null ? 0 : Flags.NAMED, callId: id, methodId, methodName, codec, timeoutUs, metadata });
    this.newCall(id);
    return id;
  }

  /** Whether a message may be sent on the call now (credit above zero, no split message pending). */
  writable(callId: number): boolean {
    const c = this.open(callId);
    return c !== undefined && c.sendCredit > 0 && c.out === null && !(this.role === "client" && c.halfClosed);
  }

  /**
   * Sends one message. Returns `false` when it must wait (no credit, or a split message still
   * going out; a `Writable` event follows). Throws {@link TopspinError} `RESOURCE_EXHAUSTED` for a
   * message over the peer's MAX_MESSAGE_SIZE. Returns `true` for a call that is no longer open
   * (the message is dropped; the call's end is reported by its own event).
   */
  sendMessage(callId: number, message: Uint8Array, endStream = false): boolean {
    const c = this.open(callId);
    if (c === undefined) return true;
    if (this.role === "client" && c.halfClosed) throw new TopspinError(Code.INTERNAL, "message after half-close");
    if (message.length > this.peer.maxMessageSize) {
      throw new TopspinError(Code.RESOURCE_EXHAUSTED, `message of ${message.length} bytes exceeds the peer's limit of ${this.peer.maxMessageSize} bytes (max_message_size)`);
    }
    if (c.sendCredit <= 0 || c.out !== null) return false;
    const flags = endStream && this.role === "client" ? Flags.END_STREAM : 0;
    if (this.role === "server") c.answered = true;
    if (flags) c.halfClosed = true;
    const max = this.peer.maxFrameSize;
    if (message.length <= max) {
      this.send({ type: "MESSAGE", flags, callId, endStream: flags !== 0, totalLen: null, chunk: message });
      c.sendCredit -= HEADER_LEN + message.length;
      return true;
    }
    const first = message.subarray(0, max - 4);
    this.send({ type: "MESSAGE", flags: flags | Flags.SPLIT, callId, endStream: flags !== 0, totalLen: message.length, chunk: first });
    c.sendCredit -= HEADER_LEN + 4 + first.length;
    c.out = { data: message, offset: first.length };
    this.flush(c);
    return true;
  }

  private flush(c: Call): void {
    while (c.out !== null && c.sendCredit > 0) {
      const o = c.out;
      const chunk = o.data.subarray(o.offset, o.offset + this.peer.maxFrameSize);
      this.send({ type: "CONTINUATION", flags: 0, callId: c.id, chunk });
      c.sendCredit -= HEADER_LEN + chunk.length;
      o.offset += chunk.length;
      if (o.offset >= o.data.length) {
        c.out = null;
        if (c.tail !== null) {
          const t = c.tail;
          c.tail = null;
          this.send(t);
          if (t.type === "END") this.forget(c.id);
        }
      }
    }
  }

  /** Client: no more messages on the call. */
  halfClose(callId: number): void {
    const c = this.open(callId);
    if (c === undefined || c.halfClosed) return;
    c.halfClosed = true;
    const f: Frame = { type: "HALF_CLOSE", flags: 0, callId };
    if (c.out !== null) c.tail = f;
    else this.send(f);
  }

  /** Client: abandon the call with a code (`CANCELLED`, `DEADLINE_EXCEEDED` …). */
  cancel(callId: number, code: number): void {
    const c = this.open(callId);
    if (c === undefined) return;
    this.forget(callId);
    this.send({ type: "CANCEL", flags: 0, callId, code });
  }

  /** Server: response headers. Throws `RESOURCE_EXHAUSTED` when over the client's limit. */
  sendHeaders(callId: number, metadata: Metadata): void {
    const c = this.open(callId);
    if (c === undefined || c.headers || c.answered) return;
    const size = metadataSize(metadata);
    const limit = Math.min(this.peer.maxMetadataSize, this.peer.maxFrameSize);
    if (size > limit) throw new TopspinError(Code.RESOURCE_EXHAUSTED, `response headers of ${size} bytes exceed the client's limit of ${limit} bytes`);
    c.headers = true;
    c.answered = true;
    this.send({ type: "HEADERS", flags: 0, callId, metadata });
  }

  /** Server: ends the call with a status; shortened to fit the client's limits (§5.6). */
  endCall(callId: number, code: number, message: string, trailers: Metadata = []): void {
    const c = this.open(callId);
    if (c === undefined) return;
    const limit = Math.min(this.peer.maxMetadataSize, this.peer.maxFrameSize - 2);
    let msg: Uint8Array = new TextEncoder().encode(message);
    let tr = trailers;
    if (2 + msg.length + metadataSize(tr) > limit) {
      tr = [];
      msg = truncateUtf8(msg, Math.max(0, limit - 4));
    }
    const f: Frame = { type: "END", flags: 0, callId, code, message: new TextDecoder().decode(msg), trailers: tr };
    c.answered = true;
    if (c.out !== null) {
      c.tail = f;
      return;
    }
    this.forget(callId);
    this.send(f);
  }

  /**
   * The application consumed `n` wire bytes of messages on the call (the `creditDue` of
   * `Message` events): grants credit back, batched to half the window.
   */
  consumed(callId: number, n: number): void {
    const c = this.open(callId);
    if (c === undefined || n <= 0) return;
    c.owed += n;
    if (c.owed >= Math.max(1, this.local.initialCallWindow >>> 1) || c.recvCredit <= 0) {
      this.grantCredit(callId, c.owed);
    }
  }

  /** Grants the peer `increment` bytes of send credit on the call. */
  grantCredit(callId: number, increment: number): void {
    const c = this.open(callId);
    if (c === undefined) return;
    let n = Math.min(increment, MAX_CREDIT - Math.max(0, c.recvCredit));
    c.owed = Math.max(0, c.owed - increment);
    while (n > 0) {
      const k = Math.min(n, MAX_CREDIT);
      c.recvCredit += k;
      this.send({ type: "CREDIT", flags: 0, callId, increment: k });
      n -= k;
    }
  }

  /** Sends a PING with 8 bytes of data; its answer is a `Pong` event. */
  ping(data: Uint8Array): void {
    if (this.phase === "closed") return;
    const d = data.slice(0, 8);
    this.pingsSent.push(d);
    this.send({ type: "PING", flags: 0, callId: 0, ack: false, data: d });
  }

  /** Starts a graceful shutdown (§8.3): GOAWAY with the highest call id. */
  goAway(code: number = ErrorCode.NO_ERROR, reason = ""): void {
    if (this.phase === "closed") return;
    const last = this.goawaySent === null ? this.highest : Math.min(this.goawaySent, this.highest);
    this.goawaySent = last;
    this.send({ type: "GOAWAY", flags: 0, callId: 0, lastCallId: last, code, reason });
  }

  /** Closes the connection with a protocol error of our own (ERROR out, calls end). */
  abort(code: number, reason: string): void {
    if (this.phase === "closed") return;
    this.fail(code, reason, true);
  }
}
