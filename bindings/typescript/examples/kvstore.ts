// The kv.v1.Store service of examples/kvstore, implemented on the Node server: every call kind.
// Run: node dist/examples/kvstore.js tcp://127.0.0.1:50052 (native topspin and gRPC on one port, with
// health and reflection: `topspin list 127.0.0.1:50052`, `grpcurl -plaintext 127.0.0.1:50052 list`)
import { create } from "@bufbuild/protobuf";
import { Code, TopspinError } from "../src/index.js";
import { Server, ServingStatus, type HandlerContext, type ServiceImpl } from "../src/node/index.js";
import { EntrySchema, EventSchema, Store, type Entry, type Event } from "../gen/kv/v1/kv_pb.js";

/** An in-memory implementation of kv.v1.Store. */
export function kvStore(stats: { watching: number; ended?: unknown[] } = { watching: 0 }): ServiceImpl<typeof Store> {
  const map = new Map<string, Entry>();
  const watchers = new Set<{ prefix: string; push: (e: Event) => void }>();
  const notify = (key: string, e: Event): void => {
    for (const w of watchers) if (key.startsWith(w.prefix)) w.push(e);
  };
  const put = (key: string, value: string, expected?: bigint): bigint => {
    if (key === "") throw new TopspinError(Code.INVALID_ARGUMENT, "the key is empty");
    const old = map.get(key);
    if (expected !== undefined && (old?.version ?? 0n) !== expected) {
      throw new TopspinError(Code.FAILED_PRECONDITION, `key ${JSON.stringify(key)} is at version ${old?.version ?? 0n}, not ${expected}`);
    }
    const entry = create(EntrySchema, { key, value, version: (old?.version ?? 0n) + 1n });
    map.set(key, entry);
    notify(key, create(EventSchema, { kind: { case: "put", value: entry } }));
    return entry.version;
  };
  const del = (key: string): boolean => {
    const had = map.delete(key);
    if (had) notify(key, create(EventSchema, { kind: { case: "deleted", value: key } }));
    return had;
  };
  const get = (key: string): Entry => {
    const e = map.get(key);
    if (e === undefined) throw new TopspinError(Code.NOT_FOUND, `no key ${JSON.stringify(key)}`);
    return e;
  };
  return {
    get: (req) => get(req.key),
    put: (req) => ({ version: put(req.key, req.value, req.expectedVersion) }),
    delete: (req) => ({ existed: del(req.key) }),
    async *watch(req, ctx: HandlerContext) {
      const queue: Event[] = [];
      let wake: (() => void) | null = null;
      const w = { prefix: req.prefix, push: (e: Event) => (queue.push(e), wake?.()) };
      watchers.add(w);
      stats.watching++;
      try {
        if (req.includeExisting) {
          for (const e of [...map.values()].filter((e) => e.key.startsWith(req.prefix))) yield { kind: { case: "put" as const, value: e } };
        }
        while (!ctx.signal.aborted) {
          const e = queue.shift();
          if (e) yield e;
          else
            await new Promise<void>((r) => {
              wake = r;
              ctx.signal.addEventListener("abort", () => r(), { once: true });
            });
        }
      } finally {
        stats.ended?.push(ctx.signal.reason);
        stats.watching--;
        watchers.delete(w);
      }
    },
    async apply(reqs) {
      let puts = 0;
      let deletes = 0;
      for await (const m of reqs) {
        if (m.op.case === "put") {
          put(m.op.value.key, m.op.value.value, m.op.value.expectedVersion);
          puts++;
        } else if (m.op.case === "delete" && del(m.op.value.key)) deletes++;
      }
      return { puts, deletes };
    },
    async *getMany(reqs) {
      for await (const r of reqs) yield get(r.key);
    },
  };
}

if (import.meta.url === `file://${process.argv[1] ?? ""}`) {
  // Usage: node dist/examples/kvstore.js ADDRESS [ORIGIN…]: on ws://, web pages of these
  // origins may call (besides same-origin ones; e.g. http://127.0.0.1:8080 for examples/web.ts).
  const address = process.argv[2] ?? "tcp://127.0.0.1:50052";
  const server = new Server({ webSocket: { allowedOrigins: process.argv.slice(3) } }).service(Store, kvStore());
  // grpc.health.v1 ("" and kv.v1.Store SERVING) and reflection, for `topspin list|describe|health`,
  // grpcurl and Kubernetes gRPC probes; on tcp:// and unix:// gRPC clients share the port.
  server.addHealth().setStatus("kv.v1.Store", ServingStatus.SERVING);
  server.addReflection();
  const bound = await server.listen(address);
  console.log(`listening on ${bound}`);
  process.on("SIGTERM", () => void server.close(2000).then(() => process.exit(0)));
  process.on("SIGINT", () => void server.close(2000).then(() => process.exit(0)));
}
