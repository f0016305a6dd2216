// Exits 0 when the given kvstore-server binary accepts a ws:// address (the Rust WebSocket
// transport is built in), 1 when it refuses one.
import { startServer, stop } from "../test/procs.js";

const bin = process.argv[2] ?? "";
try {
  const { proc, address } = await startServer(bin, ["ws://127.0.0.1:0/topspin"]);
  await stop(proc);
  process.exit(address.startsWith("ws://") ? 0 : 1);
} catch {
  process.exit(1);
}
