// OpenTelemetry: a span per call on both sides, in one trace (W3C trace context in the metadata).
// Run: node dist/examples/otel.js
import { SpanKind, context, propagation, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { createClient } from "../src/index.js";
import { otelClientInterceptor, otelServerInterceptor } from "../src/otel.js";
import { Server, connect } from "../src/node/index.js";
import { Store } from "../gen/kv/v1/kv_pb.js";
import { kvStore } from "./kvstore.js";

// The SDK, set up once by the application (use your exporter instead of the in-memory one).
const exporter = new InMemorySpanExporter();
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
propagation.setGlobalPropagator(new W3CTraceContextPropagator());
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());

const kvImpl = kvStore();
const server = new Server({ interceptors: [otelServerInterceptor()] }).service(Store, {
  ...kvImpl,
  get(req, ctx) {
    // the handler runs in the server span's context (its own spans are the call's children)
    const traceparent = ctx.requestHeaders.find((m) => m.key === "traceparent")?.value;
    console.log(`server: got traceparent ${String(traceparent)}, in span ${trace.getSpan(context.active())?.spanContext().spanId}`);
    return kvImpl.get(req, ctx);
  },
});
const address = await server.listen("tcp://127.0.0.1:0");
const channel = connect(address, { interceptors: [otelClientInterceptor()] }); // first = outermost
const kv = createClient(Store, channel);

await trace.getTracer("example").startActiveSpan("checkout", async (root) => {
  await kv.put({ key: "a", value: "1" });
  await kv.get({ key: "a" });
  root.end();
});
channel.close();
await server.close(1000);
for (const s of exporter.getFinishedSpans()) {
  const { traceId, spanId } = s.spanContext();
  console.log(`${SpanKind[s.kind]} ${s.name}: trace ${traceId} span ${spanId} parent ${s.parentSpanContext?.spanId ?? "none"}`);
}
