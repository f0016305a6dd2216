/**
 * Per-call flow control (§7) and the memory budget (§9): charging what the peer sends against
 * its credit, giving credit back as the application consumes messages, and withholding the
 * credit for chunks of split messages while the shared memory budget is spent.
 * @module
 */
import { ErrorCode, HEADER_LEN, ProtocolError } from "../frame.js";
import { LARGE_FRAME } from "./budget.js";
import type { Call } from "./calls.js";
import { ConnectionState } from "./state.js";

/** The largest credit a call may hold (§7). */
export const MAX_CREDIT = 0x7fffffff;

/** @internal The flow-control layer of the engine. */
export abstract class FlowControl extends ConnectionState {
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

  /**
   * Charges the memory budget with the bytes held for a large frame still arriving (one whose
   * header announced more than {@link LARGE_FRAME}): they are held as they arrive (never
   * allocated at the announced size), and counted with the split messages being reassembled.
   */
  protected chargeFrame(): void {
    const held = this.phase !== "closed" && this.decoder.announced > LARGE_FRAME ? this.decoder.pending : 0;
    if (held > this.frameCharge) this.hold(held - this.frameCharge);
    else if (held < this.frameCharge) this.unhold(this.frameCharge - held);
    this.frameCharge = held;
  }

  /** Holds `n` bytes in the budget, charged to this connection's share too. */
  protected hold(n: number): void {
    this.shareUsed += n;
    this.memoryBudget.reserve(n);
  }

  /** Releases `n` bytes of the budget and of this connection's share. */
  protected unhold(n: number): void {
    if (n <= 0) return;
    this.shareUsed = Math.max(0, this.shareUsed - n);
    this.memoryBudget.release(n);
  }

  /** Whether chunk credit is withheld: the budget is spent, or this connection's share of it (§7). */
  protected get starved(): boolean {
    return this.memoryBudget.exhausted || this.shareUsed >= this.shareLimit;
  }

  /** Charges a received message frame (header and `payload` bytes) against the call's credit. */
  protected chargeRecv(c: Call, payload: number): void {
    if (c.recvCredit <= 0) throw new ProtocolError(ErrorCode.FLOW_CONTROL, `message frame on call ${c.id} without credit`);
    c.recvCredit -= HEADER_LEN + payload;
  }

  /** Credit for a chunk of a split message: granted now, or withheld while memory is spent (§7). */
  protected chunkCredit(c: Call, n: number): void {
    if (this.starved && this.privileged !== c.id) {
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
      if (c.withheld > 0 && !this.starved) {
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
  protected dropSplit(c: Call): void {
    const s = c.split;
    if (s === null) return;
    c.split = null;
    this.splitsOpen--;
    if (this.privileged === c.id) this.privileged = null;
    this.unhold(s.buf.length);
    this.promote();
    if (this.unsubscribe !== null) this.regrant(); // our share came back: the budget may not say so
  }

  /** Budget still spent and no split message going on: lets a waiting one go on (§7). */
  private promote(): void {
    if (this.privileged !== null || !this.starved || this.phase === "closed") return;
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
  protected forget(id: number): void {
    const c = this.calls.get(id);
    if (c === undefined) return;
    this.calls.delete(id);
    this.dropSplit(c);
    if (this.privileged === id) {
      this.privileged = null;
      this.promote();
    }
  }

  protected grantNow(c: Call, n: number): void {
    c.recvCredit += n;
    this.send({ type: "CREDIT", flags: 0, callId: c.id, increment: n });
  }
}
