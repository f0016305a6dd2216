/**
 * Typed service clients from protobuf-es v2 service descriptors (the `GenService` constants
 * that `protoc-gen-es` writes): `createClient(Store, channel).get({key: "a"})`, in the
 * conventions of connect-es.
 * @module
 */
import { create, fromBinary, toBinary, type DescMessage, type DescMethod, type DescService, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import type { CallOptions, Channel, ClientCall } from "./channel.js";
import { Code, TopspinError } from "./status.js";

/** The full method name of §5.2: `/package.Service/Method`. */
export function methodPath(m: DescMethod): string {
  return `/${m.parent.typeName}/${m.name}`;
}

type Init<D extends DescMessage> = MessageInitShape<D>;
type Out<D extends DescMessage> = MessageShape<D>;

/** The function a client has for one method, by its kind. */
export type ClientMethod<M> = M extends { methodKind: "unary"; input: infer I extends DescMessage; output: infer O extends DescMessage }
  ? (request: Init<I>, options?: CallOptions) => Promise<Out<O>>
  : M extends { methodKind: "server_streaming"; input: infer I extends DescMessage; output: infer O extends DescMessage }
    ? (request: Init<I>, options?: CallOptions) => AsyncIterable<Out<O>>
    : M extends { methodKind: "client_streaming"; input: infer I extends DescMessage; output: infer O extends DescMessage }
      ? (requests: AsyncIterable<Init<I>> | Iterable<Init<I>>, options?: CallOptions) => Promise<Out<O>>
      : M extends { methodKind: "bidi_streaming"; input: infer I extends DescMessage; output: infer O extends DescMessage }
        ? (requests: AsyncIterable<Init<I>> | Iterable<Init<I>>, options?: CallOptions) => AsyncIterable<Out<O>>
        : never;

/** A typed client: one function per method of the service, named by its `localName`. */
export type Client<S extends DescService> = { [K in keyof S["method"]]: ClientMethod<S["method"][K]> };

function encode<D extends DescMessage>(schema: D, m: Init<D>): Uint8Array {
  return toBinary(schema, create(schema, m));
}

function decode<D extends DescMessage>(schema: D, b: Uint8Array): Out<D> {
  try {
    return fromBinary(schema, b);
  } catch (e) {
    throw new TopspinError(Code.INTERNAL, `cannot decode ${schema.typeName}: ${String(e)}`);
  }
}

/** Sends every message of `requests`, then half-closes; cancels the call if the source throws. */
async function pumpRequests<D extends DescMessage>(call: ClientCall, schema: D, requests: AsyncIterable<Init<D>> | Iterable<Init<D>>): Promise<void> {
  try {
    for await (const r of requests) {
      if (call.done) return;
      await call.send(encode(schema, r));
    }
    call.halfClose();
  } catch (e) {
    if (!call.done) call.cancel(Code.CANCELLED, `the request stream failed: ${String(e)}`);
  }
}

async function single<D extends DescMessage>(call: ClientCall, schema: D): Promise<Out<D>> {
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
  return decode(schema, first);
}

async function* many<D extends DescMessage>(call: ClientCall, schema: D): AsyncGenerator<Out<D>> {
  try {
    for (;;) {
      const m = await call.receive();
      if (m === undefined) break;
      yield decode(schema, m);
    }
    await call.end();
  } finally {
    // The caller stopped reading early (break / return): cancel the call.
    if (!call.done) call.cancel(Code.CANCELLED, "the caller stopped reading the response stream");
  }
}

/** Creates a typed client for `service` on `channel`. */
export function createClient<S extends DescService>(service: S, channel: Channel): Client<S> {
  const client: Record<string, unknown> = {};
  for (const m of service.methods) {
    const path = methodPath(m);
    switch (m.methodKind) {
      case "unary":
        client[m.localName] = async (req: Init<DescMessage>, opts?: CallOptions) => {
          const call = await channel.start(path, opts);
          await call.send(encode(m.input, req), true);
          return single(call, m.output);
        };
        break;
      case "server_streaming":
        client[m.localName] = (req: Init<DescMessage>, opts?: CallOptions) =>
          (async function* () {
            const call = await channel.start(path, opts);
            await call.send(encode(m.input, req), true);
            yield* many(call, m.output);
          })();
        break;
      case "client_streaming":
        client[m.localName] = async (reqs: AsyncIterable<Init<DescMessage>>, opts?: CallOptions) => {
          const call = await channel.start(path, opts);
          void pumpRequests(call, m.input, reqs);
          return single(call, m.output);
        };
        break;
      case "bidi_streaming":
        client[m.localName] = (reqs: AsyncIterable<Init<DescMessage>>, opts?: CallOptions) =>
          (async function* () {
            const call = await channel.start(path, opts);
            void pumpRequests(call, m.input, reqs);
            yield* many(call, m.output);
          })();
        break;
    }
  }
  return client as Client<S>;
}
