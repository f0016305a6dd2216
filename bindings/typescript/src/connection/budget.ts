/**
 * The memory budget for incomplete split messages and large frames still arriving (§9 "Local
 * limits"), shared by a process's connections.
 * @module
 */

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

/**
 * One connection holds at most `1 / SHARE_OF_BUDGET` of its budget in incomplete messages (as
 * Rust's `SHARE_OF_BUDGET`): past it that connection's chunk credit is withheld (one split
 * message per connection still goes on), so that one connection cannot spend what the others need.
 */
export const SHARE_OF_BUDGET = 8;

/** Frames announced larger than this (one 64 KiB read) are charged to the memory budget while they arrive. */
export const LARGE_FRAME = 64 * 1024;
