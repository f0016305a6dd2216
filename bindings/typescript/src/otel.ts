/**
 * OpenTelemetry for topspin calls, as interceptors (`@topspin/topspin/otel`): a span per call, W3C
 * trace context (`traceparent`, `tracestate`) in the request metadata, and a duration histogram.
 * Depends on `@opentelemetry/api` only (an optional peer dependency): the application brings the
 * SDK (a tracer provider, a meter provider, a propagator, a context manager) and registers it, or
 * passes providers in the options. No Node-only imports: the client interceptor runs in browsers.
 *
 * - client (`otelClientInterceptor`): a `CLIENT` span named `package.Service/Method`, a child of
 *   the context active when the call is made; its context is injected into the request metadata
 *   with the propagator (`propagation.inject`, the global W3C one unless told otherwise), replacing
 *   entries of the same keys; the rest of the chain runs with the span's context active.
 * - server (`otelServerInterceptor`): the context the client sent is extracted from the request
 *   metadata (`propagation.extract`) and made the parent of a `SERVER` span; the handler (and the
 *   interceptors inside this one) runs with that span's context active — a streaming handler's
 *   body too, each time it is resumed — so its own spans are children of the call's.
 *
 * Attributes: `rpc.system` (`topspin`), `rpc.service`, `rpc.method` and, once the call ended,
 * `rpc.grpc.status_code` (topspin's codes are gRPC's). A client span is `ERROR` for every code
 * but OK; a server span for the codes that are the server's fault (UNKNOWN, DEADLINE_EXCEEDED,
 * UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS), as OpenTelemetry's RPC conventions say. The
 * histograms `rpc.client.duration` / `rpc.server.duration` (ms) record each call's time until
 * its end — for a stream, the end of its response stream — with the same attributes. A
 * streaming call's span ends when its response stream ends, fails or is left (`break`).
 * @module
 */
import {
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  context as otelContext,
  metrics,
  propagation,
  trace,
  type Attributes,
  type Context,
  type Histogram,
  type MeterProvider,
  type Span,
  type TextMapGetter,
  type TextMapPropagator,
  type TextMapSetter,
  type TracerProvider,
} from "@opentelemetry/api";
import type { Metadata } from "./frame.js";
import type { Interceptor, InterceptorRequest, InterceptorResponse } from "./interceptor.js";
import { Code, TopspinError } from "./status.js";

/** The name given to tracers and meters. */
export const INSTRUMENTATION_NAME = "@topspin/topspin";

/** Options of {@link otelClientInterceptor} and {@link otelServerInterceptor}. */
export interface OtelOptions {
  /** Where spans come from (default: the global tracer provider, `trace.setGlobalTracerProvider`). */
  tracerProvider?: TracerProvider;
  /** Where the duration histogram comes from (default: the global meter provider). */
  meterProvider?: MeterProvider;
  /**
   * Writes (client) and reads (server) the trace context in metadata (default: the global
   * propagator, `propagation.setGlobalPropagator`, e.g. `W3CTraceContextPropagator`).
   */
  propagator?: TextMapPropagator;
  /** Extra attributes for every span and measurement. */
  attributes?: Attributes;
}

/** Reads and writes metadata as a carrier: text entries, keys lower-case. */
export const metadataGetter: TextMapGetter<Metadata> = {
  keys: (md) => [...new Set(md.map((m) => m.key))],
  get: (md, key) => {
    const k = key.toLowerCase();
    const v = md.find((m) => m.key === k && typeof m.value === "string")?.value;
    return typeof v === "string" ? v : undefined;
  },
};

/** Sets a text entry, replacing those of the same key. */
export const metadataSetter: TextMapSetter<Metadata> = {
  set: (md, key, value) => {
    const k = key.toLowerCase();
    for (let i = md.length - 1; i >= 0; i--) if (md[i]?.key === k) md.splice(i, 1);
    md.push({ key: k, value });
  },
};

/** `/package.Service/Method` → its span name and attributes. */
function names(method: string): { name: string; service: string; method: string } {
  const name = method.startsWith("/") ? method.slice(1) : method;
  const slash = name.lastIndexOf("/");
  return { name, service: slash < 0 ? "" : name.slice(0, slash), method: slash < 0 ? name : name.slice(slash + 1) };
}

/** Server codes that are errors (OpenTelemetry's RPC conventions for gRPC servers). */
const SERVER_ERRORS = new Set<number>([Code.UNKNOWN, Code.DEADLINE_EXCEEDED, Code.UNIMPLEMENTED, Code.INTERNAL, Code.UNAVAILABLE, Code.DATA_LOSS]);

/** One call's span and clock; `end` is idempotent. */
class CallRecord {
  private readonly t0 = performance.now();
  private ended = false;

  constructor(
    readonly span: Span,
    private readonly histogram: Histogram,
    private readonly attrs: Attributes,
    private readonly server: boolean,
  ) {}

  end(code: number, message?: string): void {
    if (this.ended) return;
    this.ended = true;
    this.span.setAttribute("rpc.grpc.status_code", code);
    const error = this.server ? SERVER_ERRORS.has(code) : code !== (Code.OK as number);
    if (error) this.span.setStatus({ code: SpanStatusCode.ERROR, message: `${Code[code] ?? code}${message ? `: ${message}` : ""}` });
    this.span.end();
    this.histogram.record(performance.now() - this.t0, { ...this.attrs, "rpc.grpc.status_code": code });
  }

  fail(e: unknown): void {
    const t = TopspinError.from(e);
    this.end(t.code, t.rawMessage);
  }
}

/** `stream` whose every `next` runs in `ctx` (a generator's body resumes there) and whose end ends `rec`. */
function traced<T>(stream: AsyncIterable<T>, ctx: Context, rec: CallRecord, endCode: () => [number, string?]): AsyncIterable<T> {
  return {
    [Symbol.asyncIterator](): AsyncIterator<T> {
      const it = stream[Symbol.asyncIterator]();
      return {
        async next(): Promise<IteratorResult<T>> {
          try {
            const r = await otelContext.with(ctx, () => it.next());
            if (r.done === true) rec.end(...endCode());
            return r;
          } catch (e) {
            rec.fail(e);
            throw e;
          }
        },
        async return(value?: unknown): Promise<IteratorResult<T>> {
          // left early: a client's call is cancelled
          rec.end(Code.CANCELLED, "the response stream was left before its end");
          return (await it.return?.(value)) ?? { done: true, value: undefined };
        },
      };
    },
  };
}

function setup(opts: OtelOptions, server: boolean): { tracerProvider: TracerProvider; histogram: Histogram; propagator: TextMapPropagator; attributes: Attributes } {
  const meter = (opts.meterProvider ?? metrics.getMeterProvider()).getMeter(INSTRUMENTATION_NAME);
  const histogram = meter.createHistogram(server ? "rpc.server.duration" : "rpc.client.duration", {
    description: server ? "Duration of inbound RPCs" : "Duration of outbound RPCs",
    unit: "ms",
  });
  // the globals are looked up per call: an interceptor made before the SDK was registered still works
  const tracerProvider = opts.tracerProvider ?? { getTracer: (n: string, v?: string) => trace.getTracer(n, v) };
  return { tracerProvider, histogram, propagator: opts.propagator ?? propagation, attributes: opts.attributes ?? {} };
}

function start(req: InterceptorRequest, kind: SpanKind, parent: Context, s: ReturnType<typeof setup>, server: boolean): { rec: CallRecord; ctx: Context } {
  const n = names(req.method);
  const attrs: Attributes = { "rpc.system": "topspin", "rpc.service": n.service, "rpc.method": n.method, ...s.attributes };
  const span = s.tracerProvider.getTracer(INSTRUMENTATION_NAME).startSpan(n.name, { kind, attributes: attrs }, parent);
  return { rec: new CallRecord(span, s.histogram, attrs, server), ctx: trace.setSpan(parent, span) };
}

/**
 * The client interceptor: a `CLIENT` span per call, its trace context injected into the
 * request metadata (`traceparent`, `tracestate` with the W3C propagator). Put it first in
 * `interceptors` so that it sees the context active when the call is made (it reads it before
 * anything is awaited) and its span covers the others.
 */
export function otelClientInterceptor(opts: OtelOptions = {}): Interceptor {
  const s = setup(opts, false);
  return (next) => async (req) => {
    const { rec, ctx } = start(req, SpanKind.CLIENT, otelContext.active(), s, false);
    const header = [...req.header];
    s.propagator.inject(ctx, header, metadataSetter);
    let res: InterceptorResponse;
    try {
      res = await otelContext.with(ctx, () => next({ ...req, header }));
    } catch (e) {
      rec.fail(e);
      throw e;
    }
    if (!res.stream) {
      rec.end(Code.OK);
      return res;
    }
    return { ...res, message: traced(res.message, ctx, rec, () => [Code.OK]) };
  };
}

/**
 * The server interceptor: the trace context the client sent (if any) becomes the parent of a
 * `SERVER` span, and the handler runs with that span's context active. Put it first in the
 * server's `interceptors`.
 */
export function otelServerInterceptor(opts: OtelOptions = {}): Interceptor {
  const s = setup(opts, true);
  return (next) => async (req) => {
    const parent = s.propagator.extract(ROOT_CONTEXT, req.header, metadataGetter);
    const { rec, ctx } = start(req, SpanKind.SERVER, parent, s, true);
    let res: InterceptorResponse;
    try {
      res = await otelContext.with(ctx, () => next(req));
    } catch (e) {
      rec.fail(e);
      throw e;
    }
    if (!res.stream) {
      rec.end(Code.OK);
      return res;
    }
    // a stream stopped by the call's end (cancel, deadline) may just end: the signal says why
    const endCode = (): [number, string?] => {
      if (!req.signal.aborted) return [Code.OK];
      const t = TopspinError.from(req.signal.reason);
      return [t.code, t.rawMessage];
    };
    return { ...res, message: traced(res.message, ctx, rec, endCode) };
  };
}
