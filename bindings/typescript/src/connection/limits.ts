/**
 * The local flood budgets of §9 "Local limits": token buckets for PINGs, rapid resets and
 * refused CALLs.
 * @module
 */

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

/** @internal A token bucket: `burst` tokens, refilled at one per `refillMs`. */
export class Bucket {
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
