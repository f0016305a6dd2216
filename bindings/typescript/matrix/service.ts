// The Node implementation of matrix.v1.Matrix (testdata/matrix/matrix.proto), served by
// matrix/server.ts: echoes with metadata, streams, a held stream, failures as asked, sleeps that
// end on the call's signal, and the table of tags whose calls were seen cancelled.
import { context, isSpanContextValid, trace } from "@opentelemetry/api";
import type { Metadata } from "../src/frame.js";
import { TopspinError } from "../src/status.js";
import type { HandlerContext, ServiceImpl } from "../src/node/server.js";
import type { Matrix } from "../gen/matrix_pb.js";

/** The tags kept at most (a long-running server forgets the oldest). */
const MAX_TAGS = 100_000;

/** Tags of calls seen cancelled or past their deadline (`WasCancelled`). */
export class CancelledTags {
  private readonly tags = new Set<string>();

  add(tag: string): void {
    if (tag === "") return;
    if (this.tags.size >= MAX_TAGS) {
      const oldest = this.tags.values().next();
      if (oldest.done !== true) this.tags.delete(oldest.value);
    }
    this.tags.add(tag);
  }

  has(tag: string): boolean {
    return this.tags.has(tag);
  }
}

/** Resolves when `signal` aborts (at once if it already did). */
function aborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
}

/** Records `tag` when the call's signal aborts (cancel, deadline or a lost connection). */
function recordOnAbort(ctx: HandlerContext, tags: CancelledTags, tag: string): void {
  void aborted(ctx.signal).then(() => tags.add(tag));
}

/** `x-echo` comes back as header `x-echo` and trailer `x-echo-t`, `x-echo-bin` as header `x-echo-bin`. */
function echoMetadata(ctx: HandlerContext): void {
  const find = (k: string): Metadata[number] | undefined => ctx.requestHeaders.find((m) => m.key === k);
  const text = find("x-echo");
  if (text !== undefined) {
    ctx.responseHeaders.push({ key: "x-echo", value: text.value });
    ctx.responseTrailers.push({ key: "x-echo-t", value: text.value });
  }
  const bin = find("x-echo-bin");
  if (bin !== undefined) ctx.responseHeaders.push({ key: "x-echo-bin", value: bin.value });
}

/** The service, recording cancellations in `tags`. */
export function matrixImpl(tags: CancelledTags): ServiceImpl<typeof Matrix> {
  return {
    unary(req, ctx) {
      echoMetadata(ctx);
      // the trace of the span the OpenTelemetry interceptor made current for the call, if any
      const span = trace.getSpan(context.active())?.spanContext();
      if (span !== undefined && isSpanContextValid(span)) ctx.responseHeaders.push({ key: "x-trace-id", value: span.traceId });
      return { payload: req.payload };
    },
    async *serverStream(req, ctx) {
      if (req.hold) {
        await aborted(ctx.signal);
        tags.add(req.tag);
        return;
      }
      const payload = new Uint8Array(req.size).fill(0x61);
      for (let i = 0; i < req.count; i++) yield { payload };
    },
    async clientStream(reqs) {
      let count = 0;
      let bytes = 0n;
      for await (const m of reqs) {
        count++;
        bytes += BigInt(m.payload.length);
      }
      return { count, bytes };
    },
    async *bidi(reqs) {
      for await (const m of reqs) yield { payload: m.payload };
    },
    fail(req) {
      // a response header that goes out before the failing END (protocol.md §5.4)
      throw new TopspinError(req.code, req.message, [], { details: req.details, headers: [{ key: "x-fail-h", value: "v1" }] });
    },
    async sleep(req, ctx) {
      recordOnAbort(ctx, tags, req.tag);
      let timer: ReturnType<typeof setTimeout> | undefined;
      const slept = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(true), req.millis)));
      const done = await Promise.race([slept, aborted(ctx.signal).then(() => false)]);
      clearTimeout(timer);
      if (!done) throw TopspinError.from(ctx.signal.reason);
      return { payload: new Uint8Array() };
    },
    wasCancelled(req) {
      return { value: tags.has(req.tag) };
    },
  };
}
