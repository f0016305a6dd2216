/**
 * The connection's state, its outgoing byte queue and its event queue: the base of the engine's
 * layers (`flow.ts` → `send.ts` → `recv.ts` → `Connection` in `../connection.ts`).
 * @module
 */
import { DEFAULT_SETTINGS, FrameDecoder, PREFACE, effectiveSettings, encodeParts, settingsEntries, type Frame, type Settings } from "../frame.js";
import { MemoryBudget, SHARE_OF_BUDGET, processMemoryBudget } from "./budget.js";
import { newCall, type Call } from "./calls.js";
import type { Event } from "./event.js";
import { Bucket, DEFAULT_LIMITS, type Limits } from "./limits.js";

/** Which side of the connection this engine is. */
export type Role = "client" | "server";

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

/** @internal Every field of the engine, the output and event queues, and the call store. */
export abstract class ConnectionState {
  /** This side. */
  readonly role: Role;
  /** Our settings (what the peer may send us). */
  readonly local: Settings;
  /** The peer's settings (defaults until its SETTINGS arrive). */
  peer: Settings = { ...DEFAULT_SETTINGS };
  protected readonly limits: Limits;
  protected readonly now: () => number;
  protected readonly decoder: FrameDecoder;
  protected out: Uint8Array[] = [];
  protected outBytes = 0;
  protected events: Event[] = [];
  protected phase: "preface" | "settings" | "open" | "closed" = "preface";
  protected readonly calls = new Map<number, Call>();
  protected highest = 0;
  /** Server: method ids bound by the client. */
  protected readonly boundIds = new Map<number, string>();
  /** Client: our own bindings, name → id. */
  protected readonly boundNames = new Map<string, number>();
  protected nextMethodId = 1;
  protected goawaySent: number | null = null;
  protected goawayReceived: number | null = null;
  protected pingAnswerQueued = false;
  protected readonly pingsSent: Uint8Array[] = [];
  protected readonly pingBucket: Bucket;
  protected readonly resetBucket: Bucket;
  protected readonly refusedBucket: Bucket;
  /** The connection error or close reason, once closed. */
  closeError: number | null = null;
  /** The shared memory budget for incomplete split messages. */
  readonly memoryBudget: MemoryBudget;
  /** Bytes of a large frame still arriving, charged to {@link memoryBudget}. */
  protected frameCharge = 0;
  /**
   * Bytes this connection holds in the budget (its split messages being reassembled and its
   * large frame arriving): past {@link shareLimit} its chunk credit is withheld as when the
   * budget is spent, so that one connection cannot spend the whole budget.
   */
  shareUsed = 0;
  /** This connection's share of the budget: `1 / SHARE_OF_BUDGET` of its limit (as Rust). */
  readonly shareLimit: number;
  /** Split messages being reassembled. */
  splitsOpen = 0;
  /** When a chunk of a split message last arrived or one opened (the message timeout counts from it). */
  protected lastChunkAt = 0;
  /** The call whose split message goes on while the budget is spent (one per connection, §7). */
  protected privileged: number | null = null;
  protected unsubscribe: (() => void) | null = null;
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
    this.shareLimit = Math.max(1, Math.floor(this.memoryBudget.limit / SHARE_OF_BUDGET));
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

  protected pushBytes(b: Uint8Array): void {
    this.out.push(b);
    this.outBytes += b.length;
  }

  protected send(f: Frame): void {
    for (const p of encodeParts(f)) this.pushBytes(p);
  }

  // ---- the call store ----------------------------------------------------------------------

  /** The call, while it and the connection are open. */
  protected open(callId: number): Call | undefined {
    return this.phase === "closed" ? undefined : this.calls.get(callId);
  }

  /** Opens a call with both initial windows (with a zero local window, one byte of credit is granted at once: §7 lets a frame overdraw it). */
  protected newCall(id: number): Call {
    const c = newCall(id, this.peer.initialCallWindow, this.local.initialCallWindow);
    this.calls.set(id, c);
    if (this.local.initialCallWindow === 0) {
      c.recvCredit += 1;
      this.send({ type: "CREDIT", flags: 0, callId: id, increment: 1 });
    }
    return c;
  }
}
