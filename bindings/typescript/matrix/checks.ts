// The client checks of the cross-language matrix (testdata/matrix/README.md), in order, on any
// Channel: the Node client (matrix/client.ts: tcp, unix, ws) and the Chromium page
// (matrix/browser-page.ts: ws) run this same module. Each check prints `ok NAME`,
// `FAIL NAME: why` or `skip NAME: why` through `emit`, and has its own deadline.
import { create, toBinary, fromBinary } from "@bufbuild/protobuf";
import { context, isSpanContextValid, trace } from "@opentelemetry/api";
import type { Channel } from "../src/channel.js";
import { createClient, methodPath, type Client } from "../src/client.js";
import type { Codecs, Compression } from "../src/compression.js";
import type { Metadata } from "../src/frame.js";
import { Code, TopspinError } from "../src/status.js";
import { Matrix, MsgSchema, StreamReqSchema } from "../gen/matrix_pb.js";

/** What the checks run against. */
export interface CheckEnv {
  /** A channel to the server under test. */
  channel: Channel;
  /** The codecs the channel was made with (what request compression it can send). */
  codecs: Codecs;
  /** Tag prefix, `<client>-<pid>`: a check's tag is `<prefix>-<check>`. */
  tagPrefix: string;
  /** Checks this client cannot express, with the reason (printed as `skip NAME: why`). */
  skip?: Readonly<Record<string, string>>;
}

/** What one check sees. */
interface Ctx {
  env: CheckEnv;
  client: Client<typeof Matrix>;
  tag: string;
}

/** A check's result: pass (undefined), or skipped with a reason. */
type Outcome = undefined | { skip: string };

interface Check {
  name: string;
  run: (ctx: Ctx) => Promise<Outcome>;
}

/** The default deadline of a check (README: 5 s unless said). */
const CHECK_DEADLINE_MS = 5000;
/** Deadline of a single call inside a check. */
const CALL_MS = 4000;
/** Deadline of the held stream of `quiet-stream`: past the check's own. */
const HELD_MS = 6000;

class CheckFailed extends Error {}

function expect(cond: boolean, why: string): asserts cond {
  if (!cond) throw new CheckFailed(why);
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const now = (): number => performance.now();

function hex(b: Uint8Array | undefined): string {
  if (b === undefined) return "none";
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join(" ") || "empty";
}

function sameBytes(a: Uint8Array | undefined, b: Uint8Array): boolean {
  return a !== undefined && a.length === b.length && a.every((x, i) => x === b[i]);
}

function describe(e: unknown): string {
  if (e instanceof TopspinError) return `${Code[e.code] ?? e.code}: ${e.rawMessage}`;
  return e instanceof Error ? e.message : String(e);
}

/** The TopspinError `p` fails with (a check failure if it succeeds or throws something else). */
async function failure(p: Promise<unknown>): Promise<TopspinError> {
  try {
    await p;
  } catch (e) {
    if (e instanceof TopspinError) return e;
    throw new CheckFailed(`expected a TopspinError, got ${describe(e)}`);
  }
  throw new CheckFailed("the call succeeded");
}

function metaValue(md: Metadata, key: string): string | Uint8Array | undefined {
  return md.find((m) => m.key === key)?.value;
}

const keys = (md: Metadata): string => md.map((m) => m.key).join(", ");

/** Polls `WasCancelled(tag)` every 50 ms until true; fails after `withinMs`. */
async function seenCancelled(ctx: Ctx, withinMs = 3000): Promise<void> {
  const until = now() + withinMs;
  for (;;) {
    const left = until - now();
    let f;
    try {
      f = await ctx.client.wasCancelled({ tag: ctx.tag }, { timeoutMs: Math.max(50, Math.min(1000, left)) });
    } catch (e) {
      throw new CheckFailed(`WasCancelled(${ctx.tag}): ${describe(e)}`);
    }
    if (f.value) return;
    expect(now() < until, `WasCancelled(${ctx.tag}) still false after ${withinMs} ms`);
    await sleep(50);
  }
}

async function unary(ctx: Ctx): Promise<Outcome> {
  let headers: Metadata = [];
  let trailers: Metadata = [];
  const bin = new Uint8Array([0x00, 0x01, 0xff]);
  const r = await ctx.client.unary(
    { payload: new TextEncoder().encode("hello") },
    {
      timeoutMs: CALL_MS,
      headers: [
        { key: "x-echo", value: "v1" },
        { key: "x-echo-bin", value: bin },
      ],
      onHeader: (h) => (headers = h),
      onTrailer: (t) => (trailers = t),
    },
  );
  expect(new TextDecoder().decode(r.payload) === "hello", `payload ${hex(r.payload)}`);
  const x = metaValue(headers, "x-echo");
  expect(x === "v1", `header x-echo = ${String(x)}`);
  const xb = metaValue(headers, "x-echo-bin");
  expect(xb instanceof Uint8Array && sameBytes(xb, bin), `header x-echo-bin = ${xb instanceof Uint8Array ? hex(xb) : String(xb)}`);
  const t = metaValue(trailers, "x-echo-t");
  expect(t === "v1", `trailer x-echo-t = ${String(t)}`);
  return undefined;
}

async function large(ctx: Ctx): Promise<Outcome> {
  const payload = new Uint8Array(300 * 1024).map((_, i) => i % 251);
  const r = await ctx.client.unary({ payload }, { timeoutMs: CALL_MS });
  expect(sameBytes(r.payload, payload), `${r.payload.length} bytes back, not the ${payload.length} sent`);
  return undefined;
}

async function serverStream(ctx: Ctx): Promise<Outcome> {
  const got: Uint8Array[] = [];
  for await (const m of ctx.client.serverStream({ count: 5, size: 10 }, { timeoutMs: CALL_MS })) got.push(m.payload);
  expect(got.length === 5, `${got.length} messages`);
  const ten = new Uint8Array(10).fill(0x61);
  expect(
    got.every((p) => sameBytes(p, ten)),
    `payloads ${got.map(hex).join(" | ")}`,
  );
  return undefined;
}

/**
 * The call handle (`Channel.start`, resolved once the CALL is out) of a held stream comes back
 * while the server sends nothing; cancelled through its AbortSignal after 200 ms.
 */
async function quietStream(ctx: Ctx): Promise<Outcome> {
  const ac = new AbortController();
  // Its deadline is past the check's, so only the cancel can make WasCancelled true in time.
  const call = await ctx.env.channel.start(methodPath(Matrix.method.serverStream), { signal: ac.signal, timeoutMs: HELD_MS });
  try {
    await call.send(toBinary(StreamReqSchema, create(StreamReqSchema, { hold: true, tag: ctx.tag })), true);
    let settled: string | null = null;
    const first = call.receive().then(
      (m) => void (settled = m === undefined ? "the held stream ended OK" : "a message arrived on the held stream"),
      (e: unknown) => void (settled = `the held stream ended ${describe(e)}`),
    );
    await sleep(200);
    expect(settled === null, `before the cancel: ${String(settled)}`);
    ac.abort();
    await first;
    const e = await failure(call.end());
    expect(e.code === Code.CANCELLED, `the cancelled call ended ${describe(e)}`);
  } finally {
    ac.abort();
  }
  await seenCancelled(ctx);
  return undefined;
}

async function clientStream(ctx: Ctx): Promise<Outcome> {
  const msgs = [1, 2, 3].map((n) => ({ payload: new Uint8Array(n).fill(0x62) }));
  const s = await ctx.client.clientStream(msgs, { timeoutMs: CALL_MS });
  expect(s.count === 3 && s.bytes === 6n, `Summary(count ${s.count}, bytes ${s.bytes})`);
  return undefined;
}

/** Opens Bidi (the handle comes back before anything is sent), then talks one message at a time. */
async function bidiOpenThenSend(ctx: Ctx): Promise<Outcome> {
  const call = await ctx.env.channel.start(methodPath(Matrix.method.bidi), { timeoutMs: CALL_MS });
  try {
    for (const word of ["a", "b"]) {
      await call.send(toBinary(MsgSchema, create(MsgSchema, { payload: new TextEncoder().encode(word) })));
      const m = await call.receive();
      expect(m !== undefined, `the stream ended before the echo of ${word}`);
      const got = new TextDecoder().decode(fromBinary(MsgSchema, m).payload);
      expect(got === word, `echo ${JSON.stringify(got)} for ${JSON.stringify(word)}`);
    }
    call.halfClose();
    const extra = await call.receive();
    expect(extra === undefined, "a message after the two echoes");
    await call.end();
  } finally {
    call.cancel(); // no-op once the call ended
  }
  return undefined;
}

async function deadline(ctx: Ctx): Promise<Outcome> {
  const t0 = now();
  const e = await failure(ctx.client.sleep({ millis: 2000, tag: ctx.tag }, { timeoutMs: 200 }));
  const ms = now() - t0;
  expect(e.code === Code.DEADLINE_EXCEEDED, `ended ${describe(e)}`);
  expect(ms < 1500, `DEADLINE_EXCEEDED after ${Math.round(ms)} ms`);
  await seenCancelled(ctx);
  return undefined;
}

async function cancel(ctx: Ctx): Promise<Outcome> {
  const ac = new AbortController();
  const call = ctx.client.sleep({ millis: 10_000, tag: ctx.tag }, { signal: ac.signal, timeoutMs: 10_000 });
  // Its outcome is taken at once: a call that fails before the cancel (no server) must not
  // be an unhandled rejection, which ends the process.
  const ended = failure(call);
  await sleep(200);
  ac.abort();
  const e = await ended;
  expect(e.code === Code.CANCELLED, `ended ${describe(e)}`);
  await seenCancelled(ctx);
  return undefined;
}

async function errorDetails(ctx: Ctx): Promise<Outcome> {
  const details = new Uint8Array([0x08, 0x05, 0x12, 0x04, 0x6e, 0x6f, 0x70, 0x65]);
  const e = await failure(ctx.client.fail({ code: 5, message: "nope", details }, { timeoutMs: CALL_MS }));
  expect(e.code === Code.NOT_FOUND, `ended ${describe(e)}`);
  expect(e.rawMessage === "nope", `message ${JSON.stringify(e.rawMessage)}`);
  expect(sameBytes(e.details, details), `details ${hex(e.details)}`);
  // the handler's response header came before the failing END and stays with the error (§5.4)
  const h = metaValue(e.headers, "x-fail-h");
  expect(h === "v1", `header x-fail-h = ${String(h)} (header keys [${keys(e.headers)}], trailer keys [${keys(e.trailers)}])`);
  return undefined;
}

/** 64 KiB of `a` with gzip request compression, and zstd as a second call where there is an encoder. */
async function compression(ctx: Ctx): Promise<Outcome> {
  const encodings = (["gzip", "zstd"] as Compression[]).filter((c) => ctx.env.codecs.encoders[c] !== undefined);
  if (!encodings.includes("gzip")) return { skip: "this client has no gzip encoder" };
  const payload = new Uint8Array(64 * 1024).fill(0x61);
  for (const c of encodings) {
    let r;
    try {
      r = await ctx.client.unary({ payload }, { timeoutMs: CALL_MS, compression: c });
    } catch (e) {
      throw new CheckFailed(`${c}: ${describe(e)}`);
    }
    expect(sameBytes(r.payload, payload), `${c}: ${r.payload.length} bytes back`);
  }
  return undefined;
}

/**
 * A root span from the global tracer provider (the program registered an SDK one: matrix/tracing.ts)
 * and, with it current, `Unary("trace")` through the channel's OpenTelemetry interceptor: the
 * server's `x-trace-id` must be the root's trace id.
 */
async function traceCheck(ctx: Ctx): Promise<Outcome> {
  const root = trace.getTracer("topspin-matrix").startSpan("matrix-trace");
  const want = root.spanContext();
  expect(isSpanContextValid(want), "the root span has no valid context (no OpenTelemetry SDK tracer provider registered)");
  let headers: Metadata = [];
  let r;
  try {
    // the call starts inside `with`: the interceptor reads the active context before any await
    r = await context.with(trace.setSpan(context.active(), root), () =>
      ctx.client.unary({ payload: new TextEncoder().encode("trace") }, { timeoutMs: CALL_MS, onHeader: (h) => (headers = h) }),
    );
  } finally {
    root.end();
  }
  expect(new TextDecoder().decode(r.payload) === "trace", `payload ${hex(r.payload)}`);
  const got = metaValue(headers, "x-trace-id");
  expect(got !== undefined, `no x-trace-id header: the server saw no trace context (root trace ${want.traceId})`);
  expect(got === want.traceId, `x-trace-id ${String(got)}, root trace ${want.traceId}`);
  return undefined;
}

/** The checks, in the README's order. */
export const CHECKS: readonly Check[] = [
  { name: "unary", run: unary },
  { name: "large", run: large },
  { name: "server-stream", run: serverStream },
  { name: "quiet-stream", run: quietStream },
  { name: "client-stream", run: clientStream },
  { name: "bidi-open-then-send", run: bidiOpenThenSend },
  { name: "deadline", run: deadline },
  { name: "cancel", run: cancel },
  { name: "error-details", run: errorDetails },
  { name: "compression", run: compression },
  { name: "trace", run: traceCheck },
];

/** Runs one check under its deadline; resolves with its line. */
async function runOne(check: Check, env: CheckEnv, client: Client<typeof Matrix>): Promise<string> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new CheckFailed(`no result within ${CHECK_DEADLINE_MS} ms`)), CHECK_DEADLINE_MS);
  });
  try {
    const ctx: Ctx = { env, client, tag: `${env.tagPrefix}-${check.name}` };
    const outcome = await Promise.race([check.run(ctx), late]);
    return outcome === undefined ? `ok ${check.name}` : `skip ${check.name}: ${outcome.skip}`;
  } catch (e) {
    const why = e instanceof CheckFailed ? e.message : describe(e);
    return `FAIL ${check.name}: ${why.replace(/\s+/g, " ")}`;
  } finally {
    clearTimeout(timer);
  }
}

/** Runs every check in order, emitting one line each; resolves true when none failed. */
export async function runChecks(env: CheckEnv, emit: (line: string) => void | Promise<void>): Promise<boolean> {
  const client = createClient(Matrix, env.channel);
  let passed = true;
  for (const check of CHECKS) {
    const reason = env.skip?.[check.name];
    const line = reason !== undefined ? `skip ${check.name}: ${reason}` : await runOne(check, env, client);
    if (line.startsWith("FAIL ")) passed = false;
    await emit(line);
  }
  return passed;
}
