/**
 * A small single-consumer async queue: the bridge between engine events and `for await`.
 * @module
 */

/** Items pushed by the producer, read once with `for await` or {@link AsyncQueue.next}. */
export class AsyncQueue<T> implements AsyncIterable<T> {
  private items: T[] = [];
  private head = 0;
  private ended = false;
  private error: unknown = undefined;
  private waiter: (() => void) | null = null;

  /** Adds an item (ignored once ended). */
  push(item: T): void {
    if (this.ended) return;
    this.items.push(item);
    this.wake();
  }

  /** Ends the queue: readers get the items left, then the end (or `error`, thrown). */
  end(error?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.error = error;
    this.wake();
  }

  /** Ends the queue at once with `error`, dropping the items left. */
  fail(error: unknown): void {
    this.items = [];
    this.head = 0;
    this.ended = false;
    this.end(error);
  }

  /** Whether the queue was ended. */
  get isEnded(): boolean {
    return this.ended;
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    if (w) w();
  }

  /** The next item, or `undefined` at the end. Throws the end's error. */
  async next(): Promise<{ done: false; value: T } | { done: true; value: undefined }> {
    for (;;) {
      if (this.head < this.items.length) {
        const value = this.items[this.head] as T;
        this.items[this.head++] = undefined as T;
        if (this.head > 1024 && this.head * 2 > this.items.length) {
          this.items = this.items.slice(this.head);
          this.head = 0;
        }
        return { done: false, value };
      }
      if (this.ended) {
        // eslint-disable-next-line @typescript-eslint/only-throw-error -- the producer's error, as given
        if (this.error !== undefined) throw this.error;
        return { done: true, value: undefined };
      }
      await new Promise<void>((r) => (this.waiter = r));
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    return { next: () => this.next() };
  }
}
