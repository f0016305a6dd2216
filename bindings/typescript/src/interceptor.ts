/**
 * Interceptors in the shape of connect-es: `(next) => async (req) => { …; return await next(req); }`,
 * for clients (`interceptors` of a `Channel`'s options) and for the Node server
 * (`interceptors` of its `ServerOptions`). In an array, the first is the outermost layer.
 *
 * As in connect-es, only a unary call has `stream: false`; server-, client- and bidi-streaming
 * calls have a request and a response that are streams (`message` is an `AsyncIterable`; a
 * server-streaming request and a client-streaming response are streams of one message).
 * @module
 */
import type { DescMethod } from "@bufbuild/protobuf";
import type { Metadata } from "./frame.js";
import { TopspinError, type Code } from "./status.js";

/** The four kinds of call. */
export type MethodKind = "unary" | "server_streaming" | "client_streaming" | "bidi_streaming";

/** What every request of an interceptor chain has. */
export interface InterceptorRequestCommon {
  /** The full method name of §5.2, `/package.Service/Method`. */
  readonly method: string;
  /** The call's kind. */
  readonly kind: MethodKind;
  /** The method's protobuf-es descriptor, when the call has one (typed clients, `server.service`). */
  readonly descriptor: DescMethod | undefined;
  /**
   * Request metadata. Add entries in place (`req.header.push(…)`), or pass `next` a request with
   * another array.
   */
  readonly header: Metadata;
  /** The call's signal: the caller's (client), aborted on cancel, deadline or loss (server). */
  readonly signal: AbortSignal;
  /** Client: the call's `timeoutMs`; server: what was left of the client's deadline at the call's start. */
  readonly timeoutMs: number | undefined;
}

/** A request with one message: a unary call. */
export interface UnaryRequest<I = unknown> extends InterceptorRequestCommon {
  readonly stream: false;
  readonly message: I;
}

/** A request whose messages are a stream (server-, client- and bidi-streaming calls). */
export interface StreamRequest<I = unknown> extends InterceptorRequestCommon {
  readonly stream: true;
  readonly message: AsyncIterable<I>;
}

/** What every response of an interceptor chain has. */
export interface InterceptorResponseCommon {
  /** The full method name. */
  readonly method: string;
  /** The call's kind. */
  readonly kind: MethodKind;
  /** The method's protobuf-es descriptor, when the call has one. */
  readonly descriptor: DescMethod | undefined;
  /**
   * Response headers. Client: those received, added to this array as they arrive (a stream's
   * `next` resolves once the call started, before the server's headers). Server: the handler's `ctx.responseHeaders`, which
   * an interceptor may add to until the first response message is sent.
   */
  readonly header: Metadata;
  /**
   * Trailers. Client: added to this array once the response (stream) has been read to its end
   * (a failed call's are in its `TopspinError.trailers`). Server: the
   * handler's `ctx.responseTrailers`, which an interceptor may add to until the status is sent.
   */
  readonly trailer: Metadata;
}

/** A response with one message: a unary call. */
export interface UnaryResponse<O = unknown> extends InterceptorResponseCommon {
  readonly stream: false;
  readonly message: O;
}

/** A response whose messages are a stream; its end (or error) is the call's end. */
export interface StreamResponse<O = unknown> extends InterceptorResponseCommon {
  readonly stream: true;
  readonly message: AsyncIterable<O>;
}

/** Either request. */
export type InterceptorRequest = UnaryRequest | StreamRequest;
/** Either response. */
export type InterceptorResponse = UnaryResponse | StreamResponse;

/** One call, as an interceptor sees it: the request in, the response (or a `TopspinError`) out. */
export type AnyFn = (req: InterceptorRequest) => Promise<InterceptorResponse>;

/**
 * An interceptor wraps the rest of the chain (`next`). It may read or change the request
 * (metadata, messages), throw a `TopspinError` instead of calling `next` (the call then fails
 * with its code, message and details and, on a server, the handler does not run), and look at
 * the response and the call's outcome: a unary call's `await next(req)` rejects with the call's
 * error; a stream's outcome is the end or error of iterating `message`.
 */
export type Interceptor = (next: AnyFn) => AnyFn;

/** Wraps `next` in `interceptors`, the first outermost (as connect-es). */
export function applyInterceptors(next: AnyFn, interceptors: readonly Interceptor[] | undefined): AnyFn {
  if (interceptors === undefined) return next;
  let fn = next;
  for (let i = interceptors.length - 1; i >= 0; i--) fn = (interceptors[i] as Interceptor)(fn);
  return fn;
}

/** A stream of one value. */
export async function* streamOf<T>(value: T | Promise<T>): AsyncGenerator<T> {
  yield await value;
}

/**
 * The one message of a stream that must have exactly one (`what` names it in the error): throws
 * `errorCode`'s `TopspinError` when there is none or more (the stream is then closed).
 */
export async function onlyMessage<T>(stream: AsyncIterable<T>, what: string, errorCode: Code): Promise<T> {
  const it = stream[Symbol.asyncIterator]();
  const first = await it.next();
  if (first.done === true) throw new TopspinError(errorCode, `${what} needs exactly one message, got none`);
  const more = await it.next();
  if (more.done !== true) {
    await it.return?.();
    throw new TopspinError(errorCode, `${what} needs exactly one message, got more`);
  }
  return first.value;
}
