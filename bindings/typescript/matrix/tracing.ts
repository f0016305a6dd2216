// OpenTelemetry for the matrix programs (the `trace` check, testdata/matrix/README.md): an SDK
// tracer provider (no exporter: the spans are only needed for their ids), the W3C trace-context
// propagator, and the context manager the platform needs — Node: AsyncLocalStorage; the browser:
// the synchronous stack of matrix/stack-context.ts. Platform-neutral: the browser page uses it.
import { context, propagation, trace, type ContextManager } from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { BasicTracerProvider } from "@opentelemetry/sdk-trace-base";

/** Registers the tracer provider, the W3C propagator and `contextManager` globally. */
export function setUpTracing(contextManager: ContextManager): void {
  trace.setGlobalTracerProvider(new BasicTracerProvider());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  context.setGlobalContextManager(contextManager.enable());
}
