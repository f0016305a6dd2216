/**
 * The connection-level timers of a server connection (protocol.md §2, §9; the Rust server's
 * `connection/liveness.rs`): the handshake, a frame that started and stalls, output the peer does
 * not take, idleness and keep-alive. One timer per connection, set for the earliest of them and set again when it
 * fires; a read costs a clock reading and a comparison.
 * @module
 */
import { ErrorCode } from "../frame.js";
import type { Driver } from "../driver.js";
import type { KeepaliveOptions } from "../channel.js";

/** The time bounds of a connection, ms (0: none). */
export interface LivenessBounds {
  /** Preface and SETTINGS from the peer within this long of the accept. */
  handshakeMs: number;
  /** A frame that started to arrive must be complete within this long. */
  frameMs: number;
  /** A connection without calls for this long gets a GOAWAY and is closed. */
  idleMs: number;
  /**
   * A connection whose stream takes none of the bytes waiting for it for this long is closed at
   * once (its calls cancelled, its unsent bytes dropped): the Rust server's `write_timeout`.
   */
  writeMs: number;
  /** PINGs after silence; an unanswered one closes the connection. */
  keepalive: KeepaliveOptions | undefined;
}

const KEEPALIVE_DATA = new TextEncoder().encode("keepaliv");
/** setTimeout fires at once for delays past 2^31-1 ms: longer waits are taken in steps. */
const MAX_DELAY = 2 ** 31 - 1;

/** The timers of one connection. */
export class Liveness {
  private lastActive: number;
  /**
   * Since when no call has been open (the idle timeout counts from then): the last call's end,
   * or the handshake. Not the last read: a PING, its answer or any other frame that is not a call
   * keeps no connection from going idle (protocol.md §9; grpc-go's `MaxConnectionIdle`).
   */
  private idleSince: number;
  private partialSince = 0;
  /** When the open split messages must have progressed (Infinity: none open, as last seen). */
  private messageDue = Infinity;
  private pingSent = 0;
  /** Whether the handshake was seen complete (the idle and keep-alive times start then). */
  private established = false;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private timerAt = Infinity;
  private stopped = false;
  /** Since when bytes wait and the stream took none of them (0: none wait, as last seen). */
  private stallSince = 0;
  /** `driver.taken` when last looked at. */
  private takenAt = 0;
  /** When to look at the output again (while bytes wait). */
  private stallCheckAt = Infinity;

  /**
   * @param idle Whether the connection has no call open.
   * @param onIdle Sends the GOAWAY and closes the connection.
   * @param started When the connection was accepted (the handshake's time counts from then).
   */
  constructor(
    private readonly driver: Driver,
    private readonly bounds: LivenessBounds,
    private readonly idle: () => boolean,
    private readonly onIdle: () => void,
    private readonly started = Date.now(),
  ) {
    this.lastActive = started;
    this.idleSince = started;
    this.arm();
  }

  /** Bytes arrived (the driver's `onRead`). */
  onRead(): void {
    const now = Date.now();
    this.lastActive = now;
    this.pingSent = 0;
    if (!this.established && this.driver.engine.established) {
      // The handshake's timer was the one set; idleness and keep-alive count from now.
      this.established = true;
      this.idleSince = now;
      this.arm();
    }
    if (!this.driver.engine.partialInput) this.partialSince = 0;
    else if (this.partialSince === 0) {
      this.partialSince = now;
      this.arm();
    }
    if (this.messageDue === Infinity && this.bounds.frameMs > 0 && this.driver.engine.splitsOpen > 0) {
      this.messageDue = now + this.bounds.frameMs;
      this.arm();
    }
  }

  /**
   * Bytes were handed to the stream (the driver's `onWrite`): if they wait, the write timer
   * starts. A stream cannot say when it takes part of them, so while bytes wait the output is
   * looked at every quarter of the timeout (at most every second): taken bytes start it again,
   * none waiting stops it.
   */
  onWrite(): void {
    if (this.stallSince > 0 || this.bounds.writeMs <= 0 || this.driver.unsent === 0) return;
    const now = Date.now();
    this.stallSince = now;
    this.takenAt = this.driver.taken;
    this.stallCheckAt = now + this.pollMs();
    this.arm();
  }

  private pollMs(): number {
    return Math.max(10, Math.min(1000, this.bounds.writeMs / 4));
  }

  /** A call ended: the idle time counts from now. */
  callEnded(): void {
    this.lastActive = this.idleSince = Date.now();
    if (this.idle()) this.arm();
  }

  /** Stops the timers (the connection closed). */
  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** When the next bound may lapse (Infinity: none). */
  private next(): number {
    const b = this.bounds;
    const engine = this.driver.engine;
    let t = Infinity;
    if (!engine.established && b.handshakeMs > 0) t = Math.min(t, this.started + b.handshakeMs);
    if (this.partialSince > 0 && b.frameMs > 0) t = Math.min(t, this.partialSince + b.frameMs);
    if (this.stallSince > 0) t = Math.min(t, this.stallCheckAt);
    t = Math.min(t, this.messageDue);
    if (b.keepalive !== undefined) {
      t = Math.min(t, this.pingSent > 0 ? this.pingSent + (b.keepalive.timeoutMs ?? 20_000) : this.lastActive + b.keepalive.intervalMs);
    }
    if (b.idleMs > 0 && engine.established && !engine.goingAway && this.idle()) t = Math.min(t, this.idleSince + b.idleMs);
    return t;
  }

  /** Sets the timer for the next bound, unless one is set for earlier. */
  private arm(): void {
    if (this.stopped) return;
    const at = this.next();
    if (at >= this.timerAt || at === Infinity) return;
    clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = setTimeout(() => this.fire(), Math.min(MAX_DELAY, Math.max(0, at - Date.now())));
    this.timer.unref();
  }

  private fire(): void {
    this.timer = undefined;
    this.timerAt = Infinity;
    if (this.stopped || this.driver.engine.closed) return;
    if (!this.lapse(Date.now())) this.arm();
  }

  /** Acts on whichever bound lapsed; true when the connection was closed. */
  private lapse(now: number): boolean {
    const b = this.bounds;
    const engine = this.driver.engine;
    const timeout = (why: string): boolean => {
      engine.abort(ErrorCode.TIMEOUT, why);
      this.driver.pump();
      return true;
    };
    if (!engine.established && b.handshakeMs > 0 && now >= this.started + b.handshakeMs) {
      return timeout(`no preface and SETTINGS within ${b.handshakeMs} ms (handshake_timeout)`);
    }
    if (this.partialSince > 0 && b.frameMs > 0 && now >= this.partialSince + b.frameMs) {
      // Not the peer's stall when we stopped reading (it does not read our output, §7): the
      // send buffer bounds that; the frame's time starts again once we read.
      if (this.driver.readsPaused) this.partialSince = now;
      else return timeout(`a frame stayed incomplete for ${b.frameMs} ms (frame_timeout)`);
    }
    if (now >= this.messageDue) {
      // A split message that stalls in complete frames (the frame timer sees none): closed
      // with TIMEOUT unless we withheld its credit or stopped reading (our doing).
      this.messageDue = this.driver.readsPaused ? now + b.frameMs : engine.checkMessageProgress(b.frameMs);
      if (engine.closed) {
        this.driver.pump();
        return true;
      }
    }
    if (this.stallSince > 0 && now >= this.stallCheckAt) {
      const d = this.driver;
      if (d.unsent === 0) this.stallSince = 0;
      else if (d.taken > this.takenAt) {
        this.stallSince = now; // some were taken: the time starts again
        this.takenAt = d.taken;
      } else if (now >= this.stallSince + b.writeMs) {
        // The peer reads nothing: an ERROR would not reach it, and a graceful close would wait
        // for bytes it never takes. Its calls are cancelled, what they held given back.
        engine.abort(ErrorCode.TIMEOUT, `the peer took none of our bytes for ${b.writeMs} ms (write_timeout)`);
        d.abortIo();
        d.pump();
        return true;
      }
      this.stallCheckAt = this.stallSince > 0 ? Math.min(this.stallSince + b.writeMs, now + this.pollMs()) : Infinity;
    }
    const ka = b.keepalive;
    if (ka !== undefined) {
      const waitMs = ka.timeoutMs ?? 20_000;
      if (this.pingSent > 0 && now >= this.pingSent + waitMs) return timeout(`keep-alive PING unanswered for ${waitMs} ms`);
      if (this.pingSent === 0 && now >= this.lastActive + ka.intervalMs) {
        engine.ping(KEEPALIVE_DATA);
        this.driver.pump();
        this.pingSent = now;
      }
    }
    if (b.idleMs > 0 && engine.established && !engine.goingAway && this.idle() && now >= this.idleSince + b.idleMs) {
      this.onIdle();
      return true;
    }
    return false;
  }
}
