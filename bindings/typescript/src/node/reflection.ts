/**
 * Server reflection for the Node server (as the Rust `topspin-reflection` crate): the native
 * `topspin.reflection.v1.Reflection` (what the `topspin` CLI's `list`, `describe` and `call`
 * use) and gRPC's `grpc.reflection.v1` and `v1alpha` `ServerReflection` (grpcurl, Postman…),
 * describing the services registered with `server.service(…)` from their protobuf-es
 * descriptors: each file is its `FileDescriptorProto`, encoded, after the files it imports.
 * Like every route, all three are served on both faces.
 * @module
 */
import { create, fromBinary, toBinary, type DescFile, type DescService, type MessageInitShape } from "@bufbuild/protobuf";
import { nestedTypes } from "@bufbuild/protobuf/reflect";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { Code, TopspinError } from "../status.js";
import * as grpcV1 from "../gen/grpc/reflection/v1/reflection_pb.js";
import * as grpcV1alpha from "../gen/grpc/reflection/v1alpha/reflection_pb.js";
import { Reflection as TopspinReflection } from "../gen/topspin/reflection/v1/reflection_pb.js";
import type { ServiceImpl } from "./server.js";

export { TopspinReflection, grpcV1, grpcV1alpha };

/** The files of some services, by name and by the symbols they define. */
export class DescriptorIndex {
  private readonly files = new Map<string, DescFile>();
  private readonly symbols = new Map<string, DescFile>();
  private readonly services: DescService[] = [];

  constructor(services: Iterable<DescService>) {
    const seen = new Set<string>();
    for (const s of services) {
      if (seen.has(s.typeName)) continue;
      seen.add(s.typeName);
      this.services.push(s);
      this.addFile(s.file);
    }
    this.services.sort((a, b) => (a.typeName < b.typeName ? -1 : a.typeName > b.typeName ? 1 : 0));
  }

  private addFile(f: DescFile): void {
    const name = f.proto.name;
    if (this.files.has(name)) return;
    this.files.set(name, f);
    for (const d of f.dependencies) this.addFile(d);
    const visit = (types: Iterable<{ kind: string; typeName: string }>, nested: boolean): void => {
      for (const t of types) {
        this.symbols.set(t.typeName, f);
        if (t.kind === "service") for (const m of (t as DescService).methods) this.symbols.set(`${t.typeName}.${m.name}`, f);
        if (nested && t.kind === "message") visit(nestedTypes(t as Parameters<typeof nestedTypes>[0]), true);
      }
    };
    visit(nestedTypes(f), true);
  }

  /** The services, sorted by full name. */
  list(): readonly DescService[] {
    return this.services;
  }

  /** The file defining `symbol`: a service, method (`pkg.Svc.Method`, `pkg.Svc/Method`, `/pkg.Svc/Method`), message or enum. */
  fileOf(symbol: string): DescFile | undefined {
    return this.symbols.get(symbol.replace(/^[./]+/, "").replace("/", "."));
  }

  /** A file by its name (`kv/v1/kv.proto`). */
  fileByName(name: string): DescFile | undefined {
    return this.files.get(name);
  }

  /** `file` and every file it imports, encoded, each after its imports. */
  static withImports(file: DescFile): Uint8Array[] {
    const out: Uint8Array[] = [];
    const seen = new Set<string>();
    const visit = (f: DescFile): void => {
      if (seen.has(f.proto.name)) return;
      seen.add(f.proto.name);
      for (const d of f.dependencies) visit(d);
      out.push(toBinary(FileDescriptorProtoSchema, f.proto));
    };
    visit(file);
    return out;
  }
}

/** The native `topspin.reflection.v1.Reflection`; `index()` describes the server as it is now. */
export function topspinReflectionImpl(index: () => DescriptorIndex): ServiceImpl<typeof TopspinReflection> {
  return {
    listServices: () => ({
      services: index()
        .list()
        .filter((s) => !s.typeName.startsWith("grpc.reflection."))
        .map((s) => ({
          name: s.typeName,
          file: s.file.proto.name,
          methods: s.methods.map((m) => ({
            name: m.name,
            path: `/${s.typeName}/${m.name}`,
            clientStreaming: m.methodKind === "client_streaming" || m.methodKind === "bidi_streaming",
            serverStreaming: m.methodKind === "server_streaming" || m.methodKind === "bidi_streaming",
            inputType: m.input.typeName,
            outputType: m.output.typeName,
          })),
        })),
    }),
    fileContainingSymbol: (req) => {
      const f = index().fileOf(req.symbol);
      if (f === undefined) throw new TopspinError(Code.NOT_FOUND, `this server describes no service, method, message or enum named ${JSON.stringify(req.symbol)}`);
      return { files: DescriptorIndex.withImports(f) };
    },
    fileByName: (req) => {
      const f = index().fileByName(req.name);
      if (f === undefined) throw new TopspinError(Code.NOT_FOUND, `this server describes no file named ${JSON.stringify(req.name)}`);
      return { files: DescriptorIndex.withImports(f) };
    },
  };
}

type Answer = MessageInitShape<typeof grpcV1.ServerReflectionResponseSchema>["messageResponse"];

/** gRPC reflection's answer to one question (v1 and v1alpha have the same fields). */
function answer(ix: DescriptorIndex, q: grpcV1.ServerReflectionRequest["messageRequest"]): Answer {
  const notFound = (what: string): Answer => ({ case: "errorResponse", value: { errorCode: Code.NOT_FOUND, errorMessage: `this server describes no ${what}` } });
  const files = (f: DescFile | undefined, what: string): Answer =>
    f === undefined ? notFound(what) : { case: "fileDescriptorResponse", value: { fileDescriptorProto: DescriptorIndex.withImports(f) } };
  switch (q.case) {
    case "listServices":
      return { case: "listServicesResponse", value: { service: ix.list().map((s) => ({ name: s.typeName })) } };
    case "fileByFilename":
      return files(ix.fileByName(q.value), `file named ${JSON.stringify(q.value)}`);
    case "fileContainingSymbol":
      return files(ix.fileOf(q.value), `symbol named ${JSON.stringify(q.value)}`);
    case "fileContainingExtension":
      return notFound(`extension ${q.value.extensionNumber} of ${JSON.stringify(q.value.containingType)}`);
    case "allExtensionNumbersOfType":
      return ix.fileOf(q.value) === undefined
        ? notFound(`message named ${JSON.stringify(q.value)}`)
        : { case: "allExtensionNumbersResponse", value: { baseTypeName: q.value, extensionNumber: [] } };
    default:
      return { case: "errorResponse", value: { errorCode: Code.INVALID_ARGUMENT, errorMessage: "an empty reflection request" } };
  }
}

/** gRPC's `ServerReflectionInfo`: one answer per question, in order. */
async function* info(index: () => DescriptorIndex, questions: AsyncIterable<grpcV1.ServerReflectionRequest>): AsyncGenerator<grpcV1.ServerReflectionResponse> {
  for await (const q of questions) {
    yield create(grpcV1.ServerReflectionResponseSchema, { validHost: q.host, originalRequest: q, messageResponse: answer(index(), q.messageRequest) });
  }
}

/** gRPC's `grpc.reflection.v1.ServerReflection`. */
export function grpcReflectionV1Impl(index: () => DescriptorIndex): ServiceImpl<typeof grpcV1.ServerReflection> {
  return { serverReflectionInfo: (questions) => info(index, questions) };
}

/** gRPC's `grpc.reflection.v1alpha.ServerReflection`: v1's messages under the old names, the same wire, so re-encoded. */
export function grpcReflectionV1alphaImpl(index: () => DescriptorIndex): ServiceImpl<typeof grpcV1alpha.ServerReflection> {
  return {
    serverReflectionInfo: async function* (questions) {
      async function* asV1(): AsyncGenerator<grpcV1.ServerReflectionRequest> {
        for await (const q of questions) yield fromBinary(grpcV1.ServerReflectionRequestSchema, toBinary(grpcV1alpha.ServerReflectionRequestSchema, q));
      }
      for await (const a of info(index, asV1())) yield fromBinary(grpcV1alpha.ServerReflectionResponseSchema, toBinary(grpcV1.ServerReflectionResponseSchema, a));
    },
  };
}

/** The reflection services themselves, described too. */
export const REFLECTION_SERVICES: readonly DescService[] = [TopspinReflection, grpcV1.ServerReflection, grpcV1alpha.ServerReflection];
