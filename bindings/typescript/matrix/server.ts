// The Node server of the cross-language matrix (testdata/matrix/README.md):
//   node dist/matrix/server.js --listen tcp://127.0.0.1:0 --listen unix:///tmp/m.sock --listen ws://127.0.0.1:0/
// serves matrix.v1.Matrix on every listener with the server's defaults (gzip requests accepted),
// prints `listening ADDR` per listener and runs until SIGTERM (then exits 0 within 2 s).
// WebSocket upgrades are accepted from every origin: the Chromium client's page is served from
// another port, which the default (same-origin only) would refuse.
import { Server } from "../src/node/server.js";
import { nodeCodecs } from "../src/node/gzip.js";
import { Matrix } from "../gen/matrix_pb.js";
import { CancelledTags, matrixImpl } from "./service.js";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { otelServerInterceptor } from "../src/otel.js";
import { setUpTracing } from "./tracing.js";

/** The `--listen` addresses of `argv`. */
function listenArgs(argv: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] ?? "";
    if (a === "--listen" && i + 1 < argv.length) out.push(argv[++i] ?? "");
    else if (a.startsWith("--listen=")) out.push(a.slice("--listen=".length));
    else throw new Error(`unknown argument ${a} (usage: server.js --listen ADDR [--listen ADDR…])`);
  }
  if (out.length === 0) throw new Error("no --listen ADDR given");
  return out;
}

async function main(): Promise<void> {
  let addresses: string[];
  try {
    addresses = listenArgs(process.argv.slice(2));
  } catch (e) {
    process.stderr.write(`${e instanceof Error ? e.message : String(e)}\n`);
    process.exit(2);
  }
  // OpenTelemetry (the `trace` check): an SDK tracer provider, the W3C propagator, and the
  // server interceptor, which runs each handler in its call's span (Unary answers x-trace-id)
  setUpTracing(new AsyncLocalStorageContextManager());
  const server = new Server({ webSocket: { allowedOrigins: "*" }, codecs: nodeCodecs, interceptors: [otelServerInterceptor()] }).service(Matrix, matrixImpl(new CancelledTags()));
  let stopping = false;
  const stop = (): void => {
    if (stopping) return;
    stopping = true;
    // Exit 0 within 2 s whatever the open calls do (a held stream never ends by itself).
    setTimeout(() => process.exit(0), 1500).unref();
    void server.close(1000).then(() => process.exit(0));
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  for (const a of addresses) {
    try {
      const real = await server.listen(a);
      process.stdout.write(`listening ${real}\n`);
    } catch (e) {
      process.stderr.write(`cannot listen on ${a}: ${e instanceof Error ? e.message : String(e)}\n`);
      await server.close(0);
      process.exit(1);
    }
  }
}

await main();
