// The page of the matrix's Chromium client: bundled with esbuild and served by matrix/browser.ts.
// It runs the checks of matrix/checks.ts over the browser's own WebSocket to `?target=` and hands
// each line to the runner (`__matrixLine`, exposed by playwright), then the result (`__matrixDone`).
import { Channel } from "../src/channel.js";
import { webSocketDialer } from "../src/transport.js";
import { webCodecs } from "../src/compression.js";
import { runChecks } from "./checks.js";
import { otelClientInterceptor } from "../src/otel.js";
import { setUpTracing } from "./tracing.js";
import { StackContextManager } from "./stack-context.js";

declare global {
  interface Window {
    __matrixLine?: (line: string) => Promise<void>;
    __matrixDone?: (passed: boolean, error: string) => Promise<void>;
  }
}

const params = new URLSearchParams(location.search);
const target = params.get("target") ?? "";
const prefix = params.get("prefix") ?? "ts-browser";
const list = document.getElementById("checks");

async function emit(line: string): Promise<void> {
  const li = document.createElement("li");
  li.textContent = line;
  li.style.color = line.startsWith("ok ") ? "green" : line.startsWith("skip ") ? "gray" : "red";
  list?.appendChild(li);
  await window.__matrixLine?.(line);
}

async function main(): Promise<void> {
  const target_ = document.getElementById("target");
  if (target_) target_.textContent = target;
  // the `trace` check: a browser has no async context; a synchronous stack is enough because the
  // interceptor reads the active context when the call is made (matrix/stack-context.ts)
  setUpTracing(new StackContextManager());
  const channel = new Channel({ dial: webSocketDialer(target), codecs: webCodecs, interceptors: [otelClientInterceptor()] });
  let passed = false;
  let error = "";
  try {
    passed = await runChecks({ channel, codecs: webCodecs, tagPrefix: prefix }, emit);
  } catch (e) {
    error = e instanceof Error ? e.message : String(e);
  } finally {
    channel.close();
  }
  const status = document.getElementById("status");
  if (status) status.textContent = passed ? "ALL PASSED" : "FAILED";
  await window.__matrixDone?.(passed, error);
}

void main();
