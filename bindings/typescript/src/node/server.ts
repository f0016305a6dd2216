/**
 * A topspin server for Node over TCP, Unix sockets and WebSocket (`ws://`, §14.2, through the
 * `ws` package): handlers for the four call kinds, typed from protobuf-es service descriptors,
 * with deadlines, cancellation (an `AbortSignal` per call), metadata and graceful shutdown
 * (GOAWAY).
 * @module
 */
import * as net from "node:net";
import { createServer as createHttpServer, type IncomingMessage } from "node:http";
import type { Duplex as NodeDuplex } from "node:stream";
import { WebSocketServer, type WebSocket } from "ws";
import { create, fromBinary, toBinary, type DescMessage, type DescMethod, type DescService, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { Connection, type Event, type Limits, type MemoryBudget } from "../connection.js";
import { Driver } from "../driver.js";
import { ErrorCode, type Metadata, type Settings } from "../frame.js";
import { MIN_KEEPALIVE_INTERVAL_MS, type KeepaliveOptions } from "../channel.js";
import { Liveness, type LivenessBounds } from "./liveness.js";
import { listenUnix, removeIfOurs } from "./unix.js";
import { AsyncQueue } from "../queue.js";
import { Code, DETAILS_KEY, TopspinError } from "../status.js";
import { methodPath } from "../client.js";
import { parseAddress, socketDuplex } from "./net.js";
import { HeldDuplex, WS_SUBPROTOCOL, sendAsMessages, type Duplex } from "../transport.js";
import { ACCEPT_ENCODING_KEY, ENCODING_KEY, acceptList, accepts, type Codecs, type Compression } from "../compression.js";
import { nodeServerCodecs } from "./gzip.js";
import { GrpcFace, loadGrpc } from "./grpc-face.js";
import { refuseGrpc, sniff, type Face } from "./sniff.js";
import { Health, HealthService } from "./health.js";
import { DescriptorIndex, REFLECTION_SERVICES, TopspinReflection, grpcReflectionV1Impl, grpcReflectionV1alphaImpl, grpcV1, grpcV1alpha, topspinReflectionImpl } from "./reflection.js";
import { processMemoryBudget } from "../connection.js";
import { DEFAULT_SETTINGS } from "../frame.js";
import type { Interceptor, MethodKind } from "../interceptor.js";
import { interceptRoute } from "./server-interceptor.js";
import { callIO, handlerContext, metadataValue, runHandler, type CallIO, type CallSetup, type ServerCall } from "./server-call.js";

/** What a handler knows about its call, and what it can set. */
export interface HandlerContext {
  /** The full method name. */
  readonly method: string;
  /** The request metadata. */
  readonly requestHeaders: Metadata;
  /** Aborted when the client cancels, the deadline passes or the connection is lost. */
  readonly signal: AbortSignal;
  /** The deadline (ms since the epoch), if the client set one. */
  readonly deadline: number | undefined;
  /** Response headers: add entries before the first response message. */
  readonly responseHeaders: Metadata;
  /** Trailers, sent with the status. */
  readonly responseTrailers: Metadata;
}

export type { MethodKind } from "../interceptor.js";

/** A handler on raw request and response values (`decode`/`encode` turn bytes into them). */
export interface Route {
  kind: MethodKind;
  decode: (b: Uint8Array) => unknown;
  encode: (v: unknown) => Uint8Array;
  handler: (input: unknown, ctx: HandlerContext) => unknown;
  /** The method's descriptor, shown to interceptors (`server.service` sets it). */
  descriptor?: DescMethod;
}

type In<D extends DescMessage> = MessageShape<D>;
type OutInit<D extends DescMessage> = MessageInitShape<D>;

/** The implementation of one method, by its kind. */
export type ImplMethod<M> = M extends { methodKind: "unary"; input: infer I extends DescMessage; output: infer O extends DescMessage }
  ? (request: In<I>, ctx: HandlerContext) => Promise<OutInit<O>> | OutInit<O>
  : M extends { methodKind: "server_streaming"; input: infer I extends DescMessage; output: infer O extends DescMessage }
    ? (request: In<I>, ctx: HandlerContext) => AsyncIterable<OutInit<O>>
    : M extends { methodKind: "client_streaming"; input: infer I extends DescMessage; output: infer O extends DescMessage }
      ? (requests: AsyncIterable<In<I>>, ctx: HandlerContext) => Promise<OutInit<O>>
      : M extends { methodKind: "bidi_streaming"; input: infer I extends DescMessage; output: infer O extends DescMessage }
        ? (requests: AsyncIterable<In<I>>, ctx: HandlerContext) => AsyncIterable<OutInit<O>>
        : never;

/** An implementation of a service: one function per method, by `localName`. */
export type ServiceImpl<S extends DescService> = { [K in keyof S["method"]]: ImplMethod<S["method"][K]> };

/** Options of a {@link Server}. */
export interface ServerOptions {
  /** Our settings (what clients may send). */
  settings?: Partial<Settings>;
  /** Local flood budgets. */
  limits?: Partial<Limits>;
  /**
   * Compresses responses with this encoding (§15) for clients that list it in
   * `topspin-accept-encoding`. Requests are decoded per their own `topspin-encoding` either way.
   */
  compression?: Compression;
  /** Memory for incomplete split requests, shared by the connections (default: the process-wide 1 GiB budget). */
  memoryBudget?: MemoryBudget;
  /**
   * Encoders and decoders (default: `nodeServerCodecs`: gzip both ways; `nodeCodecs` decodes
   * zstd requests too — only from trusted clients, see the README's "Server bounds").
   */
  codecs?: Codecs;
  /** WebSocket listeners (`ws://` addresses). */
  webSocket?: WebSocketServerOptions;
  /**
   * Bound on the bytes produced for one connection and not yet written to it (§7, "output a peer
   * does not read"; default 4 MiB). While it is reached the server stops reading from that
   * connection, starts no handler and makes handlers' sends wait; what it may pass by is one
   * message.
   */
  maxSendBuffer?: number;
  /**
   * A connection must send its preface and SETTINGS within this long of being accepted, else it
   * is closed with ERROR `TIMEOUT` (§2; default 10 000 ms, 0: none).
   */
  handshakeTimeoutMs?: number;
  /**
   * A frame that started to arrive must be complete within this long, else the connection is
   * closed with ERROR `TIMEOUT` (default 30 000 ms, 0: none). The time stops while the server
   * itself stopped reading (`maxSendBuffer`).
   */
  frameTimeoutMs?: number;
  /**
   * A connection without calls for this long, counted from the end of its last call or its
   * handshake (PINGs and other frames that are not calls do not count), gets a GOAWAY
   * ("idle timeout") and is closed (default 3 600 000 ms: one hour, 0: none).
   */
  idleTimeoutMs?: number;
  /**
   * A connection whose peer takes none of the bytes waiting for it for this long (a client that
   * stopped reading) is closed at once, its calls cancelled and its unsent bytes dropped (the
   * Rust server's `write_timeout`; default 60 000 ms, 0: none). Native TCP, Unix and `ws://`.
   */
  writeTimeoutMs?: number;
  /**
   * Keep-alive: after `intervalMs` of silence (at least 100) the server sends a PING; when
   * nothing arrives within `timeoutMs` (default 20 000) after it, the connection is closed with
   * ERROR `TIMEOUT`. Off by default.
   */
  keepalive?: KeepaliveOptions;
  /**
   * Connections open at once (default 10 000). One more gets the preface, SETTINGS and, once its
   * first call arrives (or after a second), an ERROR naming `max_connections (N) reached`, and
   * is closed; open connections are not affected.
   */
  maxConnections?: number;
  /** Permission bits of a `unix://` socket file (default 0o660). */
  unixSocketMode?: number;
  /**
   * The gRPC face (default: on): `tcp://` and `unix://` listeners also answer gRPC clients over
   * HTTP/2 with prior knowledge (h2c), told apart by their first byte, with the same handlers
   * and bounds (`@grpc/grpc-js` does HTTP/2 and gRPC). `false`: native topspin only, no sniffing.
   */
  grpc?: boolean;
  /**
   * Interceptors of every call (the first outermost), on every face: native TCP/Unix, WebSocket
   * and gRPC run the same wrapped handler, so the chain runs once per call. Registered routes
   * (`route`, `service`, health, reflection) are wrapped as they are added.
   */
  interceptors?: Interceptor[];
}

/** The defaults of the server's bounds (the Rust server's `Config` defaults). */
export const SERVER_DEFAULTS = Object.freeze({
  handshakeTimeoutMs: 10_000,
  frameTimeoutMs: 30_000,
  idleTimeoutMs: 3_600_000,
  writeTimeoutMs: 60_000,
  maxConnections: 10_000,
  maxSendBuffer: 4 << 20,
  unixSocketMode: 0o660,
});

/** Options of the WebSocket listeners (§14.2). */
export interface WebSocketServerOptions {
  /**
   * Origins (`https://app.example.com`, exactly as browsers send them) whose pages may connect
   * besides the server's own. By default an upgrade whose `Origin` is not same-origin with its
   * `Host` header (host and port) is refused with 403, so that no other web page can use a
   * visitor's browser to call this server (cross-site WebSocket hijacking). Requests without
   * `Origin` (not from a browser) pass. `"*"`: every origin (the opt-out, for a public API that
   * authenticates each call itself).
   */
  allowedOrigins?: string[] | "*";
  /**
   * Largest WebSocket message (and frame) accepted, bytes (default 4 MiB, at least 256 KiB);
   * a larger one closes the connection with 1009. This bounds what one message makes us buffer.
   */
  maxMessageBytes?: number;
}

/**
 * Whether a WebSocket upgrade with this `Origin` may go on: none (not a browser), listed in
 * `allowed` (or `allowed` is `"*"`), or same-origin with the request's `Host`: the same host
 * name (case-insensitive) and port, a missing port being the default of the origin's scheme.
 * `Origin: null` (sandboxed pages, files) is same-origin with nothing.
 */
export function originAllowed(origin: string | undefined, host: string | undefined, allowed: string[] | "*" | undefined): boolean {
  if (origin === undefined || allowed === "*" || (allowed?.includes(origin) ?? false)) return true;
  if (host === undefined || origin === "null") return false;
  let o: URL;
  let h: URL;
  try {
    o = new URL(origin);
    h = new URL(`${o.protocol}//${host}`);
  } catch {
    return false;
  }
  if (o.protocol !== "http:" && o.protocol !== "https:") return false;
  // URL drops a port that is the scheme's default, from both alike.
  return o.hostname.toLowerCase() === h.hostname.toLowerCase() && o.port === h.port && h.pathname === "/" && h.username === "";
}

/** Answers an upgrade request with an HTTP error and closes the socket. */
function refuseUpgrade(socket: NodeDuplex, status: number, reason: string, body: string): void {
  socket.end(`HTTP/1.1 ${status} ${reason}\r\nconnection: close\r\ncontent-type: text/plain\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
}

/**
 * How long a WebSocket the server closes waits for the peer's close frame before its socket is
 * destroyed (as the Rust server): a peer that never answers is not held for the `ws` package's
 * own 30 s close timeout.
 */
const WS_CLOSE_GRACE_MS = 1000;

/**
 * Closes `ws` with `code`, and destroys its socket if the peer has not answered within the grace
 * — counted from when the peer stops taking what is still being sent to it (a slow reader gets
 * the end of its data).
 */
function closeWebSocket(ws: WebSocket, code: number, reason?: string): void {
  ws.close(code, reason);
  let pending = ws.bufferedAmount;
  const check = (): void => {
    if (ws.readyState === ws.CLOSED) return;
    if (ws.bufferedAmount > 0 && ws.bufferedAmount < pending) {
      pending = ws.bufferedAmount;
      setTimeout(check, WS_CLOSE_GRACE_MS).unref();
      return;
    }
    ws.terminate();
  };
  setTimeout(check, WS_CLOSE_GRACE_MS).unref();
}

/** Wraps a server-side WebSocket (the `ws` package) as a {@link Duplex}: binary messages carry the stream. */
function webSocketDuplex(ws: WebSocket): Duplex {
  const d = new HeldDuplex(
    (chunks) => {
      if (ws.readyState === ws.OPEN) sendAsMessages(chunks, (m) => ws.send(m, { binary: true }));
    },
    () => closeWebSocket(ws, 1000),
    { pending: () => ws.bufferedAmount, pause: () => ws.pause(), resume: () => ws.resume(), abort: () => ws.terminate() },
  );
  let why = "the peer closed the connection";
  ws.on("message", (data, isBinary) => {
    if (!isBinary) {
      closeWebSocket(ws, 1003, "text messages are not topspin");
      return;
    }
    if (Array.isArray(data)) for (const b of data) d.deliver(b);
    else d.deliver(data instanceof ArrayBuffer ? new Uint8Array(data) : data);
  });
  ws.on("error", (e) => (why = e.message));
  ws.on("close", (code, reason) => d.end(code === 1000 || code === 1005 ? why : `WebSocket closed (${code}${reason.length > 0 ? " " + reason.toString() : ""})`));
  return d;
}

/** What of a WebSocket message is held before it is charged to the memory budget (as Rust). */
const WS_UNCHARGED = 64 * 1024;

/**
 * What the `ws` package holds of a message not yet complete: the bytes buffered and not parsed
 * plus the fragments received (its receiver's `_bufferedBytes` and `_messageLength`, internal
 * fields of ws 8; when absent, the bytes read since the last complete frame, at most one read
 * more than held).
 */
function wsHeld(ws: WebSocket, sinceComplete: number): number {
  const r = (ws as unknown as { _receiver?: { _bufferedBytes?: unknown; _messageLength?: unknown } })._receiver;
  if (typeof r?._bufferedBytes === "number" && typeof r._messageLength === "number") return r._bufferedBytes + r._messageLength;
  return sinceComplete;
}

/**
 * Bounds what a WebSocket peer makes us hold of a message that has not arrived whole (as the
 * Rust server): past 64 KiB it is charged to `budget` as it grows (given back when the message
 * completes or the connection closes); while less than a quarter of the budget is left such a
 * connection is not read (the last quarter stays for calls); a message (or control frame) that
 * started must complete within `frameMs`, else the connection is closed with 1008 — not counted
 * while the server itself stopped reading it (its output is full: `maxSendBuffer`).
 */
function guardWebSocketInput(ws: WebSocket, socket: NodeDuplex, budget: MemoryBudget, frameMs: number): void {
  let since = 0; // bytes read since the last complete frame (the fallback of wsHeld)
  let completed = false;
  let charged = 0;
  let startedAt = 0;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let starved = false; // we paused reading for the budget
  let unsubscribe: (() => void) | null = null;
  const charge = (held: number): void => {
    const want = held > WS_UNCHARGED ? held : 0;
    if (want > charged) budget.reserve(want - charged);
    else if (want < charged) budget.release(charged - want);
    charged = want;
  };
  const lowOnMemory = (): boolean => budget.limit - budget.used < budget.limit / 4;
  const feed = (): void => {
    if (!starved || lowOnMemory()) return;
    starved = false;
    unsubscribe?.();
    unsubscribe = null;
    ws.resume();
  };
  const fire = (): void => {
    timer = undefined;
    if (startedAt === 0 || ws.readyState !== ws.OPEN) return;
    if (ws.isPaused && !starved) {
      // our own back-pressure, not the peer's stall: the time starts again when we read
      startedAt = Date.now();
      timer = setTimeout(fire, frameMs);
      return;
    }
    closeWebSocket(ws, 1008, `a WebSocket message stayed incomplete for ${frameMs} ms (frame_timeout)`);
  };
  const update = (): void => {
    const held = wsHeld(ws, since);
    charge(held);
    if (held === 0 || completed) {
      clearTimeout(timer);
      timer = undefined;
      startedAt = 0;
      completed = false;
    }
    if (held > 0 && startedAt === 0 && frameMs > 0) {
      startedAt = Date.now();
      timer = setTimeout(fire, frameMs);
    }
    if (charged > 0 && !starved && lowOnMemory()) {
      starved = true;
      ws.pause();
      unsubscribe = budget.subscribe(feed);
    }
  };
  const done = (): void => {
    since = 0;
    completed = true;
  };
  ws.on("message", done);
  ws.on("ping", done);
  ws.on("pong", done);
  // after ws's own listener (set before the upgrade's callback): what it holds once it parsed the read
  socket.on("data", (b: Buffer) => {
    since += b.length;
    update();
  });
  ws.on("close", () => {
    clearTimeout(timer);
    unsubscribe?.();
    charge(0);
  });
}

/** One connection being served. */
interface ServerConn {
  engine: Connection;
  driver: Driver;
  calls: Map<number, ServerCall>;
  live: Liveness | null;
}

/** Connections over `maxConnections` being told so at once (as Rust); more are closed without a word. */
const MAX_REFUSALS = 64;
/** How long a refused connection may take to send its first call (which then carries the reason). */
const REFUSAL_WAIT_MS = 1000;
/** Bytes read from a refused connection at most. */
const REFUSAL_READ_LIMIT = 64 * 1024;

/** A topspin server. */
export class Server {
  private readonly routes = new Map<string, Route>();
  private readonly servers: net.Server[] = [];
  private readonly conns = new Set<ServerConn>();
  /** Unix socket files bound, with their ids (removed on close if still ours). */
  private readonly unixFiles: { path: string; id: string | null }[] = [];
  private refusing = 0;
  private closing = false;
  /** Accepted sockets whose first byte has not arrived yet (they count toward `maxConnections`). */
  private sniffing = 0;
  private face: GrpcFace | null = null;
  private facePending: Promise<GrpcFace> | null = null;
  /** Services registered with {@link Server.service}, for reflection. */
  private readonly services: DescService[] = [];
  private index: DescriptorIndex | null = null;
  private healthTable: Health | null = null;

  private readonly codecs: Codecs;
  private readonly bounds: LivenessBounds;
  private readonly maxConnections: number;

  constructor(private readonly options: ServerOptions = {}) {
    this.codecs = options.codecs ?? nodeServerCodecs;
    const ka = options.keepalive;
    this.bounds = {
      handshakeMs: options.handshakeTimeoutMs ?? SERVER_DEFAULTS.handshakeTimeoutMs,
      frameMs: options.frameTimeoutMs ?? SERVER_DEFAULTS.frameTimeoutMs,
      idleMs: options.idleTimeoutMs ?? SERVER_DEFAULTS.idleTimeoutMs,
      writeMs: options.writeTimeoutMs ?? SERVER_DEFAULTS.writeTimeoutMs,
      keepalive: ka === undefined ? undefined : { intervalMs: Math.max(MIN_KEEPALIVE_INTERVAL_MS, ka.intervalMs), timeoutMs: ka.timeoutMs ?? 20_000 },
    };
    this.maxConnections = options.maxConnections ?? SERVER_DEFAULTS.maxConnections;
    if (options.compression !== undefined && this.codecs.encoders[options.compression] === undefined) {
      throw new TopspinError(Code.INVALID_ARGUMENT, `no ${options.compression} encoder in the server's codecs`);
    }
  }

  /** Adds a raw route for a full method name. */
  route(method: string, route: Route): this {
    route = interceptRoute(method, route, this.options.interceptors);
    this.routes.set(method, route);
    this.face?.register(method, route);
    return this;
  }

  /** Adds every method of a protobuf-es service. */
  service<S extends DescService>(service: S, impl: ServiceImpl<S>): this {
    const table = impl as unknown as Record<string, (input: unknown, ctx: HandlerContext) => unknown>;
    this.services.push(service);
    this.index = null;
    for (const m of service.methods) {
      const h = table[m.localName];
      if (typeof h !== "function") continue;
      const input = m.input;
      const output = m.output;
      this.route(methodPath(m), {
        kind: m.methodKind,
        decode: (b) => fromBinary(input, b),
        encode: (v) => toBinary(output, create(output, v as MessageInitShape<DescMessage>)),
        handler: h.bind(impl),
        descriptor: m,
      });
    }
    return this;
  }

  /**
   * Serves `grpc.health.v1.Health` (`Check`, `Watch`) on both faces and returns its status table:
   * `""` (the server as a whole) starts `SERVING`; set others with `setStatus`. `close()` turns
   * every status `NOT_SERVING` first and ends the open watches. Called again: the same table.
   */
  addHealth(): Health {
    if (this.healthTable === null) {
      this.healthTable = new Health();
      this.service(HealthService, this.healthTable.impl());
    }
    return this.healthTable;
  }

  /** The health table, if {@link Server.addHealth} was called. */
  get health(): Health | null {
    return this.healthTable;
  }

  /**
   * Serves reflection on both faces: `topspin.reflection.v1.Reflection` (the `topspin` CLI's
   * `list`, `describe`, `call`) and gRPC's `grpc.reflection.v1` and `v1alpha`
   * `ServerReflection` (grpcurl), describing every service registered with
   * {@link Server.service} (before or after this call) from its protobuf-es descriptors.
   */
  addReflection(): this {
    const index = (): DescriptorIndex => (this.index ??= new DescriptorIndex([...this.services, ...REFLECTION_SERVICES]));
    this.service(TopspinReflection, topspinReflectionImpl(index));
    this.service(grpcV1.ServerReflection, grpcReflectionV1Impl(index));
    this.service(grpcV1alpha.ServerReflection, grpcReflectionV1alphaImpl(index));
    return this;
  }

  /** Connections open: native (TCP, Unix, WebSocket) and gRPC. */
  private openConnections(): number {
    return this.conns.size + (this.face?.sockets.size ?? 0);
  }

  /** The gRPC face, made on the first `tcp://` or `unix://` listen (loads `@grpc/grpc-js`). */
  private async grpcFace(): Promise<GrpcFace> {
    if (this.face !== null) return this.face;
    this.facePending ??= loadGrpc().then((g) => {
      const o = this.options;
      const ka = this.bounds.keepalive;
      this.face = new GrpcFace(
        g,
        {
          maxMessageSize: o.settings?.maxMessageSize ?? DEFAULT_SETTINGS.maxMessageSize,
          maxConcurrentCalls: o.settings?.maxConcurrentCalls ?? DEFAULT_SETTINGS.maxConcurrentCalls,
          maxMetadataSize: o.settings?.maxMetadataSize ?? DEFAULT_SETTINGS.maxMetadataSize,
          idleMs: this.bounds.idleMs,
          keepaliveIntervalMs: ka?.intervalMs ?? 0,
          keepaliveTimeoutMs: ka?.timeoutMs ?? 20_000,
          budget: o.memoryBudget ?? processMemoryBudget,
          writeMs: this.bounds.writeMs,
          frameMs: this.bounds.frameMs,
          maxSendBuffer: o.maxSendBuffer ?? SERVER_DEFAULTS.maxSendBuffer,
        },
        this.routes,
      );
      return this.face;
    });
    return this.facePending;
  }

  /**
   * Listens on `tcp://host:port` (port 0: any), `unix:///path` or `ws://host:port/path`
   * (WebSocket, subprotocol `topspin.v1`, upgrades on that path only); resolves with the
   * address (the port filled in).
   */
  async listen(address: string): Promise<string> {
    const a = parseAddress(address);
    if (a.kind === "ws") return this.listenWebSocket(a.url);
    if (this.options.grpc !== false) await this.grpcFace();
    const srv = net.createServer((s) => this.accept(s));
    if (a.kind === "unix") {
      try {
        const id = await listenUnix(srv, a.path, this.options.unixSocketMode ?? SERVER_DEFAULTS.unixSocketMode);
        this.unixFiles.push({ path: a.path, id });
      } catch (e) {
        srv.close();
        throw e;
      }
      this.servers.push(srv);
      return address;
    }
    this.servers.push(srv);
    await new Promise<void>((resolve, reject) => {
      srv.once("error", reject);
      srv.listen(a.port, a.host, resolve);
    });
    const addr = srv.address();
    if (addr !== null && typeof addr === "object") return `tcp://${addr.family === "IPv6" ? `[${addr.address}]` : addr.address}:${addr.port}`;
    return address;
  }

  /**
   * Graceful shutdown: stops listening, sends GOAWAY on every connection, lets open calls finish
   * for up to `graceMs`, then closes what is left.
   */
  async close(graceMs = 5000): Promise<void> {
    this.closing = true;
    this.healthTable?.shutdown();
    this.healthTable?.endWatches();
    const face = this.face?.close(graceMs);
    for (const s of this.servers) s.close();
    for (const f of this.unixFiles.splice(0)) await removeIfOurs(f.path, f.id);
    for (const c of this.conns) {
      c.engine.goAway(0, "server shutting down");
      c.driver.pump();
      if (c.calls.size === 0) c.driver.close();
    }
    const until = Date.now() + graceMs;
    while ([...this.conns].some((c) => c.calls.size > 0) && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
    // driver.close() writes what the engine queued first: a call that ended in this turn has its
    // reply and END waiting for the driver's deferred flush.
    for (const c of this.conns) c.driver.close();
    this.conns.clear();
    await face;
  }

  /** A WebSocket listener (§14.2) on an HTTP/1.1 server of its own. */
  private async listenWebSocket(url: string): Promise<string> {
    const u = new URL(url);
    if (u.protocol !== "ws:") throw new TopspinError(Code.INVALID_ARGUMENT, `the Node server listens on ws:// (no TLS here), not ${url}`);
    const path = u.pathname === "" ? "/" : u.pathname;
    const host = u.hostname.startsWith("[") ? u.hostname.slice(1, -1) : u.hostname;
    const opts = this.options.webSocket ?? {};
    const wss = new WebSocketServer({
      noServer: true,
      maxPayload: Math.max(256 * 1024, opts.maxMessageBytes ?? 4 << 20),
      perMessageDeflate: false,
      handleProtocols: (offered) => (offered.has(WS_SUBPROTOCOL) ? WS_SUBPROTOCOL : false),
    });
    // The upgrade request is part of the handshake: its head (at most 16 KiB, Node's
    // maxHeaderSize) must arrive within handshakeTimeoutMs, checked every second at most.
    const hs = this.bounds.handshakeMs;
    const timeouts = hs > 0 ? { headersTimeout: hs, requestTimeout: hs, connectionsCheckingInterval: Math.min(1000, hs) } : {};
    const srv = createHttpServer({ maxHeaderSize: 16 * 1024, ...timeouts }, (_req, res) => {
      res.writeHead(426, { "content-type": "text/plain", upgrade: "websocket" }).end(`topspin over WebSocket (subprotocol ${WS_SUBPROTOCOL}): upgrade required\n`);
    });
    srv.on("upgrade", (req: IncomingMessage, socket: NodeDuplex, head: Buffer) => {
      socket.on("error", () => undefined);
      if (this.closing) return refuseUpgrade(socket, 503, "Service Unavailable", "shutting down\n");
      if (new URL(req.url ?? "/", "http://x").pathname !== path) return refuseUpgrade(socket, 404, "Not Found", `no topspin endpoint here (it is at ${path})\n`);
      const offered = (req.headers["sec-websocket-protocol"] ?? "").split(",").map((p) => p.trim());
      if (!offered.includes(WS_SUBPROTOCOL)) return refuseUpgrade(socket, 400, "Bad Request", `the ${WS_SUBPROTOCOL} subprotocol must be offered\n`);
      const origin = req.headers.origin;
      if (!originAllowed(origin, req.headers.host, opts.allowedOrigins)) {
        return refuseUpgrade(socket, 403, "Forbidden", `origin ${String(origin)} is not allowed (same-origin or webSocket.allowedOrigins only)\n`);
      }
      wss.handleUpgrade(req, socket, head, (ws) => {
        guardWebSocketInput(ws, socket, this.options.memoryBudget ?? processMemoryBudget, this.bounds.frameMs);
        if (this.openConnections() >= this.maxConnections) return this.refuse(webSocketDuplex(ws), () => ws.terminate());
        const entry = this.serve(webSocketDuplex(ws));
        ws.on("close", () => this.conns.delete(entry));
      });
    });
    this.servers.push(srv);
    await new Promise<void>((resolve, reject) => {
      srv.once("error", reject);
      srv.listen(Number(u.port === "" ? 80 : u.port), host, resolve);
    });
    const addr = srv.address() as net.AddressInfo;
    return `ws://${addr.family === "IPv6" ? `[${addr.address}]` : addr.address}:${addr.port}${path}`;
  }

  /**
   * A socket accepted on a `tcp://` or `unix://` listener. With the gRPC face on, its first byte
   * says which face serves it (read under the handshake timeout; a socket still silent then
   * goes native, whose handshake timer has run out). Sockets being sniffed count toward
   * `maxConnections`; one over it is refused by the face it speaks.
   */
  private accept(socket: net.Socket): void {
    socket.on("error", () => undefined);
    const acceptedAt = Date.now();
    const over = this.openConnections() + this.sniffing >= this.maxConnections;
    if (this.face === null) return over ? this.refuse(socketDuplex(socket), () => socket.destroy()) : this.serveSocket(socket, acceptedAt);
    if (over && this.refusing >= MAX_REFUSALS) return void socket.destroy();
    if (over) this.refusing++;
    else this.sniffing++;
    const hs = this.bounds.handshakeMs;
    void sniff(socket, over ? Math.min(REFUSAL_WAIT_MS, hs || REFUSAL_WAIT_MS) : hs, true).then((face) => {
      if (over) this.refusing--;
      else this.sniffing--;
      if (socket.destroyed) return;
      if (this.closing) return void socket.destroy();
      this.dispatch(socket, face, over, acceptedAt);
    });
  }

  /** Hands a sniffed socket to its face, or refuses it (over `maxConnections`). */
  private dispatch(socket: net.Socket, face: Face, over: boolean, acceptedAt: number): void {
    if (face === "stalled") return void socket.destroy(); // HTTP/2's handshake not done in time
    if (face === "grpc" && this.face !== null) {
      if (!over) return this.face.inject(socket);
      if (this.refusing >= MAX_REFUSALS) return void socket.destroy();
      this.refusing++;
      const why = `max_connections (${this.maxConnections}) reached: the server takes no more connections now; try again later`;
      return refuseGrpc(socket, why, REFUSAL_WAIT_MS, REFUSAL_READ_LIMIT, () => this.refusing--);
    }
    if (over) {
      this.refuse(socketDuplex(socket), () => socket.destroy());
      socket.resume();
      return;
    }
    this.serveSocket(socket, acceptedAt);
    socket.resume();
  }

  /** Serves a socket with the native protocol. */
  private serveSocket(socket: net.Socket, acceptedAt: number): void {
    const entry = this.serve(socketDuplex(socket), acceptedAt);
    socket.on("close", () => this.conns.delete(entry));
  }

  /** Runs a server connection over an accepted stream. */
  private serve(io: Duplex, acceptedAt = Date.now()): ServerConn {
    const engine = new Connection("server", { settings: this.options.settings, limits: this.options.limits, memoryBudget: this.options.memoryBudget });
    const calls = new Map<number, ServerCall>();
    const entry: ServerConn = { engine, driver: null as unknown as Driver, calls, live: null };
    this.conns.add(entry);
    entry.driver = new Driver(engine, io, (e) => this.onEvent(entry, e), this.options.maxSendBuffer ?? SERVER_DEFAULTS.maxSendBuffer);
    if (engine.closed) return entry;
    const live = new Liveness(entry.driver, this.bounds, () => calls.size === 0, () => {
      engine.goAway(ErrorCode.NO_ERROR, "idle timeout");
      entry.driver.close();
    }, acceptedAt);
    entry.live = live;
    entry.driver.onRead = () => live.onRead();
    entry.driver.onWrite = () => live.onWrite();
    return entry;
  }

  /**
   * Tells a connection over `maxConnections` why it is refused, then closes it (as Rust): it
   * gets the preface and SETTINGS, and once its first call arrives (so that the call fails with
   * the reason) or after a second, an ERROR naming the limit. No handler runs; it reads at most
   * 64 KiB; at most 64 are refused this way at once, more are closed at once (`drop`).
   */
  private refuse(io: Duplex, drop: () => void): void {
    if (this.refusing >= MAX_REFUSALS) return drop();
    this.refusing++;
    const engine = new Connection("server", { settings: this.options.settings, limits: this.options.limits, memoryBudget: this.options.memoryBudget });
    let read = 0;
    let told = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let driver: Driver | null = null;
    const tell = (): void => {
      if (told) return;
      told = true;
      clearTimeout(timer);
      engine.abort(ErrorCode.INTERNAL_ERROR, `max_connections (${this.maxConnections}) reached: the server takes no more connections now; try again later`);
      driver?.pump();
      setTimeout(drop, REFUSAL_WAIT_MS).unref(); // a peer that does not read our last bytes
    };
    driver = new Driver(engine, io, (e) => {
      if (e.type === "CallStarted") tell();
      else if (e.type === "Closed") {
        this.refusing--;
        tell();
      }
    });
    driver.onRead = (n) => {
      read += n;
      if (read > REFUSAL_READ_LIMIT) tell();
    };
    if (told) driver.pump();
    else timer = setTimeout(tell, Math.min(REFUSAL_WAIT_MS, this.bounds.handshakeMs || REFUSAL_WAIT_MS)).unref();
  }

  private onEvent(c: ServerConn, e: Event): void {
    switch (e.type) {
      case "Closed":
        c.live?.stop();
        return;
      case "CallStarted":
        this.startCall(c, e);
        return;
      case "Message": {
        const call = c.calls.get(e.callId);
        if (call) {
          call.input.push(e.message);
          call.credit.push(e.creditDue);
        }
        return;
      }
      case "HalfClosed":
        c.calls.get(e.callId)?.input.end();
        return;
      case "Cancelled": {
        const call = c.calls.get(e.callId);
        if (call) this.finish(c, call, new TopspinError(e.code, e.message));
        return;
      }
      case "Writable": {
        const call = c.calls.get(e.callId);
        const w = call?.writeWaiter;
        if (call && w) {
          call.writeWaiter = null;
          w();
        }
        return;
      }
      default:
        return;
    }
  }

  /** Ends the call's bookkeeping; `err` (an early end) aborts the handler's signal and input. */
  private finish(c: ServerConn, call: ServerCall, err: TopspinError | null): void {
    if (call.done) return;
    call.done = true;
    c.calls.delete(call.id);
    c.live?.callEnded();
    clearTimeout(call.timer);
    if (err !== null) {
      call.reason = err;
      call.abort?.abort(err);
      call.input.fail(err);
    }
    const w = call.writeWaiter;
    call.writeWaiter = null;
    if (w) w();
  }

  /** A call arrived: refused `UNIMPLEMENTED` (method, codec, encoding), or its handler runs. */
  private startCall(c: ServerConn, e: Extract<Event, { type: "CallStarted" }>): void {
    const { engine, driver } = c;
    const setup = this.callSetup(e);
    if ("refusal" in setup) {
      engine.endCall(e.callId, Code.UNIMPLEMENTED, setup.refusal, setup.trailers);
      driver.pump();
      return;
    }
    const call: ServerCall = { id: e.callId, input: new AsyncQueue(), credit: [], abort: null, reason: null, done: false, writeWaiter: null, timer: undefined };
    c.calls.set(call.id, call);
    const ctx = handlerContext(call, e, this.armDeadline(c, call, e.timeoutUs));
    const io = callIO(engine, driver, call, setup, ctx);
    runHandler(setup.route, io, ctx, driver, call).then(
      () => this.endCall(c, call, io, ctx, null),
      (err: unknown) => this.endCall(c, call, io, ctx, TopspinError.from(err)),
    );
  }

  /** The call's route and codecs (§15), or why it is refused (`UNIMPLEMENTED`) and the trailers saying so. */
  private callSetup(e: Extract<Event, { type: "CallStarted" }>): CallSetup | { refusal: string; trailers: Metadata } {
    const route = this.routes.get(e.method);
    if (route === undefined || e.codec !== 0) {
      return { refusal: route === undefined ? `unknown method ${e.method}` : `codec ${e.codec} is not supported for ${e.method}`, trailers: [] };
    }
    const reqEnc = metadataValue(e.metadata, ENCODING_KEY);
    const reqDecoder = reqEnc === undefined || reqEnc === "identity" ? null : this.codecs.decoders[reqEnc];
    if (reqDecoder === undefined) {
      const accepted = acceptList(this.codecs);
      return { refusal: `request encoding ${String(reqEnc)} is not supported; accepted: ${accepted}`, trailers: [{ key: ACCEPT_ENCODING_KEY, value: accepted }] };
    }
    const ours = this.options.compression;
    const respEncoder = ours !== undefined && accepts(metadataValue(e.metadata, ACCEPT_ENCODING_KEY), ours) ? (this.codecs.encoders[ours] ?? null) : null;
    return { route, reqDecoder, respEncoder, ours };
  }

  /** The call's deadline (ms since the epoch), if it has one: then it ends `DEADLINE_EXCEEDED` when it passes. */
  private armDeadline(c: ServerConn, call: ServerCall, timeoutUs: bigint): number | undefined {
    const timeoutMs = Number(timeoutUs) / 1000;
    const deadline = timeoutUs > 0n ? Date.now() + timeoutMs : undefined;
    if (deadline !== undefined) {
      call.timer = setTimeout(() => {
        if (call.done) return;
        c.engine.endCall(call.id, Code.DEADLINE_EXCEEDED, "deadline exceeded");
        this.finish(c, call, new TopspinError(Code.DEADLINE_EXCEEDED, "deadline exceeded"));
        c.driver.pump();
      }, Math.min(timeoutMs, 2 ** 31 - 1));
    }
    return deadline;
  }

  /**
   * The handler returned (`err` null: OK with the trailers) or threw `err`: END with its status,
   * after the response headers not sent yet and the error's own (§5.4) — unless they are over the
   * client's limit: then the END goes alone, as the Rust server's.
   */
  private endCall(c: ServerConn, call: ServerCall, io: CallIO, ctx: HandlerContext, err: TopspinError | null): void {
    if (call.done) return;
    try {
      io.sendHeaders(err?.headers);
    } catch {
      // over the client's metadata limit: not sent
    }
    if (err === null) c.engine.endCall(call.id, Code.OK, "", ctx.responseTrailers);
    else {
      const details = err.details !== undefined && !err.trailers.some((m) => m.key === DETAILS_KEY) ? [{ key: DETAILS_KEY, value: err.details }] : [];
      c.engine.endCall(call.id, err.code === Code.OK ? Code.UNKNOWN : err.code, err.rawMessage, [...ctx.responseTrailers, ...err.trailers, ...details]);
    }
    this.finish(c, call, null);
    c.driver.pump();
  }
}
