// Quick start: a typed client for kv.v1.Store (examples/kvstore/proto) on any topspin server.
// Usage: node dist/examples/quickstart.js tcp://127.0.0.1:50051   (or unix:///path, ws://host:port/path)
import { Code, TopspinError, createClient } from "../src/index.js";
import { connect } from "../src/node/index.js";
import { Store } from "../gen/kv/v1/kv_pb.js";

const channel = connect(process.argv[2] ?? "tcp://127.0.0.1:50051");
const kv = createClient(Store, channel);

// Unary, with a deadline and request metadata.
const { version } = await kv.put({ key: "greeting", value: "hello" }, { timeoutMs: 1000, headers: { user: "ann" } });
const entry = await kv.get({ key: "greeting" });
console.log(`get: ${entry.key} = ${entry.value} (version ${version})`);

// Errors are TopspinError with a code.
try {
  await kv.get({ key: "nope" });
} catch (e) {
  if (e instanceof TopspinError && e.code === Code.NOT_FOUND) console.log(`error: ${Code[e.code]}: ${e.rawMessage}`);
  else throw e;
}

// Client streaming from any (async) iterable.
const summary = await kv.apply([
  { op: { case: "put", value: { key: "a", value: "1" } } },
  { op: { case: "delete", value: { key: "a" } } },
]);
console.log(`apply: ${summary.puts} put, ${summary.deletes} deleted`);

// Bidirectional streaming: for await over the answers.
for await (const e of kv.getMany([{ key: "greeting" }, { key: "greeting" }])) console.log(`getMany: ${e.value}`);

// Server streaming, cancelled with an AbortSignal (CANCEL on the wire).
const stop = new AbortController();
try {
  for await (const ev of kv.watch({ prefix: "greet", includeExisting: true }, { signal: stop.signal })) {
    console.log(`watch: ${ev.kind.case} ${ev.kind.case === "put" ? ev.kind.value.key : ""}`);
    stop.abort();
  }
} catch (e) {
  if (!(e instanceof TopspinError && e.code === Code.CANCELLED)) throw e;
  console.log("watch: cancelled");
}
channel.close();
