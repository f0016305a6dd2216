/**
 * Binding a Unix socket file as the Rust server does (`transport/listener.rs`): under a lock
 * (`<path>.lock`, gone once bound) so that servers starting together cannot race; a stale
 * socket file (nothing answers on it) is replaced, a live server's never ("address in use"); the
 * file gets the server's permission bits.
 *
 * Node has no `flock`: the lock is a file created exclusively (`O_EXCL`) holding our pid. One
 * left by a process that died is taken over once its pid is gone (or after 2 s when it names
 * none: the Rust server's empty lock file, which outlives a Rust server killed while binding).
 * @module
 */
import * as net from "node:net";
import { promises as fs, constants as fsc } from "node:fs";
import { basename, dirname, join } from "node:path";
import { Code, TopspinError } from "../status.js";

/** How long a server waits for another one binding the same path (as Rust). */
const LOCK_WAIT_MS = 2000;
const LOCK_POLL_MS = 10;

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const errno = (e: unknown): string | undefined => (e as { code?: string }).code;

function inUse(message: string): TopspinError {
  return new TopspinError(Code.UNAVAILABLE, `address in use: ${message}`);
}

/** Whether the process `pid` exists (EPERM: it does, another user's). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return errno(e) === "EPERM";
  }
}

/** Whether a lock file was left by a process that is gone (a lock nobody holds). */
async function staleLock(lock: string, waitedMs: number): Promise<boolean> {
  let text: string;
  try {
    text = await fs.readFile(lock, "utf8");
  } catch {
    return false; // gone meanwhile: the next attempt takes it
  }
  const pid = Number.parseInt(text, 10);
  if (Number.isInteger(pid) && pid > 0) return !alive(pid);
  return waitedMs >= LOCK_WAIT_MS;
}

/** Takes `<path>.lock`; resolves with its release. */
async function lockPath(path: string): Promise<() => Promise<void>> {
  const lock = `${path}.lock`;
  const start = Date.now();
  for (;;) {
    try {
      const f = await fs.open(lock, fsc.O_CREAT | fsc.O_EXCL | fsc.O_WRONLY, 0o600);
      await f.writeFile(`${process.pid}\n`);
      await f.close();
      return () => fs.rm(lock, { force: true });
    } catch (e) {
      if (errno(e) !== "EEXIST") throw e;
    }
    const waited = Date.now() - start;
    if (await staleLock(lock, waited)) {
      await fs.rm(lock, { force: true });
      continue;
    }
    if (waited >= LOCK_WAIT_MS) throw inUse(`another server is binding ${path} (it holds ${lock} for more than ${LOCK_WAIT_MS} ms)`);
    await sleep(LOCK_POLL_MS);
  }
}

/** Whether something accepts connections on the socket file at `path` (false: refused, stale). */
function answers(path: string): Promise<boolean | null> {
  return new Promise((resolve) => {
    const s = net.connect({ path });
    const done = (v: boolean | null): void => {
      s.destroy();
      resolve(v);
    };
    s.once("connect", () => done(true));
    s.once("error", (e) => done(errno(e) === "ECONNREFUSED" ? false : null));
  });
}

/**
 * Makes way for binding at `path`: a socket file nothing answers on is removed; one a live
 * server answers on is "address in use", and so is anything that is not a socket.
 */
async function clearStale(path: string): Promise<void> {
  let st;
  try {
    st = await fs.lstat(path);
  } catch {
    return; // nothing there
  }
  if (!st.isSocket()) throw inUse(`${path} exists and is not a socket`);
  const live = await answers(path);
  if (live === true) throw inUse(`another server answers on ${path}`);
  if (live === false) await fs.rm(path, { force: true });
  else throw inUse(`${path} is a socket that cannot be probed`);
}

/** The (device, inode) of the file at `path`, or null. */
export async function fileId(path: string): Promise<string | null> {
  try {
    const st = await fs.lstat(path);
    return `${st.dev}:${st.ino}`;
  } catch {
    return null;
  }
}

/** Longest Unix socket path (sun_path, with its NUL, on Linux). */
const SUN_PATH_MAX = 107;

/**
 * Binds `srv` to the Unix socket `path` with permission bits `mode`, under the path's lock;
 * resolves with the file's id (see {@link fileId}) once it listens. The socket is bound at a
 * temporary name beside `path`, given its mode, then renamed into place: it appears with its
 * permissions, and closing the server (libuv removes the name it bound) never removes a file
 * that another server put at `path` later — {@link removeIfOurs} removes ours.
 */
export async function listenUnix(srv: net.Server, path: string, mode: number): Promise<string | null> {
  const release = await lockPath(path);
  try {
    await clearStale(path);
    const tmp = join(dirname(path), `.${basename(path)}.${process.pid}.${Date.now() % 1e6}`);
    const bindAt = Buffer.byteLength(tmp) <= SUN_PATH_MAX ? tmp : path;
    await new Promise<void>((resolve, reject) => {
      srv.once("error", reject);
      srv.listen(bindAt, () => {
        srv.off("error", reject);
        resolve();
      });
    });
    await fs.chmod(bindAt, mode & 0o7777);
    if (bindAt !== path) await fs.rename(bindAt, path);
    return await fileId(path);
  } finally {
    await release();
  }
}

/** Removes the socket file at `path` if it is still the one with id `id` (not another server's). */
export async function removeIfOurs(path: string, id: string | null): Promise<void> {
  if (id !== null && (await fileId(path)) === id) await fs.rm(path, { force: true });
}
