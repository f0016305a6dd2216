/**
 * Bounds of the gRPC face beyond what `@grpc/grpc-js` and Node's `http2` keep (the Rust gRPC
 * face's rules, docs/hardening.md), per connection:
 *
 * - request messages under way: grpc-js gathers a message whole before a handler sees it, so
 *   what has arrived of each stream's message in progress (over 64 KiB announced) is charged to
 *   the memory budget as it arrives; past the connection's share (1/8 of the budget) or while the
 *   budget is spent, its streams are paused — Node then withholds their HTTP/2 window — except
 *   one, which always goes on; they resume once it has room;
 * - a request message that stops arriving while its stream is read is cut after the frame
 *   timeout (RST_STREAM CANCEL; the time does not count while this side withholds a window);
 * - a peer that takes none of our bytes (the socket's write queue stays as it was) for the write
 *   timeout: the connection is closed;
 * - answers not yet taken (in the streams, waiting for the peer's window, and in the socket's
 *   write queue) count as the connection's unsent bytes: past the send buffer new calls wait to
 *   start, one by one as it drains.
 * @module
 */
import type * as http2 from "node:http2";
import type * as net from "node:net";
import { SHARE_OF_BUDGET, type MemoryBudget } from "../connection.js";

/** Messages announced larger than this are charged while they arrive (as native frames over 64 KiB). */
const CHARGED_OVER = 64 * 1024;
/** RST_STREAM CANCEL (RFC 9113 §7). */
const CANCEL = 0x8;

/** The time bounds (ms, 0: none) and the budget a connection is held to. */
export interface GuardBounds {
  writeMs: number;
  frameMs: number;
  budget: MemoryBudget;
  /** Unsent bytes past which new calls wait to start (0: none). */
  maxSendBuffer: number;
}

/** One request stream: the gRPC message it is receiving (5-byte prefix, then the body). */
class StreamWatch {
  private readonly head = new Uint8Array(5);
  private headLen = 0;
  /** Body bytes of the message in progress still to come. */
  private left = 0;
  private announced = 0;
  charged = 0;
  lastData = Date.now();
  pausedByUs = false;

  constructor(
    readonly stream: http2.ServerHttp2Stream,
    private readonly conn: ConnGuard,
  ) {}

  /** Whether a message is under way (part of its prefix or body arrived, not all of it). */
  get partial(): boolean {
    return this.headLen > 0 || this.left > 0;
  }

  /** Bytes of the stream's DATA, as the stream passes them on. */
  feed(b: Uint8Array): void {
    this.lastData = Date.now();
    this.conn.lastData = this.lastData;
    let p = 0;
    while (p < b.length) {
      if (this.left === 0) {
        const n = Math.min(5 - this.headLen, b.length - p);
        this.head.set(b.subarray(p, p + n), this.headLen);
        this.headLen += n;
        p += n;
        if (this.headLen < 5) return;
        this.announced = new DataView(this.head.buffer).getUint32(1);
        this.left = this.announced;
        if (this.left === 0) this.headLen = 0;
        continue;
      }
      const n = Math.min(this.left, b.length - p);
      this.left -= n;
      p += n;
      if (this.announced > CHARGED_OVER) this.conn.charge(this, n);
      if (this.left === 0) {
        this.headLen = 0;
        this.conn.release(this); // whole: grpc-js hands it to the handler, which charges it while held
      }
    }
  }
}

/** The bounds of one gRPC connection (an HTTP/2 session over an accepted socket). */
export class ConnGuard {
  private readonly watches = new Set<StreamWatch>();
  /** Bytes of incomplete request messages charged for this connection. */
  private held = 0;
  /** The stream that goes on while the others are paused. */
  private favoured: StreamWatch | null = null;
  private unsubscribe: (() => void) | null = null;
  private readonly timer: ReturnType<typeof setInterval> | undefined;
  private stallSince = 0;
  private lastQueue = 0;
  /** When a byte of a request message last arrived on any stream of this connection. */
  lastData = Date.now();

  constructor(
    private readonly socket: net.Socket,
    private readonly b: GuardBounds,
  ) {
    const every = Math.min(...[b.writeMs, b.frameMs].filter((t) => t > 0).map((t) => t / 4), 1000);
    if (b.writeMs > 0 || b.frameMs > 0) {
      this.timer = setInterval(() => this.tick(), Math.max(10, every));
      this.timer.unref();
    }
    socket.once("close", () => this.close());
  }

  /** A request stream of this connection: watched until it closes. */
  watch(stream: http2.ServerHttp2Stream): void {
    const w = new StreamWatch(stream, this);
    this.watches.add(w);
    stream.on("data", (b: Buffer) => w.feed(b));
    stream.once("close", () => {
      this.watches.delete(w);
      if (this.favoured === w) this.favoured = null;
      this.release(w);
    });
  }

  /** Charges `n` bytes of `w`'s message in progress; pauses streams past the share. */
  charge(w: StreamWatch, n: number): void {
    this.b.budget.reserve(n);
    this.held += n;
    w.charged += n;
    this.balance();
  }

  /** Gives back what `w`'s message held (it completed, or the stream closed). */
  release(w: StreamWatch): void {
    if (w.charged === 0) return;
    this.b.budget.release(w.charged);
    this.held -= w.charged;
    w.charged = 0;
    this.balance();
  }

  private over(): boolean {
    return this.held > this.b.budget.limit / SHARE_OF_BUDGET || this.b.budget.exhausted;
  }

  /** Pauses the streams with a message under way (one goes on) while over; resumes them once not. */
  private balance(): void {
    if (this.over()) {
      if (this.favoured === null || !this.favoured.partial) this.favoured = [...this.watches].find((w) => w.partial) ?? null;
      for (const w of this.watches) {
        if (w === this.favoured) {
          if (w.pausedByUs) this.unpause(w, Date.now()); // the one that goes on
          continue;
        }
        if (w.pausedByUs || !w.partial || w.stream.readableFlowing !== true) continue;
        w.pausedByUs = true;
        w.stream.pause();
      }
      this.unsubscribe ??= this.b.budget.subscribe(() => this.balance());
      return;
    }
    this.unsubscribe?.();
    this.unsubscribe = null;
    const now = Date.now();
    for (const w of this.watches) if (w.pausedByUs) this.unpause(w, now);
  }

  private unpause(w: StreamWatch, now: number): void {
    w.pausedByUs = false;
    w.lastData = now; // its time starts when it is read again
    w.stream.resume();
  }

  /** The timers: messages that stopped arriving, output the peer does not take. */
  private tick(): void {
    const now = Date.now();
    const starved = this.connectionWindowSpent();
    for (const w of this.watches) {
      if (!w.partial) continue;
      // Not the peer's stall while this side withholds the stream's window, or data of paused
      // streams left the connection's window spent, or grpc-js does not read the stream (its
      // handler takes no message now): the time starts again.
      if (starved || w.pausedByUs || w.stream.readableFlowing !== true) w.lastData = now;
      else if (this.b.frameMs > 0 && now - w.lastData >= this.b.frameMs) this.cut(w);
    }
    // Paused streams' unread data spent the connection's window and nothing arrived for the
    // frame timeout: the stream holding most is reset, which gives its share and window back
    // (else such a peer would hold its share for ever).
    if (starved && this.b.frameMs > 0 && now - this.lastData >= this.b.frameMs) {
      const most = [...this.watches].filter((w) => w.partial).sort((a, b) => b.charged - a.charged)[0];
      this.lastData = now;
      if (most !== undefined) this.cut(most);
    }
    this.checkWrites(now);
  }

  /** Resets a stream whose message stopped arriving (RST_STREAM CANCEL), giving back what it held. */
  private cut(w: StreamWatch): void {
    this.watches.delete(w);
    if (this.favoured === w) this.favoured = null;
    this.release(w); // (another stream is favoured, and resumed, if the connection is still over)
    w.stream.close(CANCEL);
  }

  /** The HTTP/2 session of this connection (set when Node makes it). */
  session: http2.Http2Session | null = null;

  /**
   * Whether the connection's receive window is (nearly) spent while streams are paused by us:
   * their unread data counts against it, so the stream that goes on may get nothing either.
   */
  private connectionWindowSpent(): boolean {
    if (![...this.watches].some((w) => w.pausedByUs)) return false;
    const st = this.session?.state;
    if (st?.effectiveLocalWindowSize === undefined || st.effectiveRecvDataLength === undefined) return true;
    return st.effectiveLocalWindowSize - st.effectiveRecvDataLength < 16 * 1024;
  }

  /**
   * A peer that takes none of our bytes: the socket's write queue (libuv's, which HTTP/2 writes
   * through) stays non-empty and unchanged for the write timeout. HTTP/2 writes again only once
   * a write completed, so any change means the peer took bytes.
   */
  private checkWrites(now: number): void {
    if (this.b.writeMs <= 0) return;
    const q = this.writeQueue();
    if (q === 0 || q !== this.lastQueue) {
      this.lastQueue = q;
      this.stallSince = q === 0 ? 0 : now;
      return;
    }
    if (this.stallSince === 0 || now - this.stallSince < this.b.writeMs) return;
    // HTTP/2 owns the socket's handle: the session closes it (its streams end, their calls cancelled)
    // HTTP/2 owns the socket's handle and would end it gracefully, waiting for bytes the peer
    // never takes: the session goes (its streams end, their calls cancelled), then the socket
    this.session?.destroy();
    this.socket.destroy();
  }

  /** The socket's write queue (libuv's: HTTP/2 writes through the handle). */
  private writeQueue(): number {
    return (this.socket as unknown as { _handle?: { writeQueueSize?: number } | null })._handle?.writeQueueSize ?? 0;
  }

  /** Answers not yet taken: in the streams (waiting for the peer's window or the socket) and the socket's queue. */
  unsent(): number {
    let n = this.writeQueue();
    for (const w of this.watches) n += w.stream.writableLength;
    return n;
  }

  private readonly roomWaiters: { stop: () => boolean; go: () => void }[] = [];
  private roomTimer: ReturnType<typeof setTimeout> | undefined;
  private closed = false;

  /**
   * Resolves when a new call may start: at once while the unsent bytes are under the send
   * buffer and no call waits before it; else in turn, one every 5 ms at most once there is
   * room (its answer shows in the unsent bytes before the next starts), or when `stop()`.
   */
  room(stop: () => boolean): Promise<void> {
    if (this.roomWaiters.length === 0 && this.hasRoom()) return Promise.resolve();
    return new Promise((go) => {
      this.roomWaiters.push({ stop, go });
      this.pollRoom();
    });
  }

  /** Whether the unsent bytes are under the send buffer (or there is none, or the connection closed). */
  hasRoom(): boolean {
    return this.b.maxSendBuffer <= 0 || this.closed || this.unsent() < this.b.maxSendBuffer;
  }

  private pollRoom(): void {
    if (this.roomTimer !== undefined || this.roomWaiters.length === 0) return;
    this.roomTimer = setTimeout(() => {
      this.roomTimer = undefined;
      let free = this.hasRoom();
      for (let i = 0; i < this.roomWaiters.length; ) {
        const w = this.roomWaiters[i] as { stop: () => boolean; go: () => void };
        if (!free && !w.stop() && !this.closed) {
          i++;
          continue;
        }
        this.roomWaiters.splice(i, 1);
        if (!w.stop() && !this.closed) free = false; // one call starts per look
        w.go();
      }
      this.pollRoom();
    }, 5);
  }

  private close(): void {
    this.closed = true;
    for (const w of this.roomWaiters.splice(0)) w.go();
    clearTimeout(this.roomTimer);
    clearInterval(this.timer);
    this.unsubscribe?.();
    this.unsubscribe = null;
    for (const w of this.watches) this.release(w);
  }
}
