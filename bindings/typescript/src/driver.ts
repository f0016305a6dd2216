/**
 * Binds a {@link Connection} engine to a {@link Duplex}: received bytes go in, queued bytes go
 * out, events go to a handler. Shared by the client channel and the Node server.
 * @module
 */
import { Connection, type Event } from "./connection.js";
import type { Duplex } from "./transport.js";

/** Runs one engine over one stream. */
export class Driver {
  private pumping = false;
  private again = false;
  private ioClosed = false;

  constructor(
    readonly engine: Connection,
    readonly io: Duplex,
    private readonly onEvent: (e: Event) => void,
  ) {
    io.onData = (b) => {
      engine.receive(b);
      this.pump();
    };
    io.onClose = (reason) => {
      this.ioClosed = true;
      engine.transportClosed(reason);
      this.pump();
    };
    this.pump();
  }

  /** Writes what the engine queued and hands its events over; safe to call from a handler. */
  pump(): void {
    if (this.pumping) {
      this.again = true;
      return;
    }
    this.pumping = true;
    try {
      do {
        this.again = false;
        const out = this.engine.takeOutput();
        if (out.length > 0 && !this.ioClosed) this.io.write(out);
        for (const e of this.engine.takeEvents()) this.onEvent(e);
      } while (this.again || this.engine.outputBytes > 0);
    } finally {
      this.pumping = false;
    }
    if (this.engine.closed && !this.ioClosed) {
      this.ioClosed = true;
      this.io.close();
    }
  }
}
