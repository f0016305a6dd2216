// The Node client of the cross-language matrix (testdata/matrix/README.md):
//   node dist/matrix/client.js [--ca FILE] --target tcp://127.0.0.1:PORT | unix:///path | ws://127.0.0.1:PORT/ | wss://127.0.0.1:PORT/
// runs the checks of matrix/checks.ts in order, one line each, and exits 0 when none failed
// (1 otherwise, 2 on bad arguments). The whole run ends within 60 s.
//
// TLS: the Node runtime has no tls:// (src/node/net.ts dials tcp, unix, ws and wss); wss:// goes
// through the WebSocket implementation it is given. With `--ca FILE` that is the `ws` package's
// WebSocket told to trust those CAs (its `ca` option, Node's tls.connect) instead of Node's
// default roots, handed to the runtime's webSocketDialer.
import { readFileSync } from "node:fs";
import WebSocket from "ws";
import { Channel } from "../src/channel.js";
import { webSocketDialer, type WebSocketCtor } from "../src/transport.js";
import { connect } from "../src/node/net.js";
import { nodeCodecs } from "../src/node/gzip.js";
import { runChecks } from "./checks.js";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { otelClientInterceptor } from "../src/otel.js";
import { setUpTracing } from "./tracing.js";
import { clientArgs } from "./args.js";

/** A channel to `target` through the OpenTelemetry interceptor; a `wss://` one trusting only the CAs of `caFile` when given. */
function channelTo(target: string, caFile: string | undefined): Channel {
  const interceptors = [otelClientInterceptor()];
  if (caFile === undefined) return connect(target, { codecs: nodeCodecs, interceptors });
  if (!target.startsWith("wss://")) throw new Error(`--ca is for wss:// targets (the Node runtime has no tls://), not ${target}`);
  const ca = readFileSync(caFile);
  class TrustingWebSocket extends WebSocket {
    constructor(url: string, protocols: string | string[]) {
      super(url, protocols, { ca });
    }
  }
  return new Channel({ codecs: nodeCodecs, interceptors, dial: webSocketDialer(target, TrustingWebSocket as unknown as WebSocketCtor) });
}

/** The run's bound (README: every client ends within 60 s). */
const RUN_DEADLINE_MS = 58_000;

async function main(): Promise<number> {
  // the `trace` check: an SDK tracer provider, the W3C propagator, async context across awaits
  setUpTracing(new AsyncLocalStorageContextManager());
  let channel: Channel;
  try {
    const { target, ca } = clientArgs(process.argv.slice(2));
    channel = channelTo(target, ca);
  } catch (e) {
    process.stderr.write(`${e instanceof Error ? e.message : String(e)}\n`);
    return 2;
  }
  setTimeout(() => {
    process.stderr.write(`the run took over ${RUN_DEADLINE_MS} ms\n`);
    process.exit(1);
  }, RUN_DEADLINE_MS).unref();
  try {
    const passed = await runChecks({ channel, codecs: nodeCodecs, tagPrefix: `ts-node-${process.pid}` }, (line) => {
      process.stdout.write(`${line}\n`);
    });
    return passed ? 0 : 1;
  } finally {
    channel.close();
  }
}

process.exit(await main());
