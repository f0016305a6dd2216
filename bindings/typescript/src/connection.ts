/**
 * The sans-IO connection engine (docs/protocol.md §2–§10) for either side. Feed it received
 * bytes with {@link Connection.receive}, give it the application's commands, and take the bytes
 * to send ({@link Connection.takeOutput}) and the events ({@link Connection.takeEvents}). It owns
 * no socket and no timer: deadlines and keep-alive are the runtime's.
 *
 * The engine by concern, one file each under `connection/`, as the Rust engine
 * (`crates/topspin-proto/src/connection/`): `handshake.ts` (preface and SETTINGS), `recv.ts`
 * (one method per received frame type), `send.ts` (starting calls, messages and split-message
 * resumption, ending, PING, GOAWAY), `flow.ts` (per-call credit and the memory budget's
 * withheld credit), `state.ts` (the fields, the output and event queues, the call store),
 * `calls.ts` (one call's state), `event.ts`, `limits.ts` and `budget.ts`. The layers are one
 * class chain (`ConnectionState` → `FlowControl` → `Sender` → `Receiver` → `Connection`); this
 * file keeps the input's entry points, the dispatch and the connection's close.
 * @module
 */
import { ErrorCode, ProtocolError, type Frame } from "./frame.js";
import { Code } from "./status.js";
import { firstSettings, readPreface } from "./connection/handshake.js";
import { Receiver } from "./connection/recv.js";

export { LARGE_FRAME, MemoryBudget, SHARE_OF_BUDGET, processMemoryBudget } from "./connection/budget.js";
export type { Event } from "./connection/event.js";
export { DEFAULT_LIMITS, type Limits } from "./connection/limits.js";
export type { ConnectionOptions, Role } from "./connection/state.js";

/** The frames of one call, after the connection-level ones. */
type CallFrame = Exclude<Frame, { type: "CALL" | "SETTINGS" | "PING" | "GOAWAY" | "ERROR" | "EXTENSION" }>;

/** One topspin connection, either side, without I/O. */
export class Connection extends Receiver {
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

  /** The transport ended (end of file or a socket error): every open call fails with UNAVAILABLE. */
  transportClosed(reason: string): void {
    if (this.phase === "closed") return;
    this.fail(null, reason, false);
  }

  /** Closes the connection with a protocol error of our own (ERROR out, calls end). */
  abort(code: number, reason: string): void {
    if (this.phase === "closed") return;
    this.fail(code, reason, true);
  }

  /**
   * The split-message timeout (the Rust engine's `check_message_progress`): when split messages
   * are open and none got a chunk for `limitMs` while this side gave credit, closes the
   * connection with ERROR `TIMEOUT`. Credit withheld from all of them (the memory budget) is our
   * doing: their time starts again. Returns when to look again (Infinity: none open, or closed).
   */
  checkMessageProgress(limitMs: number): number {
    if (this.phase === "closed" || limitMs <= 0 || this.splitsOpen === 0) return Infinity;
    const now = this.now();
    if (now < this.lastChunkAt + limitMs) return this.lastChunkAt + limitMs;
    const p = this.privileged === null ? undefined : this.calls.get(this.privileged);
    const oneCould = p !== undefined && p.split !== null;
    if (!oneCould && [...this.calls.values()].some((c) => c.withheld > 0)) {
      this.lastChunkAt = now;
      return now + limitMs;
    }
    this.fail(ErrorCode.TIMEOUT, `a split message got no chunk for ${limitMs} ms (frame_timeout)`, true);
    return Infinity;
  }

  private decode(): void {
    try {
      if (this.phase === "preface") {
        if (!readPreface(this.decoder)) return;
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

  // ---- dispatch ----------------------------------------------------------------------------

  private onFrame(f: Frame): void {
    if (f.type === "ERROR") {
      this.fail(f.code, `peer sent ERROR: ${f.reason}`, false);
      return;
    }
    if (this.phase === "settings") {
      this.peer = firstSettings(f);
      this.phase = "open";
      this.events.push({ type: "Established" });
      return;
    }
    switch (f.type) {
      case "SETTINGS":
        throw new ProtocolError(ErrorCode.SETTINGS_ERROR, "a second SETTINGS frame");
      case "PING":
        this.onPing(f);
        return;
      case "GOAWAY":
        this.onGoAway(f.lastCallId, f.code, f.reason);
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

  /** A frame of one call: the side's checks, the call (or none: crossed an END or CANCEL, §6), its handler. */
  private onCallFrame(f: CallFrame): void {
    const client = this.role === "client";
    if (client && (f.type === "HALF_CLOSE" || f.type === "CANCEL")) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `${f.type} from the server`);
    if (!client && (f.type === "HEADERS" || f.type === "END")) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `${f.type} from the client`);
    const c = this.calls.get(f.callId);
    if (c === undefined) {
      if (f.callId > this.highest) throw new ProtocolError(ErrorCode.UNKNOWN_CALL, `${f.type} for call ${f.callId}, which was never opened`);
      return; // crossed an END or CANCEL (§6)
    }
    switch (f.type) {
      case "MESSAGE":
        return this.onMessage(c, f);
      case "CONTINUATION":
        return this.onContinuation(c, f);
      case "HEADERS":
        return this.onHeaders(c, f);
      case "END":
        return this.onEnd(c, f);
      case "HALF_CLOSE":
        return this.onHalfClose(c);
      case "CANCEL":
        return this.onCancel(c, f);
      case "CREDIT":
        return this.onCredit(c, f);
    }
  }
}
