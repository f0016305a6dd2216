/**
 * Typed service clients from protobuf-es v2 service descriptors (the `GenService` constants
 * that `protoc-gen-es` writes): `createClient(Store, channel).get({key: "a"})`, in the
 * conventions of connect-es.
 * @module
 */
import { create, fromBinary, toBinary, type DescMessage, type DescMethod, type DescService, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import type { CallOptions, Channel } from "./channel.js";
import { bidiStreamCall, clientStreamCall, serverStreamCall, unaryCall, type MethodCodec } from "./calls.js";
import { Code, TopspinError } from "./status.js";
import type { Interceptor } from "./interceptor.js";

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

function decode<D extends DescMessage>(schema: D, b: Uint8Array): Out<D> {
  try {
    return fromBinary(schema, b);
  } catch (e) {
    throw new TopspinError(Code.INTERNAL, `cannot decode ${schema.typeName}: ${String(e)}`);
  }
}

/**
 * The codec of a protobuf-es method: request messages are made (`create`) before interceptors
 * see them (as connect-es), responses decoded; `interceptors` run outside the channel's.
 */
export function methodCodec(m: DescMethod, interceptors?: readonly Interceptor[]): MethodCodec<Init<DescMessage>, Out<DescMessage>> {
  return {
    method: methodPath(m),
    kind: m.methodKind,
    descriptor: m,
    // create() returns a message of the schema as it is (an interceptor may have passed an init object)
    encode: (v) => toBinary(m.input, create(m.input, v)),
    decode: (b) => decode(m.output, b),
    prepare: (v) => create(m.input, v),
    interceptors,
  };
}

/** Options of a typed client. */
export interface ClientOptions {
  /** Interceptors of this client's calls, outside (before) the channel's; the first outermost. */
  interceptors?: Interceptor[];
}

/**
 * Creates a typed client for `service` on `channel`. Its calls go through `options.interceptors`
 * and then the channel's, which see request messages made with `create` and response messages
 * decoded.
 */
export function createClient<S extends DescService>(service: S, channel: Channel, options: ClientOptions = {}): Client<S> {
  const client: Record<string, unknown> = {};
  for (const m of service.methods) {
    const codec = methodCodec(m, options.interceptors);
    type Reqs = AsyncIterable<Init<DescMessage>> | Iterable<Init<DescMessage>>;
    switch (m.methodKind) {
      case "unary":
        client[m.localName] = (req: Init<DescMessage>, opts?: CallOptions) => unaryCall(channel, codec, req, opts);
        break;
      case "server_streaming":
        client[m.localName] = (req: Init<DescMessage>, opts?: CallOptions) => serverStreamCall(channel, codec, req, opts);
        break;
      case "client_streaming":
        client[m.localName] = (reqs: Reqs, opts?: CallOptions) => clientStreamCall(channel, codec, reqs, opts);
        break;
      case "bidi_streaming":
        client[m.localName] = (reqs: Reqs, opts?: CallOptions) => bidiStreamCall(channel, codec, reqs, opts);
        break;
    }
  }
  return client as Client<S>;
}
