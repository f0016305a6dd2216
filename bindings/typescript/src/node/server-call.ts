/**
 * One call on the Node server: its handler context, the decoded request stream, the sending of
 * responses (under the peer's credit and the connection's send buffer, §7) and the run of its
 * handler by kind. The `Server` (`server.ts`) starts calls, arms their deadlines and ends them.
 * @module
 */
import type { Connection, Event } from "../connection.js";
import type { Driver } from "../driver.js";
import type { Metadata } from "../frame.js";
import type { AsyncQueue } from "../queue.js";
import { Code, TopspinError } from "../status.js";
import { ENCODING_KEY, decodeMessage, encodeMessage, type Compression, type Decoder, type Encoder } from "../compression.js";
import type { HandlerContext, Route } from "./server.js";

/** @internal The server's state of one call. */
export interface ServerCall {
  id: number;
  input: AsyncQueue<Uint8Array>;
  credit: number[];
  /** Made when the handler first looks at `ctx.signal` (most never do). */
  abort: AbortController | null;
  /** Why the call ended early, once it did. */
  reason: TopspinError | null;
  done: boolean;
  writeWaiter: (() => void) | null;
  timer: ReturnType<typeof setTimeout> | undefined;
}

/** @internal What a call runs with: its route and the codecs negotiated for it (§15). */
export interface CallSetup {
  route: Route;
  /** The request messages' decoder (`null`: identity). */
  reqDecoder: Decoder | null;
  /** The response messages' encoder (`null`: identity). */
  respEncoder: Encoder | null;
  /** The server's `compression` option. */
  ours: Compression | undefined;
}

/** @internal How a handler's call reads and writes. */
export interface CallIO {
  /**
   * Sends the response headers once (with `topspin-encoding` when responses are compressed),
   * followed by `extra` (a failing status's headers, §5.4). Throws `RESOURCE_EXHAUSTED` when
   * they are over the client's limit (nothing sent).
   */
  sendHeaders(extra?: Metadata): void;
  /** The decoded request messages; each one taken gives its credit back. */
  inputs: AsyncGenerator<unknown>;
  /** Sends one response message, waiting for room and credit. */
  send(v: unknown): Promise<void>;
  /** The one request message of a unary or server-streaming call. */
  one(): Promise<unknown>;
}

/** The first string value of `key` in the metadata. */
export function metadataValue(md: Metadata, key: string): string | undefined {
  const v = md.find((m) => m.key === key)?.value;
  return typeof v === "string" ? v : undefined;
}

/** @internal The handler's context; its `signal` is made when first asked for. */
export function handlerContext(call: ServerCall, e: Extract<Event, { type: "CallStarted" }>, deadline: number | undefined): HandlerContext {
  return {
    method: e.method,
    requestHeaders: e.metadata,
    get signal(): AbortSignal {
      if (call.abort === null) {
        call.abort = new AbortController();
        if (call.reason !== null) call.abort.abort(call.reason);
      }
      return call.abort.signal;
    },
    deadline,
    responseHeaders: [],
    responseTrailers: [],
  };
}

/** @internal The call's reading and writing over the engine and its driver. */
export function callIO(engine: Connection, driver: Driver, call: ServerCall, setup: CallSetup, ctx: HandlerContext): CallIO {
  const { route, reqDecoder, respEncoder, ours } = setup;
  const limit = engine.local.maxMessageSize;
  let headersSent = false;
  const sendHeaders = (extra: Metadata = []): void => {
    if (headersSent) return;
    headersSent = true;
    const md = extra.length === 0 ? ctx.responseHeaders : [...ctx.responseHeaders, ...extra];
    if (respEncoder !== null && ours !== undefined) engine.sendHeaders(call.id, [...md, { key: ENCODING_KEY, value: ours }]);
    else if (md.length > 0) engine.sendHeaders(call.id, md);
  };
  const inputs = (async function* () {
    for (;;) {
      const r = await call.input.next();
      if (r.done) return;
      const due = call.credit.shift();
      if (due !== undefined && due > 0 && !call.done) {
        engine.consumed(call.id, due);
        driver.pump();
      }
      yield route.decode(reqDecoder === null ? r.value : await decodeMessage(r.value, reqDecoder, limit));
    }
  })();
  let answered = false;
  const send = async (v: unknown): Promise<void> => {
    // No response is produced while the peer does not read (§7): the wait comes before the
    // encoding, so calls waiting for room hold their values, not their encoded answers. While a
    // call waits for room for its first answer the connection is not read (Driver.firstRoom).
    // (the check and the encoding below run with no await between them: one call's turn)
    while (driver.full && !call.done) await (answered ? driver.room() : driver.firstRoom(() => call.done));
    answered = true;
    // A call that ended while it waited (its connection cut) encodes nothing for nobody.
    const over = (): TopspinError => call.reason ?? new TopspinError(Code.CANCELLED, "the call is over");
    if (call.done) throw over();
    const plain = route.encode(v);
    const bytes = respEncoder === null ? plain : await driver.produce(plain.length, () => (call.done ? Promise.reject(over()) : encodeMessage(plain, respEncoder)), () => call.done);
    sendHeaders();
    for (;;) {
      if (call.done) throw over();
      if (engine.sendMessage(call.id, bytes)) {
        driver.pump();
        return;
      }
      await new Promise<void>((r) => (call.writeWaiter = r));
    }
  };
  const one = async (): Promise<unknown> => {
    const first = await inputs.next();
    if (first.done) throw new TopspinError(Code.INVALID_ARGUMENT, "a unary request needs exactly one message, got none");
    const more = await inputs.next();
    if (!more.done) throw new TopspinError(Code.INVALID_ARGUMENT, "a unary request needs exactly one message, got more");
    return first.value;
  };
  return { sendHeaders, inputs, send, one };
}

/** @internal Runs the handler by its kind, sending what it returns. */
export async function runHandler(route: Route, io: CallIO, ctx: HandlerContext, driver: Driver, call: ServerCall): Promise<void> {
  await driver.firstRoom(() => call.done); // no new handler while the peer does not read (§7)
  if (call.done) return;
  const h = route.handler;
  switch (route.kind) {
    case "unary":
      await io.send(await h(await io.one(), ctx));
      break;
    case "client_streaming":
      await io.send(await h(io.inputs, ctx));
      break;
    case "server_streaming":
      for await (const v of h(await io.one(), ctx) as AsyncIterable<unknown>) await io.send(v);
      break;
    case "bidi_streaming":
      for await (const v of h(io.inputs, ctx) as AsyncIterable<unknown>) await io.send(v);
      break;
  }
}
