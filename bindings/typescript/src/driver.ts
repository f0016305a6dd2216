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

/** Runs one engine over one stream. */
export class Driver {
  private pumping = false;
  private again = false;
  private ioClosed = false;
  /** How many reads arrived (keep-alive looks for a change: no clock on the hot path). */
  reads = 0;

  constructor(
    readonly engine: Connection,
    readonly io: Duplex,
    private readonly onEvent: (e: Event) => void,
  ) {
    io.onData = (b) => {
      this.reads++;
      engine.receive(b);
      this.pump();
    };
    engine.onWake = () => this.pump();
    io.onClose = (reason) => {
      this.ioClosed = true;
      engine.transportClosed(reason);
      this.pump();
    };
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
    if (out.length > 0 && !this.ioClosed) this.io.write(out);
    if (this.engine.closed && !this.ioClosed) {
      this.ioClosed = true;
      this.io.close();
    }
  }
}
