// OpenTelemetry interceptors (src/otel.ts) between a Node client and the Node server, spans
// caught with sdk-trace-base's InMemorySpanExporter: client and server span in one trace with the
// right parent, the handler run inside the server span (a streaming handler's body too), error
// status, a streaming call, a raw `traceparent` continued by the server, and the histograms.
import { test } from "node:test";
import assert from "node:assert/strict";
import { SpanKind, SpanStatusCode, context, propagation, trace, type SpanContext } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from "@opentelemetry/sdk-trace-base";
import { MeterProvider, MetricReader, type HistogramMetricData } from "@opentelemetry/sdk-metrics";
import { Code, TopspinError, createClient } from "../src/index.js";
import { otelClientInterceptor, otelServerInterceptor } from "../src/otel.js";
import { Server, connect, type ServiceImpl } from "../src/node/index.js";
import { Store } from "../gen/kv/v1/kv_pb.js";
import { kvStore } from "../examples/kvstore.js";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { run } from "./procs.js";

context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
propagation.setGlobalPropagator(new W3CTraceContextPropagator());

class TestReader extends MetricReader {
  protected override onShutdown(): Promise<void> {
    return Promise.resolve();
  }
  protected override onForceFlush(): Promise<void> {
    return Promise.resolve();
  }
}

const exporter = new InMemorySpanExporter();
const tracerProvider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const reader = new TestReader();
const meterProvider = new MeterProvider({ readers: [reader] });
const tracer = tracerProvider.getTracer("test");

/** The span context active where it is called (what the handler sees). */
const active = (): SpanContext | undefined => trace.getSpan(context.active())?.spanContext();

/** A stream of one message. */
async function* one<T>(m: T): AsyncGenerator<T> {
  yield await Promise.resolve(m);
}

/** kvStore whose `get`, `delete` and `getMany` record the span active in the handler; `delete` fails INTERNAL. */
function store(seen: SpanContext[]): ServiceImpl<typeof Store> {
  const base = kvStore();
  return {
    ...base,
    get(req, ctx) {
      const s = active();
      if (s) seen.push(s);
      return base.get(req, ctx);
    },
    delete() {
      throw new TopspinError(Code.INTERNAL, "broken");
    },
    async *getMany(reqs, ctx) {
      for await (const r of reqs) {
        const s = active();
        if (s) seen.push(s);
        yield* base.getMany(one(r), ctx);
      }
    },
  };
}

async function withPair(fn: (kv: ReturnType<typeof createClient<typeof Store>>, addr: string, seen: SpanContext[]) => Promise<void>): Promise<void> {
  exporter.reset();
  const seen: SpanContext[] = [];
  const server = new Server({ interceptors: [otelServerInterceptor({ tracerProvider, meterProvider })] }).service(Store, store(seen));
  const addr = await server.listen("tcp://127.0.0.1:0");
  const channel = connect(addr, { interceptors: [otelClientInterceptor({ tracerProvider, meterProvider })] });
  try {
    await fn(createClient(Store, channel), addr, seen);
  } finally {
    channel.close();
    await server.close(1000);
  }
}

/** The finished span named `name` of `kind` (exactly one). */
function span(name: string, kind: SpanKind): ReadableSpan {
  const found = exporter.getFinishedSpans().filter((s) => s.name === name && s.kind === kind);
  assert.equal(found.length, 1, `one ${SpanKind[kind]} span ${name}: ${exporter.getFinishedSpans().map((s) => `${s.name}/${SpanKind[s.kind]}`).join(", ")}`);
  return found[0] as ReadableSpan;
}

/** Waits (at most 2 s) until `n` spans have finished: a server span ends just after the client's. */
async function spans(n: number): Promise<void> {
  for (let i = 0; i < 200 && exporter.getFinishedSpans().length < n; i++) await new Promise((r) => setTimeout(r, 10));
}

test("otel: a unary call's client and server spans are one trace, the server's the child of the client's, the handler inside it", async () => {
  await withPair(async (kv, _addr, seen) => {
    await kv.put({ key: "a", value: "1" });
    await tracer.startActiveSpan("root", async (root) => {
      await kv.get({ key: "a" });
      root.end();
    });
    await spans(5);
    const rootSpan = span("root", SpanKind.INTERNAL);
    const client = span("kv.v1.Store/Get", SpanKind.CLIENT);
    const server = span("kv.v1.Store/Get", SpanKind.SERVER);
    const traceId = rootSpan.spanContext().traceId;
    assert.equal(client.spanContext().traceId, traceId);
    assert.equal(client.parentSpanContext?.spanId, rootSpan.spanContext().spanId);
    assert.equal(server.spanContext().traceId, traceId);
    assert.equal(server.parentSpanContext?.spanId, client.spanContext().spanId);
    assert.equal(server.parentSpanContext?.isRemote, true);
    for (const s of [client, server]) {
      assert.equal(s.attributes["rpc.system"], "topspin");
      assert.equal(s.attributes["rpc.service"], "kv.v1.Store");
      assert.equal(s.attributes["rpc.method"], "Get");
      assert.equal(s.attributes["rpc.grpc.status_code"], 0);
      assert.equal(s.status.code, SpanStatusCode.UNSET);
    }
    assert.equal(seen.at(-1)?.spanId, server.spanContext().spanId, "the handler runs in the server span's context");
    // the call made without a root span starts its own trace
    const put = span("kv.v1.Store/Put", SpanKind.CLIENT);
    assert.equal(put.parentSpanContext, undefined);
    assert.equal(span("kv.v1.Store/Put", SpanKind.SERVER).spanContext().traceId, put.spanContext().traceId);
  });
});

test("otel: failed calls: the client span is ERROR for any code, the server span for the server's faults", async () => {
  await withPair(async (kv) => {
    await assert.rejects(kv.get({ key: "missing" }), (e: unknown) => e instanceof TopspinError && e.code === Code.NOT_FOUND);
    await assert.rejects(kv.delete({ key: "x" }), (e: unknown) => e instanceof TopspinError && e.code === Code.INTERNAL);
    await spans(4);
    const getC = span("kv.v1.Store/Get", SpanKind.CLIENT);
    const getS = span("kv.v1.Store/Get", SpanKind.SERVER);
    assert.equal(getC.attributes["rpc.grpc.status_code"], Code.NOT_FOUND);
    assert.equal(getS.attributes["rpc.grpc.status_code"], Code.NOT_FOUND);
    assert.equal(getC.status.code, SpanStatusCode.ERROR);
    assert.match(getC.status.message ?? "", /NOT_FOUND/);
    assert.equal(getS.status.code, SpanStatusCode.UNSET, "NOT_FOUND is not the server's fault");
    const delC = span("kv.v1.Store/Delete", SpanKind.CLIENT);
    const delS = span("kv.v1.Store/Delete", SpanKind.SERVER);
    assert.equal(delC.status.code, SpanStatusCode.ERROR);
    assert.equal(delS.status.code, SpanStatusCode.ERROR);
    assert.equal(delS.status.message, "INTERNAL: broken");
    assert.equal(delS.attributes["rpc.grpc.status_code"], Code.INTERNAL);
    assert.equal(delS.parentSpanContext?.spanId, delC.spanContext().spanId);
  });
});

test("otel: a bidi stream's spans end with the stream, its handler body runs in the server span", async () => {
  await withPair(async (kv, _addr, seen) => {
    await kv.put({ key: "k", value: "v" });
    exporter.reset();
    await tracer.startActiveSpan("root", async (root) => {
      const got: string[] = [];
      for await (const e of kv.getMany([{ key: "k" }, { key: "k" }, { key: "k" }])) got.push(e.value);
      assert.deepEqual(got, ["v", "v", "v"]);
      root.end();
    });
    await spans(3);
    const rootSpan = span("root", SpanKind.INTERNAL);
    const client = span("kv.v1.Store/GetMany", SpanKind.CLIENT);
    const server = span("kv.v1.Store/GetMany", SpanKind.SERVER);
    assert.equal(client.parentSpanContext?.spanId, rootSpan.spanContext().spanId);
    assert.equal(server.parentSpanContext?.spanId, client.spanContext().spanId);
    assert.equal(server.spanContext().traceId, rootSpan.spanContext().traceId);
    assert.equal(client.attributes["rpc.grpc.status_code"], 0);
    assert.equal(server.attributes["rpc.grpc.status_code"], 0);
    assert.equal(seen.length, 3);
    for (const s of seen) assert.equal(s.spanId, server.spanContext().spanId, "each resumption of the handler sees the server span");

    // left early: the client's span is CANCELLED
    exporter.reset();
    const stop = kv.watch({ prefix: "", includeExisting: true });
    for await (const _ of stop) break;
    await spans(2);
    const watchC = span("kv.v1.Store/Watch", SpanKind.CLIENT);
    assert.equal(watchC.attributes["rpc.grpc.status_code"], Code.CANCELLED);
    assert.equal(span("kv.v1.Store/Watch", SpanKind.SERVER).attributes["rpc.grpc.status_code"], Code.CANCELLED);
  });
});

test("otel: a raw traceparent sent as plain metadata is continued by the server", async () => {
  await withPair(async (_kv, addr, seen) => {
    const plain = connect(addr); // no client interceptor
    try {
      const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
      const parent = "00f067aa0ba902b7";
      await assert.rejects(createClient(Store, plain).get({ key: "none" }, { headers: { traceparent: `00-${traceId}-${parent}-01`, tracestate: "vendor=x" } }));
      await spans(1);
      const server = span("kv.v1.Store/Get", SpanKind.SERVER);
      assert.equal(server.spanContext().traceId, traceId);
      assert.equal(server.parentSpanContext?.spanId, parent);
      assert.equal(server.spanContext().traceState?.get("vendor"), "x");
      assert.equal(seen.at(-1)?.traceId, traceId);
    } finally {
      plain.close();
    }
  });
});

test("otel: rpc.client.duration and rpc.server.duration record every call with its method and code", async () => {
  await withPair(async (kv) => {
    await kv.put({ key: "m", value: "1" });
    await assert.rejects(kv.get({ key: "nope" }));
  });
  const { resourceMetrics } = await reader.collect();
  const metrics = resourceMetrics.scopeMetrics.flatMap((s) => s.metrics) as HistogramMetricData[];
  for (const name of ["rpc.client.duration", "rpc.server.duration"]) {
    const m = metrics.find((x) => x.descriptor.name === name);
    assert.ok(m, `${name} recorded`);
    assert.equal(m.descriptor.unit, "ms");
    const put = m.dataPoints.find((p) => p.attributes["rpc.method"] === "Put" && p.attributes["rpc.grpc.status_code"] === 0);
    const get = m.dataPoints.find((p) => p.attributes["rpc.method"] === "Get" && p.attributes["rpc.grpc.status_code"] === Code.NOT_FOUND);
    assert.ok(put && put.value.count >= 1, `${name}: Put OK`);
    assert.ok(get && get.value.count >= 1, `${name}: Get NOT_FOUND`);
    assert.equal(put.attributes["rpc.service"], "kv.v1.Store");
    assert.equal(put.attributes["rpc.system"], "topspin");
  }
});

test("otel: the README's example runs: five spans, one trace, each call's server span the child of its client span", async () => {
  const pkg = join(fileURLToPath(import.meta.url), "..", "..", "..");
  const r = await run(process.execPath, [join(pkg, "dist", "examples", "otel.js")]);
  assert.equal(r.code, 0, r.stderr);
  const spansOut = [...r.stdout.matchAll(/^(\w+) (\S+): trace (\w{32}) span (\w{16}) parent (\w+)$/gm)].map((m) => ({ kind: m[1], name: m[2], trace: m[3], span: m[4], parent: m[5] }));
  assert.equal(spansOut.length, 5, r.stdout);
  assert.equal(new Set(spansOut.map((s) => s.trace)).size, 1, "one trace");
  const root = spansOut.find((s) => s.name === "checkout");
  assert.equal(root?.parent, "none");
  for (const m of ["Put", "Get"]) {
    const c = spansOut.find((s) => s.kind === "CLIENT" && s.name === `kv.v1.Store/${m}`);
    const s = spansOut.find((x) => x.kind === "SERVER" && x.name === `kv.v1.Store/${m}`);
    assert.equal(c?.parent, root?.span);
    assert.equal(s?.parent, c?.span);
  }
  const get = spansOut.find((x) => x.kind === "SERVER" && x.name === "kv.v1.Store/Get");
  assert.match(r.stdout, new RegExp(`^server: got traceparent 00-${get?.trace}-\\w{16}-01, in span ${get?.span}$`, "m"));
});
