/**
 * The gRPC face's calls: a registered topspin {@link Route} answering a `@grpc/grpc-js` server
 * call (raw bytes in and out; the route's own decode/encode), with the same
 * {@link HandlerContext} a native call gets: metadata both ways (`-bin` values as bytes),
 * deadline (`grpc-timeout`), cancellation, response headers and trailers, status code, message
 * and details (`grpc-status-details-bin`, from a {@link TopspinError}'s `details`).
 * @module
 */
import type * as grpc from "@grpc/grpc-js";
import type { Readable } from "node:stream";
import type { MemoryBudget } from "../connection.js";
import { metadataSize, type Metadata } from "../frame.js";
import { Code, DETAILS_KEY, TopspinError } from "../status.js";
import { compressedWith, inflate } from "./grpc-inflate.js";
import type { HandlerContext, Route } from "./server.js";

/** The gRPC trailer with a status's binary details. */
export const GRPC_DETAILS_KEY = "grpc-status-details-bin";
/** Request messages larger than this are charged to the memory budget while held (as native frames over 64 KiB). */
export const CHARGE_THRESHOLD = 64 * 1024;

type AnyCall = grpc.ServerUnaryCall<Buffer, Buffer> | grpc.ServerReadableStream<Buffer, Buffer> | grpc.ServerWritableStream<Buffer, Buffer> | grpc.ServerDuplexStream<Buffer, Buffer>;

/** What a gRPC call needs from the server. */
export interface GrpcCallEnv {
  grpc: typeof grpc;
  budget: MemoryBudget;
  /** One request message, bytes, once inflated (the native `maxMessageSize`; grpc-js bounds it as it arrives). */
  maxMessageSize: number;
  /** Request metadata, bytes (the native `maxMetadataSize`; counted as on the native face). */
  maxMetadataSize: number;
  /** Bookkeeping of open calls (the idle timer and graceful shutdown look at it). */
  started: () => void;
  ended: () => void;
  /** Whether the call's connection has its unsent answers under the send buffer. */
  hasRoom: (call: AnyCall) => boolean;
  /** Resolves when the call's connection may have room (in turn with other calls), or `stop()`. */
  room: (call: AnyCall, stop: () => boolean) => Promise<void>;
}

/**
 * Runs `answer` (which encodes a response and hands it to grpc-js, with no await between) once
 * the call's connection has room (§7: no answer is produced while the peer does not take them;
 * the check and the answer in one turn, so that one call's answer shows before the next looks).
 */
async function whenRoom(env: GrpcCallEnv, call: AnyCall, st: CallState, answer: () => void): Promise<void> {
  const stop = (): boolean => st.abort.signal.aborted;
  while (!env.hasRoom(call) && !stop()) await env.room(call, stop);
  if (stop()) throw TopspinError.from(st.abort.signal.reason, Code.CANCELLED);
  answer();
}

/** gRPC's own headers, which handlers do not see (as on the native face). */
function reserved(key: string): boolean {
  return key.startsWith("grpc-") || key === "content-type" || key === "te";
}

/** grpc-js metadata as topspin metadata (wire order per key; `-bin` values as bytes). */
export function fromGrpcMetadata(md: grpc.Metadata): Metadata {
  const out: Metadata = [];
  for (const [key, values] of Object.entries(md.toJSON())) {
    if (reserved(key)) continue;
    for (const v of values) out.push({ key, value: typeof v === "string" ? v : new Uint8Array(v.buffer, v.byteOffset, v.length) });
  }
  return out;
}

/** topspin metadata as grpc-js metadata; `topspin-status-details-bin` becomes gRPC's details trailer. */
export function toGrpcMetadata(g: typeof grpc, md: Metadata): grpc.Metadata {
  const out = new g.Metadata();
  for (const { key, value } of md) {
    const k = key === DETAILS_KEY ? GRPC_DETAILS_KEY : key.toLowerCase();
    try {
      if (k.endsWith("-bin")) out.add(k, Buffer.from(typeof value === "string" ? Buffer.from(value) : value));
      else out.add(k, typeof value === "string" ? value : Buffer.from(value).toString("latin1"));
    } catch {
      // a key gRPC cannot carry (HTTP/2 header rules): left out
    }
  }
  return out;
}

/** The status a thrown value ends a gRPC call with. */
function grpcStatus(g: typeof grpc, err: unknown, trailers: Metadata): grpc.ServerErrorResponse {
  const t = TopspinError.from(err);
  const md: Metadata = [...trailers, ...t.trailers.filter((e) => e.key !== DETAILS_KEY && e.key !== GRPC_DETAILS_KEY)];
  if (t.details !== undefined) md.push({ key: GRPC_DETAILS_KEY, value: t.details });
  const code = t.code === Code.OK ? Code.UNKNOWN : t.code;
  const e: grpc.ServerErrorResponse = Object.assign(new Error(t.rawMessage), { details: t.rawMessage, metadata: toGrpcMetadata(g, md) });
  e.code = code.valueOf(); // the same numbers (protocol.md §11)
  return e;
}


/** One gRPC call's context, cancellation and bookkeeping. */
class CallState {
  readonly abort = new AbortController();
  readonly ctx: HandlerContext;
  private headersSent = false;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private charged = 0;
  private over = false;

  constructor(
    private readonly env: GrpcCallEnv,
    private readonly call: AnyCall,
    method: string,
  ) {
    const d = call.getDeadline();
    const deadline = d instanceof Date ? d.getTime() : Number.isFinite(d) ? d : undefined;
    const abort = this.abort;
    this.ctx = { method, requestHeaders: fromGrpcMetadata(call.metadata), signal: abort.signal, deadline, responseHeaders: [], responseTrailers: [] };
    (call as NodeJS.EventEmitter).on("cancelled", () => this.cancel(new TopspinError(Code.CANCELLED, "the client cancelled the call")));
    if (deadline !== undefined) {
      const ms = Math.min(2 ** 31 - 1, Math.max(0, deadline - Date.now()));
      this.timer = setTimeout(() => this.cancel(new TopspinError(Code.DEADLINE_EXCEEDED, "deadline exceeded")), ms);
    }
    env.started();
  }

  /** Aborts the handler's signal (once). */
  cancel(why: TopspinError): void {
    if (!this.abort.signal.aborted) this.abort.abort(why);
  }

  /**
   * Sends the response headers the handler set, once, before the first message or the status;
   * `failure` (a thrown error) adds its own headers (§5.4: HEADERS, then the trailers).
   */
  sendHeaders(failure?: unknown): void {
    if (this.headersSent) return;
    this.headersSent = true;
    const extra = failure instanceof TopspinError ? failure.headers : [];
    const md = extra.length === 0 ? this.ctx.responseHeaders : [...this.ctx.responseHeaders, ...extra];
    if (md.length > 0) this.call.sendMetadata(toGrpcMetadata(this.env.grpc, md));
  }

  /** Holds a large request message in the memory budget (released by {@link CallState.release}). */
  charge(n: number): void {
    if (n <= CHARGE_THRESHOLD || this.over) return;
    this.env.budget.reserve(n);
    this.charged += n;
  }

  /**
   * A request message as the handler takes it: inflated if it came compressed (grpc-inflate.ts;
   * charged before it grows, held while the handler has it), else charged as {@link CallState.charge}.
   */
  async take(b: Buffer): Promise<Buffer> {
    const enc = compressedWith(b);
    if (enc === undefined) {
      this.charge(b.length);
      return b;
    }
    const m = await inflate(b, enc, this.env.maxMessageSize, this.env.budget, this.abort.signal);
    if (this.over) this.env.budget.release(m.length);
    else this.charged += m.length;
    return m;
  }

  /** Releases what {@link CallState.charge} and {@link CallState.take} held. */
  release(): void {
    this.env.budget.release(this.charged);
    this.charged = 0;
  }

  /** The trailers for a successful end. */
  trailers(): grpc.Metadata {
    return toGrpcMetadata(this.env.grpc, this.ctx.responseTrailers);
  }

  /** The status for an error. */
  error(err: unknown): grpc.ServerErrorResponse {
    return grpcStatus(this.env.grpc, err, this.ctx.responseTrailers);
  }

  /** The call is over: timers, budget and bookkeeping. */
  done(): void {
    if (this.over) return;
    this.over = true;
    clearTimeout(this.timer);
    this.release();
    this.cancel(new TopspinError(Code.CANCELLED, "the call is over"));
    this.env.ended();
  }
}

/** The request messages of a streaming call, decoded, ending early when the call is cancelled. */
async function* requests(call: Readable, st: CallState, route: Route): AsyncGenerator<unknown> {
  // Not destroyed when the requests end: a bidi call's response side goes on.
  const it = call.iterator({ destroyOnReturn: false }) as AsyncIterator<Buffer>;
  const signal = st.abort.signal;
  const aborted = new Promise<never>((_, reject) => {
    const fail = (): void => reject(TopspinError.from(signal.reason, Code.CANCELLED));
    if (signal.aborted) fail();
    else signal.addEventListener("abort", fail, { once: true });
  });
  aborted.catch(() => undefined);
  for (;;) {
    st.release(); // the previous message was taken by the handler
    const r = await Promise.race([it.next(), aborted]);
    if (r.done === true) return;
    yield route.decode(await st.take(r.value));
  }
}

/** Writes one response message, waiting while grpc-js's stream buffer is full (or until the call ends). */
async function write(call: grpc.ServerWritableStream<Buffer, Buffer> | grpc.ServerDuplexStream<Buffer, Buffer>, st: CallState, bytes: Uint8Array): Promise<void> {
  const signal = st.abort.signal;
  if (signal.aborted) throw TopspinError.from(signal.reason, Code.CANCELLED);
  st.sendHeaders();
  if (call.write(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length))) return;
  await new Promise<void>((resolve) => {
    const go = (): void => {
      call.off("drain", go);
      signal.removeEventListener("abort", go);
      resolve();
    };
    call.on("drain", go);
    signal.addEventListener("abort", go);
  });
}

/**
 * Refuses a call before its handler runs (as the native face does): metadata over
 * `maxMetadataSize` (HTTP/2's header list bound leaves 4 KiB more for its own fields), or the
 * memory budget spent.
 */
function budgetRefusal(env: GrpcCallEnv, md: grpc.Metadata): TopspinError | null {
  const size = metadataSize(fromGrpcMetadata(md));
  if (size > env.maxMetadataSize) {
    return new TopspinError(Code.RESOURCE_EXHAUSTED, `request metadata of ${size} bytes exceeds the server's limit of ${env.maxMetadataSize} bytes (max_metadata_size)`);
  }
  return env.budget.exhausted ? new TopspinError(Code.RESOURCE_EXHAUSTED, "the server's memory budget is spent; try again later") : null;
}

/** The grpc-js handler of a unary or client-streaming route. */
function singleResponse(env: GrpcCallEnv, route: Route, method: string): grpc.handleUnaryCall<Buffer, Buffer> | grpc.handleClientStreamingCall<Buffer, Buffer> {
  return (call: grpc.ServerUnaryCall<Buffer, Buffer> | grpc.ServerReadableStream<Buffer, Buffer>, callback: grpc.sendUnaryData<Buffer>) => {
    const refused = budgetRefusal(env, call.metadata);
    if (refused !== null) return callback(grpcStatus(env.grpc, refused, []));
    const st = new CallState(env, call, method);
    const run = async (): Promise<void> => {
      await whenRoom(env, call, st, () => undefined); // past the send buffer, calls wait to start
      let input: unknown;
      if (route.kind === "unary") {
        input = route.decode(await st.take((call as grpc.ServerUnaryCall<Buffer, Buffer>).request));
      } else input = requests(call as grpc.ServerReadableStream<Buffer, Buffer>, st, route);
      const v = await route.handler(input, st.ctx);
      await whenRoom(env, call, st, () => {
        const bytes = route.encode(v);
        st.sendHeaders();
        callback(null, Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length), st.trailers());
      });
    };
    run().then(
      () => st.done(),
      (err: unknown) => {
        st.sendHeaders(err);
        callback(st.error(err));
        st.done();
      },
    );
  };
}

/** The grpc-js handler of a server-streaming or bidi route. */
function streamResponse(env: GrpcCallEnv, route: Route, method: string): grpc.handleServerStreamingCall<Buffer, Buffer> | grpc.handleBidiStreamingCall<Buffer, Buffer> {
  return (call: grpc.ServerWritableStream<Buffer, Buffer> | grpc.ServerDuplexStream<Buffer, Buffer>) => {
    const refused = budgetRefusal(env, call.metadata);
    if (refused !== null) {
      call.emit("error", grpcStatus(env.grpc, refused, []));
      return;
    }
    const st = new CallState(env, call, method);
    const run = async (): Promise<void> => {
      await whenRoom(env, call, st, () => undefined); // past the send buffer, calls wait to start
      let input: unknown;
      if (route.kind === "server_streaming") {
        input = route.decode(await st.take((call as grpc.ServerWritableStream<Buffer, Buffer>).request));
      } else input = requests(call as grpc.ServerDuplexStream<Buffer, Buffer>, st, route);
      for await (const v of route.handler(input, st.ctx) as AsyncIterable<unknown>) {
        let sent: Promise<void> = Promise.resolve();
        await whenRoom(env, call, st, () => {
          sent = write(call, st, route.encode(v));
        });
        await sent;
      }
    };
    run().then(
      () => {
        if (st.abort.signal.aborted) return st.done();
        st.sendHeaders();
        call.end(st.trailers());
        st.done();
      },
      (err: unknown) => {
        if (!call.cancelled) {
          st.sendHeaders(err);
          call.emit("error", st.error(err));
        }
        st.done();
      },
    );
  };
}

/** The grpc-js handler type name of a route's kind. */
export function grpcHandlerType(route: Route): "unary" | "clientStream" | "serverStream" | "bidi" {
  switch (route.kind) {
    case "unary":
      return "unary";
    case "client_streaming":
      return "clientStream";
    case "server_streaming":
      return "serverStream";
    case "bidi_streaming":
      return "bidi";
  }
}

/** The grpc-js handler for a route. */
export function grpcHandler(env: GrpcCallEnv, route: Route, method: string): grpc.UntypedHandleCall {
  return route.kind === "unary" || route.kind === "client_streaming" ? singleResponse(env, route, method) : streamResponse(env, route, method);
}
