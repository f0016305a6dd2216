/**
 * The client runtime: a {@link Channel} multiplexes calls over one connection, opens it on first
 * use, and opens a new one (with backoff) when it is lost or the server goes away.
 * @module
 */
import { Connection, type Event, type Limits, type MemoryBudget } from "./connection.js";
import { Driver } from "./driver.js";
import { ErrorCode, type Metadata, type Settings } from "./frame.js";
import { AsyncQueue } from "./queue.js";
import { ACCEPT_ENCODING_KEY, ENCODING_KEY, acceptList, decodeMessage, encodeMessage, type Codecs, type Compression, type Decoder, type Encoder } from "./compression.js";
import { Code, TopspinError } from "./status.js";
import type { Dialer } from "./transport.js";
import type { Interceptor } from "./interceptor.js";

/** Per-call options, as in connect-es. */
export interface CallOptions {
  /** The call's deadline, in milliseconds from now (covers connecting, §8.1). */
  timeoutMs?: number;
  /** Cancels the call: CANCEL on the wire, the call fails with `CANCELLED`. */
  signal?: AbortSignal;
  /** Request metadata: entries, or an object of text values. */
  headers?: Metadata | Record<string, string>;
  /** Called with the response headers. */
  onHeader?: (headers: Metadata) => void;
  /** Called with the trailers of a call that ended OK. */
  onTrailer?: (trailers: Metadata) => void;
  /**
   * Compresses this call's request messages (§15) and accepts compressed responses; overrides
   * the channel's `compression`. `"identity"` turns it off for the call.
   */
  compression?: Compression | "identity";
}

/** Reconnection backoff. */
export interface BackoffOptions {
  /** First delay after a failure, ms (default 100). */
  initialMs: number;
  /** Largest delay, ms (default 5000). */
  maxMs: number;
  /** Growth per failure (default 1.6). */
  multiplier: number;
  /** Random spread, fraction of the delay (default 0.2). */
  jitter: number;
}

/**
 * Keep-alive (protocol.md §5.9, §9): after `intervalMs` in which nothing arrived, the channel
 * sends a PING; when nothing (its answer or anything else) arrives within `timeoutMs` after it,
 * the connection is closed (ERROR `TIMEOUT`) and its calls fail with `UNAVAILABLE`. A PING goes
 * out at most once per interval and only after that much silence, so any interval of 100 ms or
 * more stays within a server's PING budget (shorter ones are raised to 100 ms).
 */
export interface KeepaliveOptions {
  /** Silence before a PING, ms (at least 100). */
  intervalMs: number;
  /** How long the PING may stay unanswered, ms (default 20 000). */
  timeoutMs?: number;
}

/** The shortest keep-alive interval: the default PING budget of a server is one per 100 ms (§9). */
export const MIN_KEEPALIVE_INTERVAL_MS = 100;
const KEEPALIVE_DATA = new TextEncoder().encode("keepaliv");

/** Options of a {@link Channel}. */
export interface ChannelOptions {
  /** Opens a byte stream to the server. */
  dial: Dialer;
  /** Our settings (what the server may send us). */
  settings?: Partial<Settings>;
  /** Local flood budgets. */
  limits?: Partial<Limits>;
  /** Reconnection backoff. */
  backoff?: Partial<BackoffOptions>;
  /** Memory for incomplete split responses (default: the process-wide 1 GiB budget). */
  memoryBudget?: MemoryBudget;
  /** Compresses every call's request messages (§15) unless a call says otherwise. */
  compression?: Compression;
  /**
   * Encoders and decoders for `compression`: `webCodecs` (`@topspin/topspin/compression`) in
   * browsers, `nodeCodecs` (`connect` in Node passes it). Without them nothing can be compressed.
   */
  codecs?: Codecs;
  /** PINGs on a silent connection, closing it when they go unanswered (off by default). */
  keepalive?: KeepaliveOptions;
  /**
   * The bound on bytes queued for sending and not yet taken by the network (protocol.md §7:
   * output the peer does not read), in bytes; default 4 MiB (as the Node server), 0: none. It
   * counts the engine's queued frames and the transport's buffer (`socket.writableLength`, a
   * WebSocket's `bufferedAmount`). Past it, nothing new is queued until the output drained below
   * half the bound: a request stream's `send` (and so the pulling of a client-streaming or bidi
   * request iterable) waits, and a call start waits too — for room, its `timeoutMs`
   * (`DEADLINE_EXCEEDED`) or its `signal` (`CANCELLED`), like a start waiting for a
   * MAX_CONCURRENT_CALLS slot. One message may go past the bound (it is queued whole), so the
   * queued bytes stay at most the bound plus one message and its frame headers.
   */
  maxSendBuffer?: number;
  /**
   * Interceptors of every call made through the channel with the typed clients (`createClient`)
   * and the raw call functions (`unaryCall`, …), the first outermost. `start` (the call handle)
   * is not intercepted.
   */
  interceptors?: Interceptor[];
}

/** The default {@link ChannelOptions.maxSendBuffer}: 4 MiB. */
export const DEFAULT_MAX_SEND_BUFFER = 4 << 20;

const NO_CODECS: Codecs = { encoders: {}, decoders: {} };

/** Normalises request metadata. */
export function toMetadata(h: Metadata | Record<string, string> | undefined): Metadata {
  if (h === undefined) return [];
  if (Array.isArray(h)) return h;
  return Object.entries(h).map(([key, value]) => ({ key: key.toLowerCase(), value }));
}

interface Live {
  engine: Connection;
  driver: Driver;
  calls: Map<number, ClientCall>;
  ready: Promise<void>;
  /** Calls waiting for room under MAX_CONCURRENT_CALLS. */
  slotWaiters: (() => void)[];
  /** Stops the keep-alive timers. */
  stopKeepalive: () => void;
}

type Timer = ReturnType<typeof setTimeout>;
/** Lets Node exit while only this timer is left (no-op in browsers). */
function unref(t: Timer): Timer {
  (t as { unref?: () => void }).unref?.();
  return t;
}

/**
 * Runs keep-alive on one connection: a tick every interval; a tick that finds no read since the
 * last one sends a PING, and a PING after which nothing was read for `timeoutMs` closes the
 * connection. Returns the function that stops it.
 */
function startKeepalive(driver: Driver, opts: KeepaliveOptions): () => void {
  const interval = Math.max(MIN_KEEPALIVE_INTERVAL_MS, opts.intervalMs);
  const timeout = opts.timeoutMs ?? 20_000;
  let seen = driver.reads;
  let waiting: Timer | undefined;
  const tick = unref(
    setInterval(() => {
      if (driver.engine.closed) return stop();
      if (driver.reads !== seen) {
        // something arrived (the PING's answer or anything else): the peer is alive
        seen = driver.reads;
        clearTimeout(waiting);
        waiting = undefined;
        return;
      }
      if (waiting !== undefined) return; // our PING is out and nothing came yet
      driver.engine.ping(KEEPALIVE_DATA);
      driver.pump();
      waiting = unref(
        setTimeout(() => {
          waiting = undefined;
          if (driver.reads !== seen) return; // alive: the next tick sees it
          driver.engine.abort(ErrorCode.TIMEOUT, `keep-alive PING unanswered for ${timeout} ms`);
          driver.pump();
        }, timeout),
      );
    }, interval),
  );
  function stop(): void {
    clearInterval(tick);
    clearTimeout(waiting);
  }
  return stop;
}

/** One call in progress (the raw, bytes-level API under the typed clients). */
export class ClientCall {
  /** Response messages, in order; ends with the call (throws its error). */
  readonly messages = new AsyncQueue<Uint8Array>();
  /** Response headers, once they arrived (empty if the server sent none). */
  headers: Metadata = [];
  /** Trailers, once the call ended. */
  trailers: Metadata = [];
  /** The final error, or null while open / after OK. */
  error: TopspinError | null = null;
  /** Whether the call is over. */
  done = false;
  private readonly endWaiters: (() => void)[] = [];
  private writeWaiter: (() => void) | null = null;
  private cleanup: (() => void)[] = [];
  private headersSeen = false;
  /** Set once the CALL is out. */
  live: Live | null = null;
  id = 0;
  /** @internal Compresses request messages, when the call does. */
  encoder: Encoder | null = null;
  /** @internal Decoders the call accepts responses in (null: it accepts none). */
  decoders: Codecs["decoders"] | null = null;
  /** Decodes responses, once HEADERS named an encoding. */
  private decoder: Decoder | null = null;

  constructor(private readonly opts: CallOptions) {}

  /** @internal */
  onEvent(e: Event): void {
    switch (e.type) {
      case "Headers": {
        this.headers = e.metadata;
        this.headersSeen = true;
        const enc = e.metadata.find((m) => m.key === ENCODING_KEY)?.value;
        if (typeof enc === "string" && enc !== "identity") {
          const d = this.decoders?.[enc];
          if (d === undefined) {
            this.cancel(Code.INTERNAL, `the server compresses with ${enc}, which this call did not accept`);
            return;
          }
          this.decoder = d;
        }
        this.opts.onHeader?.(e.metadata);
        break;
      }
      case "Message":
        if (!this.headersSeen) {
          this.headersSeen = true;
          this.opts.onHeader?.([]);
        }
        this.messages.push(e.message);
        this.pendingCredit.push(e.creditDue);
        break;
      case "Ended":
        this.trailers = e.trailers;
        if (e.code === 0) {
          this.opts.onTrailer?.(e.trailers);
          this.finish(null);
        } else {
          // The response headers that came before the failing END stay with it (§5.4).
          this.finish(new TopspinError(e.code, e.message, e.trailers, { headers: this.headers }));
        }
        break;
      case "Writable":
        this.wakeWriter();
        break;
      default:
        break;
    }
  }

  /** Credit owed per queued message, granted as the application reads them. */
  private readonly pendingCredit: number[] = [];

  private wakeWriter(): void {
    const w = this.writeWaiter;
    this.writeWaiter = null;
    if (w) w();
  }

  /** @internal Ends the call locally or on the server's word. */
  finish(err: TopspinError | null): void {
    if (this.done) return;
    this.done = true;
    this.error = err;
    if (this.live) this.live.calls.delete(this.id);
    for (const c of this.cleanup) c();
    this.cleanup = [];
    if (err) this.messages.end(err);
    else this.messages.end();
    this.wakeWriter();
    for (const w of this.endWaiters.splice(0)) w();
    if (this.live) {
      const s = this.live.slotWaiters.shift();
      if (s) s();
    }
  }

  /** @internal */
  onCleanup(f: () => void): void {
    this.cleanup.push(f);
  }

  /** Cancels the call with `code` (CANCEL on the wire when it is open). */
  cancel(code: Code = Code.CANCELLED, message = "cancelled by the caller"): void {
    if (this.done) return;
    if (this.live) {
      this.live.engine.cancel(this.id, code);
      this.live.driver.pump();
    }
    this.finish(new TopspinError(code, message, [], { headers: this.headers }));
  }

  /** Sends one request message; waits for send credit. */
  async send(message: Uint8Array, endStream = false): Promise<void> {
    if (this.encoder !== null && !this.done) {
      try {
        message = await encodeMessage(message, this.encoder);
      } catch (e) {
        const err = TopspinError.from(e, Code.INTERNAL);
        this.cancel(err.code, `compressing a request message: ${err.rawMessage}`);
        throw err;
      }
    }
    for (;;) {
      if (this.done) throw this.error ?? new TopspinError(Code.INTERNAL, "send on a finished call");
      const live = this.live as Live;
      if (live.driver.full) {
        // The transport is not taking our bytes (§7): queue nothing more until it drained.
        // The call's end (cancel, deadline, the server) stops the wait too.
        await Promise.race([live.driver.room(), new Promise<void>((r) => (this.writeWaiter = r))]);
        continue;
      }
      let ok: boolean;
      try {
        ok = live.engine.sendMessage(this.id, message, endStream);
      } catch (e) {
        const err = TopspinError.from(e, Code.INTERNAL);
        this.cancel(err.code, err.rawMessage);
        throw err;
      }
      if (ok) {
        live.driver.pump();
        return;
      }
      await new Promise<void>((r) => (this.writeWaiter = r));
    }
  }

  /** No more request messages. */
  halfClose(): void {
    if (this.done || !this.live) return;
    this.live.engine.halfClose(this.id);
    this.live.driver.pump();
  }

  /** The next response message, or `undefined` at the end; throws the call's error. */
  async receive(): Promise<Uint8Array | undefined> {
    const r = await this.messages.next();
    if (r.done) return undefined;
    const due = this.pendingCredit.shift();
    if (due !== undefined && this.live && !this.done) {
      this.live.engine.consumed(this.id, due);
      this.live.driver.pump();
    }
    if (this.decoder === null) return r.value;
    try {
      return await decodeMessage(r.value, this.decoder, this.live?.engine.local.maxMessageSize ?? 0);
    } catch (e) {
      const err = TopspinError.from(e, Code.INTERNAL);
      this.cancel(err.code, err.rawMessage);
      throw err;
    }
  }

  /** Waits for the call's end; throws its error. */
  async end(): Promise<void> {
    if (!this.done) await new Promise<void>((r) => this.endWaiters.push(r));
    if (this.error) throw this.error;
  }
}

/** A client connection to one server, opened on first use and reopened when lost. */
export class Channel {
  private live: Live | null = null;
  private connecting: Promise<Live> | null = null;
  private failures = 0;
  private nextAttempt = 0;
  private closedForGood = false;
  private readonly backoff: BackoffOptions;
  /** The interceptors of the typed clients' and raw call functions' calls (the first outermost). */
  readonly interceptors: readonly Interceptor[];

  constructor(private readonly options: ChannelOptions) {
    this.interceptors = options.interceptors ?? [];
    this.backoff = { initialMs: 100, maxMs: 5000, multiplier: 1.6, jitter: 0.2, ...options.backoff };
  }

  /** Starts a call (raw bytes, `codec` 0 protobuf, 1 raw, 2 JSON). */
  async start(method: string, opts: CallOptions = {}, codec = 0): Promise<ClientCall> {
    const call = new ClientCall(opts);
    let headers = toMetadata(opts.headers);
    const compression = opts.compression ?? this.options.compression;
    if (compression !== undefined && compression !== "identity") {
      const codecs = this.options.codecs ?? NO_CODECS;
      const encoder = codecs.encoders[compression];
      if (encoder === undefined) throw new TopspinError(Code.UNIMPLEMENTED, `no ${compression} encoder here (codecs can send: ${Object.keys(codecs.encoders).join(", ") || "none"})`);
      call.encoder = encoder;
      call.decoders = codecs.decoders;
      headers = [...headers, { key: ENCODING_KEY, value: compression }, { key: ACCEPT_ENCODING_KEY, value: acceptList(codecs) }];
    }
    const deadline = opts.timeoutMs !== undefined ? Date.now() + opts.timeoutMs : undefined;
    let gate: ((e: TopspinError) => void) | null = null;
    const stop = (err: TopspinError): void => {
      if (call.live) call.cancel(err.code, err.rawMessage);
      else if (gate) gate(err);
      else call.finish(err);
    };
    if (opts.signal) {
      const signal = opts.signal;
      if (signal.aborted) throw new TopspinError(Code.CANCELLED, "the call was aborted before it started");
      const onAbort = (): void => stop(new TopspinError(Code.CANCELLED, "the call was aborted"));
      signal.addEventListener("abort", onAbort, { once: true });
      call.onCleanup(() => signal.removeEventListener("abort", onAbort));
    }
    if (deadline !== undefined) {
      const t = setTimeout(() => stop(new TopspinError(Code.DEADLINE_EXCEEDED, `deadline of ${opts.timeoutMs} ms exceeded`)), Math.max(0, deadline - Date.now()));
      call.onCleanup(() => clearTimeout(t));
    }
    const gated = new Promise<never>((_, reject) => (gate = reject));
    gated.catch(() => undefined);
    try {
      for (;;) {
        const live = await Promise.race([this.getLive(), gated]);
        if (live.driver.full && !live.engine.closed) {
          // The output is full (§7): wait for room, the deadline or the signal.
          await Promise.race([live.driver.room(), gated]);
          continue;
        }
        if (live.engine.canStartCall()) {
          let timeoutUs = 0n;
          if (deadline !== undefined) {
            const left = deadline - Date.now();
            if (left <= 0) throw new TopspinError(Code.DEADLINE_EXCEEDED, `deadline of ${opts.timeoutMs} ms exceeded`);
            timeoutUs = BigInt(Math.ceil(left * 1000));
          }
          call.id = live.engine.startCall(method, codec, timeoutUs, headers);
          call.live = live;
          gate = null;
          live.calls.set(call.id, call);
          live.driver.pump();
          return call;
        }
        if (live.engine.refusesCalls) {
          if (live.engine.goingAway || live.engine.closed) {
            if (this.live === live) this.live = null;
            continue;
          }
          throw new TopspinError(Code.UNAVAILABLE, "the server takes no calls (MAX_CONCURRENT_CALLS 0)");
        }
        await Promise.race([new Promise<void>((r) => live.slotWaiters.push(r)), gated]);
      }
    } catch (e) {
      const err = TopspinError.from(e, Code.UNAVAILABLE);
      call.finish(err);
      throw err;
    }
  }

  /** Closes the channel: GOAWAY, then the connection closes when its calls are done. */
  close(): void {
    this.closedForGood = true;
    const live = this.live;
    this.live = null;
    if (live) {
      live.engine.goAway(0, "client closing");
      live.driver.pump();
      if (live.calls.size === 0) live.driver.close();
    }
  }

  private getLive(): Promise<Live> {
    if (this.closedForGood) return Promise.reject(new TopspinError(Code.UNAVAILABLE, "the channel is closed"));
    if (this.live && !this.live.engine.closed && !this.live.engine.goingAway) return this.live.ready.then(() => this.live ?? this.getLive());
    if (!this.connecting) {
      this.connecting = this.connect().finally(() => (this.connecting = null));
    }
    return this.connecting;
  }

  private async connect(): Promise<Live> {
    const wait = this.nextAttempt - Date.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    let io;
    try {
      io = await this.options.dial();
    } catch (e) {
      this.failed();
      throw TopspinError.from(e, Code.UNAVAILABLE);
    }
    const engine = new Connection("client", { settings: this.options.settings, limits: this.options.limits, memoryBudget: this.options.memoryBudget });
    let established!: () => void;
    let lost!: (e: TopspinError) => void;
    const ready = new Promise<void>((res, rej) => {
      established = res;
      lost = rej;
    });
    ready.catch(() => undefined);
    const live: Live = { engine, driver: null as unknown as Driver, calls: new Map(), ready, slotWaiters: [], stopKeepalive: () => undefined };
    live.driver = new Driver(
      engine,
      io,
      (e) => {
      switch (e.type) {
        case "Established":
          this.failures = 0;
          established();
          break;
        case "GoAway":
          if (this.live === live) this.live = null;
          for (const w of live.slotWaiters.splice(0)) w();
          break;
        case "Closed":
          live.stopKeepalive();
          if (this.live === live) this.live = null;
          if (e.error !== null || !engine.established) this.failed();
          lost(new TopspinError(Code.UNAVAILABLE, `connection lost: ${e.reason}`));
          for (const c of [...live.calls.values()]) c.finish(new TopspinError(Code.UNAVAILABLE, `connection lost: ${e.reason}`));
          for (const w of live.slotWaiters.splice(0)) w();
          break;
        default:
          if ("callId" in e) live.calls.get(e.callId)?.onEvent(e);
          if (live.engine.goingAway && live.calls.size === 0 && this.live !== live) live.driver.close();
      }
    },
      this.options.maxSendBuffer ?? DEFAULT_MAX_SEND_BUFFER,
      false, // a client never stops reading (see Driver)
    );
    if (this.options.keepalive !== undefined) live.stopKeepalive = startKeepalive(live.driver, this.options.keepalive);
    this.live = live;
    await ready;
    return live;
  }

  private failed(): void {
    const b = this.backoff;
    const d = Math.min(b.maxMs, b.initialMs * Math.pow(b.multiplier, this.failures));
    this.failures++;
    this.nextAttempt = Date.now() + d * (1 - b.jitter + Math.random() * 2 * b.jitter);
  }
}
