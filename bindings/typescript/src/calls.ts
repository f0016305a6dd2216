/**
 * Calls of the four kinds on a {@link Channel}, through the channel's interceptors: the layer
 * under the typed clients (`createClient`), also usable on raw bytes (`rawMethod`).
 * @module
 */
import type { DescMethod } from "@bufbuild/protobuf";
import { toMetadata, type CallOptions, type Channel, type ClientCall } from "./channel.js";
import { Code, TopspinError } from "./status.js";
import type { Metadata } from "./frame.js";
import { applyInterceptors, onlyMessage, streamOf, type AnyFn, type InterceptorRequest, type Interceptor, type InterceptorResponse, type MethodKind } from "./interceptor.js";

/** One method: its name, kind, and how its messages become bytes and back. */
export interface MethodCodec<I, O> {
  /** The full method name, `/package.Service/Method`. */
  readonly method: string;
  readonly kind: MethodKind;
  /** The protobuf-es descriptor, when there is one (shown to interceptors). */
  readonly descriptor?: DescMethod;
  encode(message: I): Uint8Array;
  decode(bytes: Uint8Array): O;
  /** Turns each request message into what interceptors see (typed clients: `create`). */
  prepare?(message: I): I;
  /** Interceptors of this method's calls outside the channel's (a typed client's own). */
  readonly interceptors?: readonly Interceptor[];
}

/** A method on raw bytes (no codec): for {@link unaryCall} and the others without generated code. */
export function rawMethod(method: string, kind: MethodKind): MethodCodec<Uint8Array, Uint8Array> {
  return { method, kind, encode: (b) => b, decode: (b) => b };
}

/** The signal of a call the caller gave none (never aborted). */
const NO_SIGNAL = new AbortController().signal;

/** Sends every message of `requests`, then half-closes; cancels the call if the source throws. */
async function pumpRequests<I>(call: ClientCall, m: MethodCodec<I, unknown>, requests: AsyncIterable<I> | Iterable<I>): Promise<void> {
  try {
    for await (const r of requests) {
      if (call.done) return;
      await call.send(m.encode(r));
    }
    call.halfClose();
  } catch (e) {
    if (!call.done) call.cancel(Code.CANCELLED, `the request stream failed: ${String(e)}`);
  }
}

/** The one response message of a unary call. */
async function single<O>(call: ClientCall, m: MethodCodec<unknown, O>): Promise<O> {
  const first = await call.receive();
  if (first === undefined) {
    await call.end();
    throw new TopspinError(Code.INTERNAL, "the server answered without a message", call.trailers);
  }
  const extra = await call.receive();
  if (extra !== undefined) {
    call.cancel(Code.INTERNAL, "the server answered with more than one message");
    throw new TopspinError(Code.INTERNAL, "the server answered with more than one message");
  }
  await call.end();
  return m.decode(first);
}

/** The response messages of a streaming call; stopping early cancels the call. */
async function* responses<O>(call: ClientCall, m: MethodCodec<unknown, O>, trailer: Metadata): AsyncGenerator<O> {
  try {
    for (;;) {
      const b = await call.receive();
      if (b === undefined) break;
      yield m.decode(b);
    }
    await call.end();
  } finally {
    // The caller stopped reading early (break / return): cancel the call.
    if (!call.done) call.cancel(Code.CANCELLED, "the caller stopped reading the response stream");
    trailer.push(...call.trailers);
  }
}

async function* asAsync<T>(messages: AsyncIterable<T> | Iterable<T>, prepare: ((m: T) => T) | undefined): AsyncGenerator<T> {
  if (prepare === undefined) yield* messages;
  else for await (const m of messages) yield prepare(m);
}

/** The response's metadata: arrays filled in place as the call goes (a copy `{ ...res }` sees them too). */
interface ResponseMetadata {
  header: Metadata;
  trailer: Metadata;
}

/** The innermost function of the chain: the call on the wire. */
function transport<I, O>(channel: Channel, m: MethodCodec<I, O>, opts: CallOptions): AnyFn {
  return async (req) => {
    const md: ResponseMetadata = { header: [], trailer: [] };
    // NO_SIGNAL is never aborted: not listened to (calls without a signal would pile listeners on it)
    const signal = req.signal === NO_SIGNAL ? undefined : req.signal;
    const onHeader = (h: Metadata): void => {
      md.header.push(...h);
      opts.onHeader?.(h);
    };
    const callOpts: CallOptions = { ...opts, headers: req.header, signal, timeoutMs: req.timeoutMs, onHeader };
    if (m.kind === "unary" || m.kind === "server_streaming") {
      // the one request message is taken before the call starts (a bad stream starts nothing)
      const what = m.kind === "unary" ? "a unary request" : "a server-streaming request";
      const one = (req.stream ? await onlyMessage(req.message, what, Code.INVALID_ARGUMENT) : req.message) as I;
      const call = await channel.start(req.method, callOpts);
      await call.send(m.encode(one), true);
      if (m.kind === "unary") {
        const message = await single(call, m);
        md.trailer.push(...call.trailers);
        return { stream: false, message, method: req.method, kind: m.kind, descriptor: m.descriptor, ...md };
      }
      return { stream: true, message: responses(call, m, md.trailer), method: req.method, kind: m.kind, descriptor: m.descriptor, ...md };
    }
    const call = await channel.start(req.method, callOpts);
    void pumpRequests(call, m, (req.stream ? req.message : [req.message]) as AsyncIterable<I> | I[]);
    return { stream: true, message: responses(call, m, md.trailer), method: req.method, kind: m.kind, descriptor: m.descriptor, ...md };
  };
}

function request(m: MethodCodec<unknown, unknown>, message: unknown, opts: CallOptions): InterceptorRequest {
  const common = { method: m.method, kind: m.kind, descriptor: m.descriptor, header: toMetadata(opts.headers), signal: opts.signal ?? NO_SIGNAL, timeoutMs: opts.timeoutMs };
  return m.kind === "unary" ? { ...common, stream: false, message } : { ...common, stream: true, message: message as AsyncIterable<unknown> };
}

function invoke<I, O>(channel: Channel, m: MethodCodec<I, O>, message: unknown, opts: CallOptions): Promise<InterceptorResponse> {
  const inner = transport(channel, m, opts);
  const own = m.interceptors ?? [];
  const all = own.length === 0 ? channel.interceptors : [...own, ...channel.interceptors];
  const fn = all.length === 0 ? inner : applyInterceptors(inner, all);
  return fn(request(m, message, opts));
}

/** A unary call. */
export async function unaryCall<I, O>(channel: Channel, m: MethodCodec<I, O>, message: I, opts: CallOptions = {}): Promise<O> {
  const res = await invoke(channel, m, m.prepare ? m.prepare(message) : message, opts);
  return (res.stream ? await onlyMessage(res.message, "a unary response", Code.INTERNAL) : res.message) as O;
}

/** A server-streaming call: `for await` over the answers; stopping early cancels it. */
export async function* serverStreamCall<I, O>(channel: Channel, m: MethodCodec<I, O>, message: I, opts: CallOptions = {}): AsyncGenerator<O> {
  const res = await invoke(channel, m, streamOf(m.prepare ? m.prepare(message) : message), opts);
  if (res.stream) yield* res.message as AsyncIterable<O>;
  else yield res.message as O;
}

/** A client-streaming call from any (async) iterable. */
export async function clientStreamCall<I, O>(channel: Channel, m: MethodCodec<I, O>, messages: AsyncIterable<I> | Iterable<I>, opts: CallOptions = {}): Promise<O> {
  const res = await invoke(channel, m, asAsync(messages, m.prepare?.bind(m)), opts);
  return (res.stream ? await onlyMessage(res.message, "a client-streaming response", Code.INTERNAL) : res.message) as O;
}

/** A bidi-streaming call: requests from any (async) iterable, `for await` over the answers. */
export async function* bidiStreamCall<I, O>(channel: Channel, m: MethodCodec<I, O>, messages: AsyncIterable<I> | Iterable<I>, opts: CallOptions = {}): AsyncGenerator<O> {
  const res = await invoke(channel, m, asAsync(messages, m.prepare?.bind(m)), opts);
  if (res.stream) yield* res.message as AsyncIterable<O>;
  else yield res.message as O;
}
