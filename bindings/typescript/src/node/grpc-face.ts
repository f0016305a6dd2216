/**
 * The Node server's gRPC face: gRPC clients (grpc-js, grpc-go, grpcurl, Kubernetes probes…)
 * over HTTP/2 with prior knowledge (h2c) on the server's own `tcp://` and `unix://` listeners,
 * told apart from native topspin by their first byte (`P` of `PRI * HTTP/2.0`, as the Rust
 * server does). HTTP/2 and gRPC framing are `@grpc/grpc-js`'s: each accepted socket is handed
 * to a grpc-js server through `createConnectionInjector`, and every registered route is
 * registered there with raw-bytes (de)serializers, so one set of handlers answers both faces.
 * @module
 */
import type * as grpc from "@grpc/grpc-js";
import type * as net from "node:net";
import type * as http2 from "node:http2";
import type { MemoryBudget } from "../connection.js";
import { grpcHandler, grpcHandlerType, type GrpcCallEnv } from "./grpc-calls.js";
import { ConnGuard } from "./grpc-guard.js";
import { inflateLater } from "./grpc-inflate.js";
import type { Route } from "./server.js";

/** The bounds the face is given, from the server's own options. */
export interface GrpcFaceBounds {
  /** One request (and response) message, bytes (the native `maxMessageSize`). */
  maxMessageSize: number;
  /** Request metadata, bytes (the native `maxMetadataSize`); the HTTP/2 header list may be 4 KiB more. */
  maxMetadataSize: number;
  /** Streams open at once on a connection (the native `maxConcurrentCalls`). */
  maxConcurrentCalls: number;
  /** A connection without calls for this long gets GOAWAY (0: none). */
  idleMs: number;
  /** PING after this long (0: off) and wait this long for the answer. */
  keepaliveIntervalMs: number;
  keepaliveTimeoutMs: number;
  /** Charged with large request messages while held; spent: new calls `RESOURCE_EXHAUSTED`. */
  budget: MemoryBudget;
  /** A peer that takes none of our bytes for this long is cut (0: none). */
  writeMs: number;
  /** A request message that stops arriving for this long while it is read is cut (0: none). */
  frameMs: number;
  /** Unsent bytes of a connection past which its new calls wait to start (0: none). */
  maxSendBuffer: number;
}

/** The HTTP/2 stream of a grpc-js server call (internal: the call's `call`, through its interceptors' `nextCall`). */
function streamOf(call: unknown): http2.ServerHttp2Stream | undefined {
  let c = (call as { call?: unknown }).call;
  for (let i = 0; i < 16 && typeof c === "object" && c !== null; i++) {
    const s = (c as { stream?: unknown }).stream;
    if (typeof s === "object" && s !== null) return s as http2.ServerHttp2Stream;
    c = (c as { nextCall?: unknown }).nextCall;
  }
  return undefined;
}

const identity = (b: Buffer): Buffer => b;

/** The grpc-js server options for these bounds. */
function grpcOptions(b: GrpcFaceBounds): grpc.ServerOptions {
  const o: grpc.ServerOptions = {
    "grpc.max_receive_message_length": b.maxMessageSize,
    "grpc.max_send_message_length": b.maxMessageSize,
    "grpc.max_concurrent_streams": b.maxConcurrentCalls,
    "grpc.enable_channelz": 0,
    // gzip and deflate requests inflated when their handler takes them, charged (grpc-inflate.ts)
    interceptors: [inflateLater],
  };
  if (b.idleMs > 0) o["grpc.max_connection_idle_ms"] = b.idleMs;
  if (b.keepaliveIntervalMs > 0) {
    o["grpc.keepalive_time_ms"] = b.keepaliveIntervalMs;
    o["grpc.keepalive_timeout_ms"] = b.keepaliveTimeoutMs;
  }
  return o;
}

/** Loads `@grpc/grpc-js` (only when a server has its gRPC face on). */
export async function loadGrpc(): Promise<typeof grpc> {
  try {
    return await import("@grpc/grpc-js");
  } catch (e) {
    throw new Error(`the gRPC face needs the @grpc/grpc-js package (npm install @grpc/grpc-js), or turn it off with new Server({ grpc: false }): ${String(e)}`);
  }
}

/** One grpc-js server fed with the sockets the listener sniffed as HTTP/2. */
export class GrpcFace {
  private readonly server: grpc.Server;
  private readonly injector: grpc.ConnectionInjector;
  private readonly env: GrpcCallEnv;
  /** Sockets handed over and not closed yet (they count toward `maxConnections`). */
  readonly sockets = new Set<net.Socket>();
  /** Calls open now. */
  calls = 0;
  /** The guard of the socket being handed to grpc-js (its HTTP/2 session is made meanwhile). */
  private injecting: ConnGuard | null = null;
  private readonly guards = new WeakMap<http2.Http2Session, ConnGuard>();

  constructor(
    g: typeof grpc,
    private readonly bounds: GrpcFaceBounds,
    routes: Map<string, Route>,
  ) {
    this.server = new g.Server(grpcOptions(bounds));
    this.env = {
      grpc: g,
      budget: bounds.budget,
      maxMessageSize: bounds.maxMessageSize,
      maxMetadataSize: bounds.maxMetadataSize,
      started: () => this.calls++,
      ended: () => this.calls--,
      hasRoom: (call) => this.guardOf(call)?.hasRoom() ?? true,
      room: (call, stop) => this.guardOf(call)?.room(stop) ?? Promise.resolve(),
    };
    for (const [path, route] of routes) this.register(path, route);
    // The header list bound (as Rust: the metadata bound + 4 KiB for HTTP/2's own fields):
    // grpc-js has no option for it, but passes these (internal) HTTP/2 options on.
    const common = (this.server as unknown as { commonServerOptions?: http2.ServerOptions }).commonServerOptions;
    if (common !== undefined) common.settings = { ...common.settings, maxHeaderListSize: bounds.maxMetadataSize + 4096 };
    this.injector = this.server.createConnectionInjector(g.ServerCredentials.createInsecure());
    this.guardSessions();
  }

  /**
   * Watches the request streams of every session the injector's HTTP/2 server makes
   * (grpc-guard.ts); that server is grpc-js's (internal) and made by `createConnectionInjector`.
   */
  private guardSessions(): void {
    const servers = (this.server as unknown as { http2Servers?: Map<http2.Http2Server, unknown> }).http2Servers;
    const h2 = servers === undefined ? undefined : [...servers.keys()].pop();
    if (h2 === undefined) return; // another grpc-js: the face runs without these bounds
    h2.on("session", (session: http2.ServerHttp2Session) => {
      if (this.injecting === null) return;
      this.injecting.session = session;
      this.guards.set(session, this.injecting);
    });
    h2.on("stream", (stream: http2.ServerHttp2Stream) => this.guards.get(stream.session as http2.Http2Session)?.watch(stream));
  }

  /** The guard of a grpc-js call's connection. */
  private guardOf(call: unknown): ConnGuard | undefined {
    const stream = streamOf(call);
    return stream === undefined ? undefined : this.guards.get(stream.session as http2.Http2Session);
  }

  /** Serves `path` with a route (replacing the one it had, as `Server.route` does). */
  register(path: string, route: Route): void {
    this.server.unregister(path);
    this.server.register(path, grpcHandler(this.env, route, path), identity, identity, grpcHandlerType(route));
  }

  /** Takes over an accepted socket whose first bytes (put back with `unshift`) are HTTP/2's preface. */
  inject(socket: net.Socket): void {
    this.sockets.add(socket);
    socket.once("close", () => this.sockets.delete(socket));
    const b = this.bounds;
    this.injecting = new ConnGuard(socket, { writeMs: b.writeMs, frameMs: b.frameMs, budget: b.budget, maxSendBuffer: b.maxSendBuffer });
    try {
      this.injector.injectConnection(socket);
    } finally {
      this.injecting = null;
    }
    socket.resume();
  }

  /**
   * Graceful shutdown: GOAWAY on every connection, open calls may finish for `graceMs`, then
   * whatever is left is closed.
   */
  async close(graceMs: number): Promise<void> {
    this.injector.drain(graceMs);
    const until = Date.now() + graceMs;
    while ((this.calls > 0 || this.sockets.size > 0) && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
    this.injector.destroy();
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
    this.server.forceShutdown();
  }
}
