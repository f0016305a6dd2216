/**
 * Binds a {@link Connection} engine to a {@link Duplex}: received bytes go in, queued bytes go
 * out, events go to a handler. Shared by the client channel and the Node server.
 * @module
 */
import { Connection, type Event } from "./connection.js";
import type { Duplex } from "./transport.js";

/** Runs `f` later: after this turn's microtasks with `setImmediate` in Node, as a microtask elsewhere (browsers clamp timers). */
const schedule: (f: () => void) => void =
  typeof (globalThis as { setImmediate?: unknown }).setImmediate === "function"
    ? (f) => void (globalThis as unknown as { setImmediate: (f: () => void) => unknown }).setImmediate(f)
    : (f) => queueMicrotask(f);

/** What a server keeps undecoded after a resume at most (beyond one turn's reads), bytes. */
const STASH_MAX = 256 * 1024;

/** Runs one engine over one stream. */
export class Driver {
  private pumping = false;
  private again = false;
  private ioClosed = false;
  /** How many reads arrived (keep-alive looks for a change: no clock on the hot path). */
  reads = 0;
  /** Called after each read was handed to the engine, with its length (a server's timers). */
  onRead: ((bytes: number) => void) | null = null;
  /** Called after bytes were handed to the stream (a server's write timer). */
  onWrite: (() => void) | null = null;
  /** Bytes handed to the stream so far. */
  private written = 0;

  /**
   * @param maxPending The bound on output produced and not yet written to the network (§7,
   *   "output a peer does not read"); 0: none. Past it the driver stops reading from the stream
   *   (the peer sees backpressure) and {@link Driver.full} tells producers to wait
   *   ({@link Driver.room}) until the output drained below half of it.
   * @param pauseReads Whether reading stops too while the output is full (a server: the peer
   *   feels backpressure). A client keeps reading: a server that stops reading because its own
   *   output to us is full would otherwise wait for us forever.
   */
  constructor(
    readonly engine: Connection,
    readonly io: Duplex,
    private readonly onEvent: (e: Event) => void,
    private readonly maxPending = 0,
    private readonly pauseReads = true,
  ) {
    io.onData = (b) => {
      this.reads++;
      if (this.holding || this.cautious) {
        this.stash.push(b); // passed after a pause, or a resume's backlog
        this.stashed += b.length;
      } else this.take(b);
    };
    engine.onWake = () => this.pump();
    io.onClose = (reason) => {
      this.ioClosed = true;
      this.stash = [];
      this.stashed = 0;
      engine.transportClosed(reason);
      this.pump();
      this.wakeRoom();
    };
    this.pump();
  }

  /** Hands received bytes to the engine and its events to the handler. */
  private take(b: Uint8Array): void {
    this.engine.receive(b);
    this.onRead?.(b.length);
    this.pump();
  }

  /**
   * Hands the engine's events over and schedules a write of what it queued; safe to call from
   * a handler. Writes are coalesced: the frames of everything done in one turn of the event
   * loop (a CALL and its MESSAGE, a reply and its END, many calls) go out in one write.
   */
  pump(): void {
    if (this.pumping) {
      this.again = true;
      return;
    }
    this.pumping = true;
    try {
      do {
        this.again = false;
        for (const e of this.engine.takeEvents()) this.onEvent(e);
      } while (this.again);
    } finally {
      this.pumping = false;
    }
    if (this.engine.closed) this.flush();
    else if (this.engine.outputBytes > 0 && !this.flushScheduled) {
      this.flushScheduled = true;
      schedule(this.flushNow);
    }
  }

  private flushScheduled = false;
  private readonly flushNow = (): void => {
    this.flushScheduled = false;
    this.flush();
  };

  /** Writes what the engine queued now (and closes the stream once the engine is closed). */
  flush(): void {
    const out = this.engine.takeOutput();
    if (out.length > 0 && !this.ioClosed) {
      for (const c of out) this.written += c.length;
      this.io.write(out);
      this.onWrite?.();
    }
    if (this.engine.closed && !this.ioClosed) {
      this.ioClosed = true;
      this.io.close();
      this.wakeRoom();
    } else this.settle();
  }

  /**
   * Writes what is queued, then closes the stream without closing the engine first (after a
   * GOAWAY with no call left: the peer reads everything we sent, then the end of the stream).
   */
  close(): void {
    this.flush();
    if (this.ioClosed) return;
    this.ioClosed = true;
    this.io.close();
    this.wakeRoom();
  }

  /**
   * Closes the stream at once, dropping what it has not sent (`Duplex.abort`): for a peer that
   * takes none of our bytes, whose stream would never finish a graceful close.
   */
  abortIo(): void {
    if (this.ioClosed) return;
    this.ioClosed = true;
    if (this.io.abort) this.io.abort();
    else this.io.close();
    this.wakeRoom();
  }

  /** Bytes handed to the stream and not yet taken by the network (0 when the stream cannot tell). */
  get unsent(): number {
    return this.ioClosed ? 0 : (this.io.pending?.() ?? 0);
  }

  /** Bytes the network has taken so far (handed to the stream, less what it still holds). */
  get taken(): number {
    return this.written - this.unsent;
  }

  /** Whether reading is held (a server whose peer does not read: see {@link Driver.firstRoom}). */
  get readsPaused(): boolean {
    return this.holding;
  }

  /** Reading is held: the stream is paused and what it still passes waits in {@link Driver.stash}, not decoded. */
  private holding = false;
  /**
   * Bytes the stream passed while reading was held (the peer's calls, not yet decoded). Bounded:
   * while held the stream is paused, so it passes at most the read under way; once resumed,
   * {@link Driver.takeStashed} keeps it under {@link STASH_MAX} (plus one read).
   */
  private stash: Uint8Array[] = [];
  /** Their length. */
  private stashed = 0;
  /** A watch of the output draining runs (it wakes the producers waiting for room). */
  private watching = false;
  /** Calls waiting for room before their handler starts or before their first answer. */
  private firstWaits = 0;
  /** Producers waiting for the output to drain (at most one per call of the connection). */
  private roomWaiters: (() => void)[] = [];

  /**
   * Bytes of messages being produced (encoded and compressed) and not yet handed to the engine:
   * they count toward the bound, so that while one is produced the others wait (§7: what the
   * bound may pass by is one message).
   */
  private producing = 0;

  /** The output held for the peer: produced and not handed to the engine, queued in it, or not yet taken by the network. */
  get held(): number {
    return this.ioClosed ? 0 : (this.io.pending?.() ?? 0) + this.engine.outputBytes + this.producing;
  }

  /** Whether the output not yet written has reached `maxPending` (always false without a bound). */
  get full(): boolean {
    return this.maxPending > 0 && !this.ioClosed && this.held >= this.maxPending;
  }

  /**
   * Produces one message under the bound: waits while the output is full, then counts the
   * `size` bytes `make` produces (asynchronously: compression) toward it until it returns.
   * `stop` (the call ended) ends the wait early.
   */
  async produce<T>(size: number, make: () => Promise<T>, stop: () => boolean): Promise<T> {
    while (this.full && !stop()) await this.room();
    this.producing += size;
    try {
      return await make();
    } finally {
      this.producing -= size;
    }
  }

  /** Resolves once the output drained to half the bound (at once when it is not full, or the stream closed). */
  room(): Promise<void> {
    if (!this.full) return Promise.resolve();
    const p = new Promise<void>((r) => this.roomWaiters.push(r));
    this.settle();
    return p;
  }

  /**
   * A server call's wait before its handler starts and before its first answer (§7, the Rust
   * server's rule for calls that arrive while the send buffer is full): while the output is full
   * the call waits for room, and while any call waits so the connection is not read (what the
   * stream still passes is kept undecoded) — not even once the output drained to half its bound,
   * until those calls have answered. So a peer that pipelines calls and never reads makes the
   * server hold its output bound and the calls of about one read, not every call it sent.
   */
  async firstRoom(stop: () => boolean): Promise<void> {
    if (!this.full || stop()) return;
    this.firstWaits++;
    try {
      while (this.full && !stop()) await this.room();
    } finally {
      this.firstWaits--;
      if (this.firstWaits === 0) this.settle();
    }
  }

  /**
   * Holds reading (when `pauseReads`) while the output is full or calls wait in
   * {@link Driver.firstRoom}; resumes it, decoding what was kept meanwhile, once neither is so;
   * watches the output drain while it is full.
   */
  private settle(): void {
    if (this.full && !this.watching) this.watch();
    if (this.pauseReads && !this.ioClosed && (this.full || this.firstWaits > 0)) {
      if (!this.holding) {
        this.holding = true;
        this.io.pause?.();
      }
      return;
    }
    if (!this.holding) return;
    this.holding = false;
    if (this.ioClosed) {
      this.stash = [];
      this.stashed = 0;
      return;
    }
    this.io.resume?.();
    if (!this.cautious) {
      this.cautious = true;
      schedule(this.takeStashed);
    }
  }

  /**
   * After a resume, one read per turn of the event loop (what was kept, then the backlog the
   * stream passes at once): the calls one read starts run, and may fill the output again, before
   * the next read is decoded. Ends (reads go straight to the engine again) once nothing is kept.
   * A peer that sends faster than a read a turn meanwhile has more taken, so that what is kept
   * stays under {@link STASH_MAX}.
   */
  private cautious = false;
  private readonly takeStashed = (): void => {
    if (this.holding || this.ioClosed || this.stash.length === 0) {
      this.cautious = false;
      return;
    }
    do this.takeOne();
    while (!this.holding && this.stashed > STASH_MAX);
    schedule(this.takeStashed);
  };

  private takeOne(): void {
    const b = this.stash.shift();
    if (b === undefined) return;
    this.stashed -= b.length;
    this.take(b);
  }

  /**
   * Wakes the producers waiting for room once the output drained to half the bound: checked
   * when the transport says it drained (`onDrain`: a socket's 'drain') and every 5 ms meanwhile
   * (transports without a drain event: a WebSocket's `bufferedAmount`).
   */
  private watch(): void {
    this.watching = true;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let done = false;
    const check = (): void => {
      if (done) return;
      clearTimeout(timer);
      if (!this.ioClosed && this.held > this.maxPending / 2) {
        timer = setTimeout(check, 5);
        return;
      }
      done = true;
      this.watching = false;
      this.wakeRoom();
      this.settle(); // reading resumes unless woken calls still wait for their first answer
    };
    this.io.onDrain?.(check);
    timer = setTimeout(check, 5);
  }

  private wakeRoom(): void {
    for (const w of this.roomWaiters.splice(0)) w();
  }
}
