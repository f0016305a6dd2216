// Interceptors the interceptor tests use on both sides: they log, measure, count, add metadata
// and refuse calls.
import { Code, TopspinError, type Interceptor, type InterceptorResponse, type Metadata } from "../src/index.js";

/** Logs `name>` on the way in and `<name` on the way out (a stream's: at its end). */
export function tracer(name: string, log: string[]): Interceptor {
  return (next) => async (req) => {
    log.push(`${name}>`);
    const res = await next(req);
    if (!res.stream) {
      log.push(`<${name}`);
      return res;
    }
    return { ...res, message: onEnd(res.message, () => log.push(`<${name}`)) };
  };
}

/** `stream`, calling `done` with its error (undefined: it ended) once it ends or fails. */
export async function* onEnd<T>(stream: AsyncIterable<T>, done: (err: unknown) => void): AsyncGenerator<T> {
  let err: unknown;
  try {
    yield* stream;
  } catch (e) {
    err = e;
    throw e;
  } finally {
    done(err);
  }
}

/** What {@link measure} records of one call. */
export interface Measured {
  method: string;
  code: Code;
  ms: number;
}

/** Records each call's method, final code and duration (a stream's: when it ended). */
export function measure(log: Measured[]): Interceptor {
  return (next) => async (req) => {
    const t0 = performance.now();
    const record = (err: unknown): void => {
      // a server's handler may end its stream quietly once the call is over (the deadline, the
      // client's cancel): the signal says why
      if (err === undefined && req.signal.aborted) err = req.signal.reason;
      log.push({ method: req.method, code: err === undefined ? Code.OK : TopspinError.from(err).code, ms: performance.now() - t0 });
    };
    let res: InterceptorResponse;
    try {
      res = await next(req);
    } catch (e) {
      record(e);
      throw e;
    }
    if (!res.stream) {
      record(undefined);
      return res;
    }
    return { ...res, message: onEnd(res.message, record) };
  };
}

/** Counts the response messages of every call, per method. */
export function countResponses(counts: Map<string, number>): Interceptor {
  return (next) => async (req) => {
    const res = await next(req);
    if (!res.stream) return res;
    const message = (async function* () {
      for await (const m of res.message) {
        counts.set(req.method, (counts.get(req.method) ?? 0) + 1);
        yield m;
      }
    })();
    return { ...res, message };
  };
}

/** Adds a request header (a new request: the caller's array is left as it was). */
export function addHeader(key: string, value: string): Interceptor {
  return (next) => (req) => next({ ...req, header: [...req.header, { key, value }] });
}

/** The text value of `key` in `md`. */
export function textOf(md: Metadata, key: string): string | undefined {
  const v = md.find((m) => m.key === key)?.value;
  return typeof v === "string" ? v : undefined;
}

/** The details every refusal of {@link requireToken} carries. */
export const REFUSAL_DETAILS = new Uint8Array([1, 2, 3]);

/** Refuses calls without `authorization: Bearer ok` with PERMISSION_DENIED (and details). */
export function requireToken(): Interceptor {
  return (next) => async (req) => {
    if (textOf(req.header, "authorization") !== "Bearer ok") {
      throw new TopspinError(Code.PERMISSION_DENIED, `no token for ${req.method}`, [], REFUSAL_DETAILS);
    }
    return next(req);
  };
}

/** Every message of a stream (Array.fromAsync is not in ES2022's lib). */
export async function all<T>(stream: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const m of stream) out.push(m);
  return out;
}
