// The Node client of the cross-language matrix (testdata/matrix/README.md):
//   node dist/matrix/client.js --target tcp://127.0.0.1:PORT | unix:///path | ws://127.0.0.1:PORT/
// runs the checks of matrix/checks.ts in order, one line each, and exits 0 when none failed
// (1 otherwise, 2 on bad arguments). The whole run ends within 60 s.
import { connect } from "../src/node/net.js";
import { nodeCodecs } from "../src/node/gzip.js";
import { runChecks } from "./checks.js";
import { targetArg } from "./args.js";

/** The run's bound (README: every client ends within 60 s). */
const RUN_DEADLINE_MS = 58_000;

async function main(): Promise<number> {
  let target: string;
  try {
    target = targetArg(process.argv.slice(2));
  } catch (e) {
    process.stderr.write(`${e instanceof Error ? e.message : String(e)}\n`);
    return 2;
  }
  setTimeout(() => {
    process.stderr.write(`the run took over ${RUN_DEADLINE_MS} ms\n`);
    process.exit(1);
  }, RUN_DEADLINE_MS).unref();
  const channel = connect(target, { codecs: nodeCodecs });
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
