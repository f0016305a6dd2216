// Interceptors, in the shape of connect-es's, on a Node server and on a client.
// Run: node dist/examples/interceptors.js
import { Code, TopspinError, createClient, type Interceptor } from "../src/index.js";
import { Server, connect } from "../src/node/index.js";
import { Store } from "../gen/kv/v1/kv_pb.js";
import { kvStore } from "./kvstore.js";

// Server: log each call's method, outcome and time (a stream's when it ends) ...
const logger: Interceptor = (next) => async (req) => {
  const t0 = performance.now();
  const log = (outcome: string): void => console.log(`server: ${req.method} ${outcome} in ${(performance.now() - t0).toFixed(1)} ms`);
  const codeOf = (e: unknown): string => Code[TopspinError.from(e).code] ?? "?";
  try {
    const res = await next(req);
    if (!res.stream) {
      log("OK");
      return res;
    }
    const counted = async function* () {
      let n = 0;
      try {
        for await (const m of res.message) {
          n++;
          yield m;
        }
        log(`OK after ${n} messages`);
      } catch (e) {
        log(`${codeOf(e)} after ${n} messages`);
        throw e;
      }
    };
    return { ...res, message: counted() };
  } catch (e) {
    log(codeOf(e));
    throw e;
  }
};

// ... and refuse calls without the token: the handler does not run.
const auth: Interceptor = (next) => async (req) => {
  const token = req.header.find((m) => m.key === "authorization")?.value;
  if (token !== "Bearer s3cret") throw new TopspinError(Code.UNAUTHENTICATED, "who are you?");
  return next(req);
};

// Client: add the token to every call's metadata.
const withToken: Interceptor = (next) => (req) => next({ ...req, header: [...req.header, { key: "authorization", value: "Bearer s3cret" }] });

const server = new Server({ interceptors: [logger, auth] }).service(Store, kvStore()); // first = outermost
const address = await server.listen("tcp://127.0.0.1:0");
const channel = connect(address, { interceptors: [withToken] });
const kv = createClient(Store, channel);
await kv.put({ key: "a", value: "1" });
for await (const e of kv.getMany([{ key: "a" }, { key: "a" }])) console.log(`client: got ${e.key} = ${e.value}`);

const anonymous = connect(address);
try {
  await createClient(Store, anonymous).get({ key: "a" });
} catch (e) {
  if (e instanceof TopspinError) console.log(`client: ${Code[e.code]}: ${e.rawMessage}`);
}
channel.close();
anonymous.close();
await server.close(1000);
