// A web page calling kv.v1.Store over WebSocket, with a bidirectional stream: each key typed in
// the form goes up the open GetMany call, each answer comes down it and is listed.
// Bundled and served by examples/web.ts; the server's address is the page's ?ws= parameter.
import { AsyncQueue, Channel, Code, TopspinError, createClient, webSocketDialer } from "../src/index.js";
import { Store } from "../gen/kv/v1/kv_pb.js";

const url = new URLSearchParams(location.search).get("ws") ?? "ws://127.0.0.1:50051/topspin";
const kv = createClient(Store, new Channel({ dial: webSocketDialer(url) }));
const form = document.querySelector("form") as HTMLFormElement;
const input = document.querySelector("input") as HTMLInputElement;
const log = (line: string): void => {
  const li = document.createElement("li");
  li.textContent = line;
  document.querySelector("ol")?.append(li);
};

// Unary calls, awaited.
await kv.put({ key: "greeting", value: "hello from topspin" });
await kv.put({ key: "language", value: "TypeScript, in a browser" });

// The request stream: any (async) iterable; here a queue the form pushes to.
const keys = new AsyncQueue<{ key: string }>();
form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  keys.push({ key: input.value });
  input.value = "";
});
log("ready: type greeting or language");
try {
  for await (const entry of kv.getMany(keys)) log(`${entry.key} = ${entry.value} (version ${entry.version})`);
} catch (e) {
  // A key the server does not have ends the stream with NOT_FOUND.
  log(e instanceof TopspinError ? `ended: ${Code[e.code]}: ${e.rawMessage}` : String(e));
}
