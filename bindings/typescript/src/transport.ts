/**
 * Transports carry the topspin byte stream (protocol.md §14). A {@link Duplex} is one open
 * stream; a {@link Dialer} opens one. This module has the WebSocket transport, which works in
 * browsers (the global `WebSocket`) and in Node (pass the `ws` package's class, or Node's own).
 * @module
 */
import { Code, TopspinError } from "./status.js";

/** One open byte stream. */
export interface Duplex {
  /** Writes bytes, in order. */
  write(chunks: Uint8Array[]): void;
  /** Closes the stream (no more reads or writes). */
  close(): void;
  /** Set by the user of the stream: bytes arrived. */
  onData: (bytes: Uint8Array) => void;
  /** Set by the user of the stream: the stream ended (`reason` says why). */
  onClose: (reason: string) => void;
  /** Bytes written and not yet handed to the network (transports that cannot tell leave it out). */
  pending?(): number;
  /** Stops delivering received bytes until {@link Duplex.resume} (transports that cannot leave it out). */
  pause?(): void;
  /** Delivers received bytes again. */
  resume?(): void;
  /** Calls `f` once, the next time the transport's output buffer drained (transports without such an event leave it out). */
  onDrain?(f: () => void): void;
  /** Closes at once, dropping what is not sent (a peer that does not read); absent: {@link Duplex.close}. */
  abort?(): void;
}

/** What a transport can say about its output and do about its input (optional parts of a {@link Duplex}). */
export interface FlowControl {
  /** Bytes written and not yet handed to the network. */
  pending: () => number;
  /** Stops delivering received bytes. */
  pause: () => void;
  /** Delivers received bytes again. */
  resume: () => void;
  /** Calls `f` once, the next time the output buffer drained (absent: the user polls `pending`). */
  onDrain?: (f: () => void) => void;
  /** Closes at once, dropping what is not sent (absent: the close function). */
  abort?: () => void;
}

/**
 * A {@link Duplex} that holds what arrives until its user sets `onData` / `onClose`: a server
 * may send its preface at once, in the same read as the WebSocket handshake's answer, before
 * the dialer's caller has had a chance to listen.
 */
export class HeldDuplex implements Duplex {
  private held: Uint8Array[] | null = [];
  private closedWith: string | null = null;
  private dataFn: (bytes: Uint8Array) => void = (b) => this.held?.push(b);
  private closeFn: ((reason: string) => void) | null = null;

  constructor(
    private readonly writeFn: (chunks: Uint8Array[]) => void,
    private readonly closeImpl: () => void,
    private readonly flow?: FlowControl,
  ) {}

  pending(): number {
    return this.flow?.pending() ?? 0;
  }
  pause(): void {
    this.flow?.pause();
  }
  resume(): void {
    this.flow?.resume();
  }
  onDrain(f: () => void): void {
    this.flow?.onDrain?.(f);
  }
  abort(): void {
    if (this.flow?.abort) this.flow.abort();
    else this.closeImpl();
  }

  write(chunks: Uint8Array[]): void {
    this.writeFn(chunks);
  }
  close(): void {
    this.closeImpl();
  }
  get onData(): (bytes: Uint8Array) => void {
    return this.dataFn;
  }
  set onData(f: (bytes: Uint8Array) => void) {
    this.dataFn = f;
    const held = this.held;
    this.held = null;
    for (const b of held ?? []) f(b);
  }
  get onClose(): (reason: string) => void {
    return this.closeFn ?? ((r: string) => (this.closedWith = r));
  }
  set onClose(f: (reason: string) => void) {
    this.closeFn = f;
    if (this.closedWith !== null) f(this.closedWith);
  }
  /** The transport delivers bytes. */
  deliver(b: Uint8Array): void {
    this.dataFn(b);
  }
  /** The transport ended. */
  end(reason: string): void {
    if (this.closeFn) this.closeFn(reason);
    else this.closedWith = reason;
  }
}

/** Opens a new stream to the server. */
export type Dialer = (signal?: AbortSignal) => Promise<Duplex>;

/** The subprotocol of topspin over WebSocket (§14.2). */
export const WS_SUBPROTOCOL = "topspin.v1";
/** Largest WebSocket message a sender writes (§14.2: SHOULD keep them at or under 256 KiB). */
export const WS_MAX_MESSAGE = 256 * 1024;

/** Chunks at least this long are sent as they are (cut at {@link WS_MAX_MESSAGE}), not copied. */
const WS_COPY_BELOW = 16 * 1024;

/**
 * Sends a piece of the byte stream as binary WebSocket messages (§14.2): runs of small chunks
 * (frame headers, small frames) are copied into one message, large chunks (message payloads) go
 * as their own messages without a copy; no message is over {@link WS_MAX_MESSAGE}.
 */
export function sendAsMessages(chunks: Uint8Array[], send: (message: Uint8Array) => void): void {
  let run: Uint8Array[] = [];
  let runBytes = 0;
  const sendRun = (): void => {
    if (run.length === 1) send(run[0] as Uint8Array);
    else if (run.length > 1) {
      const m = new Uint8Array(runBytes);
      let off = 0;
      for (const c of run) {
        m.set(c, off);
        off += c.length;
      }
      send(m);
    }
    run = [];
    runBytes = 0;
  };
  for (const c of chunks) {
    if (c.length >= WS_COPY_BELOW) {
      sendRun();
      for (let off = 0; off < c.length; off += WS_MAX_MESSAGE) send(c.subarray(off, off + WS_MAX_MESSAGE));
    } else if (c.length > 0) {
      if (runBytes + c.length > WS_MAX_MESSAGE) sendRun();
      run.push(c);
      runBytes += c.length;
    }
  }
  sendRun();
}

/** The part of the WebSocket API this transport uses (browser, `ws`, Node's own). */
export interface WebSocketLike {
  binaryType: string;
  readonly protocol: string;
  readonly readyState: number;
  /** Bytes passed to `send` and not yet handed to the network (browsers, `ws`; absent: unknown). */
  readonly bufferedAmount?: number;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
}
/** A WebSocket constructor. */
export type WebSocketCtor = new (url: string, protocols: string | string[]) => WebSocketLike;

/**
 * A dialer for `ws://host:port/path` or `wss://…`. `ctor` defaults to the global `WebSocket`
 * (browsers, Node 22+); in older Node pass `WebSocket` from the `ws` package.
 */
export function webSocketDialer(url: string, ctor?: WebSocketCtor): Dialer {
  return (signal?: AbortSignal) =>
    new Promise<Duplex>((resolve, reject) => {
      const Ctor = ctor ?? (globalThis as unknown as { WebSocket?: WebSocketCtor }).WebSocket;
      if (Ctor === undefined) {
        reject(new TopspinError(Code.UNAVAILABLE, "no WebSocket implementation: pass one (the ws package) to webSocketDialer"));
        return;
      }
      let ws: WebSocketLike;
      try {
        ws = new Ctor(url, [WS_SUBPROTOCOL]);
      } catch (e) {
        reject(new TopspinError(Code.UNAVAILABLE, `cannot open ${url}: ${String(e)}`));
        return;
      }
      ws.binaryType = "arraybuffer";
      let open = false;
      const duplex = new HeldDuplex(
        (chunks) => {
          if (ws.readyState === 1) sendAsMessages(chunks, (m) => ws.send(m));
        },
        () => {
          try {
            ws.close(1000);
          } catch {
            /* already closed */
          }
        },
        // A WebSocket has no drain event: the driver polls bufferedAmount. Reading is never
        // paused by a client (see Driver), so pause/resume do nothing here.
        { pending: () => ws.bufferedAmount ?? 0, pause: () => undefined, resume: () => undefined },
      );
      const onAbort = (): void => {
        ws.close();
        reject(new TopspinError(Code.CANCELLED, "connect aborted"));
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      ws.onopen = () => {
        signal?.removeEventListener("abort", onAbort);
        if (ws.protocol !== WS_SUBPROTOCOL) {
          reject(new TopspinError(Code.UNAVAILABLE, `the server at ${url} did not answer with the ${WS_SUBPROTOCOL} subprotocol`));
          ws.close(1002);
          return;
        }
        open = true;
        resolve(duplex);
      };
      ws.onmessage = (ev) => {
        const d = ev.data;
        if (d instanceof ArrayBuffer) duplex.deliver(new Uint8Array(d));
        else if (ArrayBuffer.isView(d)) duplex.deliver(new Uint8Array(d.buffer, d.byteOffset, d.byteLength));
        else ws.close(1003, "text messages are not topspin");
      };
      ws.onerror = () => undefined;
      ws.onclose = (ev) => {
        signal?.removeEventListener("abort", onAbort);
        const why = `WebSocket closed (${ev.code}${ev.reason ? " " + ev.reason : ""})`;
        if (!open) reject(new TopspinError(Code.UNAVAILABLE, `cannot connect to ${url}: ${why}`));
        else duplex.end(why);
      };
    });
}
