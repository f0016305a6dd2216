/**
 * The Node server's interceptors: a route's handler wrapped in the chain, so that every face
 * that runs the route (native TCP/Unix, WebSocket, gRPC) runs the chain once per call.
 * @module
 */
import { applyInterceptors, onlyMessage, streamOf, type AnyFn, type Interceptor, type InterceptorRequest, type InterceptorResponse } from "../interceptor.js";
import { Code } from "../status.js";
import type { HandlerContext, Route } from "./server.js";

/** `ctx` with other request metadata (an interceptor passed `next` a request with another array). */
function withHeaders(ctx: HandlerContext, header: InterceptorRequest["header"]): HandlerContext {
  if (header === ctx.requestHeaders) return ctx;
  return Object.create(ctx, { requestHeaders: { value: header, enumerable: true } }) as HandlerContext;
}

/** The handler's input for the route's kind (a stream, or its one message). */
function inputOf(route: Route, req: InterceptorRequest): unknown {
  const many = route.kind === "client_streaming" || route.kind === "bidi_streaming";
  if (many) return req.stream ? req.message : streamOf(req.message);
  // a promise when the one message must be taken from a stream
  return req.stream ? onlyMessage(req.message, `a ${route.kind.replace("_", "-")} request`, Code.INVALID_ARGUMENT) : req.message;
}

/** The innermost function of a call's chain: the route's handler. */
function handlerFn(method: string, route: Route, ctx: HandlerContext): AnyFn {
  return async (req): Promise<InterceptorResponse> => {
    const common = { method, kind: route.kind, descriptor: route.descriptor, header: ctx.responseHeaders, trailer: ctx.responseTrailers };
    const out = route.handler(await inputOf(route, req), withHeaders(ctx, req.header));
    switch (route.kind) {
      case "unary":
        return { ...common, stream: false, message: await out };
      case "client_streaming":
        return { ...common, stream: true, message: streamOf(await out) };
      default:
        return { ...common, stream: true, message: out as AsyncIterable<unknown> };
    }
  };
}

/** The request the chain starts with. */
function requestOf(method: string, route: Route, input: unknown, ctx: HandlerContext): InterceptorRequest {
  const base = {
    method,
    kind: route.kind,
    descriptor: route.descriptor,
    header: ctx.requestHeaders,
    // read lazily: the native face makes a call's AbortController only when asked for it
    get signal(): AbortSignal {
      return ctx.signal;
    },
    timeoutMs: ctx.deadline === undefined ? undefined : Math.max(0, ctx.deadline - Date.now()),
  };
  if (route.kind === "unary") return Object.assign(base, { stream: false as const, message: input });
  const message = route.kind === "server_streaming" ? streamOf(input) : (input as AsyncIterable<unknown>);
  return Object.assign(base, { stream: true as const, message });
}

async function* messagesOf(res: Promise<InterceptorResponse>): AsyncGenerator<unknown> {
  const r = await res;
  if (r.stream) yield* r.message;
  else yield r.message;
}

/** `route` with its handler run through `interceptors` (the first outermost); as is when there are none. */
export function interceptRoute(method: string, route: Route, interceptors: readonly Interceptor[] | undefined): Route {
  if (interceptors === undefined || interceptors.length === 0) return route;
  const handler = (input: unknown, ctx: HandlerContext): unknown => {
    const res = applyInterceptors(handlerFn(method, route, ctx), interceptors)(requestOf(method, route, input, ctx));
    if (route.kind === "server_streaming" || route.kind === "bidi_streaming") return messagesOf(res);
    return res.then((r) => (r.stream ? onlyMessage(r.message, `a ${route.kind.replace("_", "-")} response`, Code.INTERNAL) : r.message));
  };
  return { ...route, handler };
}
