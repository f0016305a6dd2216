// Helpers to run the Rust peers (paths from the environment, set by scripts/test-typescript.sh).
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";
import assert from "node:assert/strict";

/** The repository root. */
export const repoRoot = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");

/** A binary named by an environment variable; fails (never skips) when it is not set. */
export function binary(env: string): string {
  const p = process.env[env];
  assert.ok(p, `${env} must name the binary (scripts/test-typescript.sh sets it)`);
  return p;
}

/** Starts a server that prints `listening on ADDRESS`; resolves with the process and address. */
export function startServer(bin: string, args: string[]): Promise<{ proc: ChildProcess; address: string }> {
  return new Promise((resolve, reject) => {
    const proc = spawn(bin, args, { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    const timer = setTimeout(() => {
      proc.kill();
      reject(new Error(`${bin} did not print its address in 30 s: ${out}`));
    }, 30_000);
    proc.stdout?.on("data", (b: Buffer) => {
      out += b.toString();
      const m = /listening on (\S+)/.exec(out);
      if (m?.[1]) {
        clearTimeout(timer);
        resolve({ proc, address: m[1] });
      }
    });
    proc.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`${bin} exited with ${String(code)}: ${out}`));
    });
  });
}

/** Stops a child process and waits for it. */
export async function stop(proc: ChildProcess): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  const done = new Promise<void>((r) => proc.once("exit", () => r()));
  proc.kill("SIGTERM");
  const t = setTimeout(() => proc.kill("SIGKILL"), 8000);
  await done;
  clearTimeout(t);
}

/** Runs a command to its end (bounded); resolves with exit code, stdout and stderr. */
export function run(bin: string, args: string[], input?: string, timeoutMs = 30_000): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const proc = spawn(bin, args, { stdio: ["pipe", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    proc.stdout.on("data", (b: Buffer) => (stdout += b.toString()));
    proc.stderr.on("data", (b: Buffer) => (stderr += b.toString()));
    const t = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`${bin} ${args.join(" ")} took over ${timeoutMs} ms`));
    }, timeoutMs);
    proc.on("close", (code) => {
      clearTimeout(t);
      resolve({ code, stdout, stderr });
    });
    if (input !== undefined) proc.stdin.end(input);
    else proc.stdin.end();
  });
}
