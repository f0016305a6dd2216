/**
 * Status codes (docs/protocol.md §11) and the error type every call fails with.
 * @module
 */
import type { Metadata } from "./frame.js";

/** The 17 status codes of gRPC, same numbers. */
export enum Code {
  OK = 0,
  CANCELLED = 1,
  UNKNOWN = 2,
  INVALID_ARGUMENT = 3,
  DEADLINE_EXCEEDED = 4,
  NOT_FOUND = 5,
  ALREADY_EXISTS = 6,
  PERMISSION_DENIED = 7,
  RESOURCE_EXHAUSTED = 8,
  FAILED_PRECONDITION = 9,
  ABORTED = 10,
  OUT_OF_RANGE = 11,
  UNIMPLEMENTED = 12,
  INTERNAL = 13,
  UNAVAILABLE = 14,
  DATA_LOSS = 15,
  UNAUTHENTICATED = 16,
}

/** The trailer key that carries a status's binary details (§5.1). */
export const DETAILS_KEY = "topspin-status-details-bin";

/** What a {@link TopspinError} carries besides its code, message and trailers. */
export interface TopspinErrorOptions {
  /** Binary status details; by default those of the `topspin-status-details-bin` trailer. */
  details?: Uint8Array;
  /** Response headers (§5.4): those that came before the failing END, or those to send with it. */
  headers?: Metadata;
}

/**
 * A call that did not end with `OK`: `code` (§11), `message` for people, `details` (the bytes of
 * `topspin-status-details-bin`, if any), the response `headers` that came before the failing END
 * (§5.4), the `trailers`, and `metadata` (both: headers followed by trailers).
 *
 * A handler that throws one with `headers` fails its call with those response headers: the
 * server sends them (after the `ctx.responseHeaders` set so far) in a HEADERS frame before the
 * END, if the call sent no headers yet and they fit the client's metadata limit; otherwise the
 * END goes alone.
 *
 * ```ts
 * throw new TopspinError(Code.UNAVAILABLE, "draining", [], { headers: [{ key: "retry-after", value: "5" }] });
 * // the client:
 * catch (e) { if (e instanceof TopspinError) console.log(e.headers, e.trailers); }
 * ```
 */
export class TopspinError extends Error {
  /** The status code. */
  readonly code: Code;
  /** The status message as the peer sent it (`message` also names the code). */
  readonly rawMessage: string;
  /** Binary status details (`topspin-status-details-bin`), or undefined. */
  readonly details: Uint8Array | undefined;
  /** Response headers: received before the END (client), or to send before it (server). */
  readonly headers: Metadata;
  /** Trailers: received with the END (client), or to send with it (server). */
  readonly trailers: Metadata;
  /** Response headers followed by trailers. */
  readonly metadata: Metadata;

  /**
   * `trailers`: the status's trailers. The fourth argument is the details, or
   * {@link TopspinErrorOptions} (details and response headers).
   */
  constructor(code: Code, message: string, trailers: Metadata = [], options?: Uint8Array | TopspinErrorOptions) {
    super(`[${Code[code] ?? code}] ${message}`);
    this.name = "TopspinError";
    this.code = code;
    this.rawMessage = message;
    const opts: TopspinErrorOptions = options instanceof Uint8Array ? { details: options } : (options ?? {});
    this.headers = opts.headers ?? [];
    this.trailers = trailers;
    this.metadata = this.headers.length === 0 ? trailers : [...this.headers, ...trailers];
    const d = opts.details ?? trailers.find((e) => e.key === DETAILS_KEY)?.value;
    this.details = d instanceof Uint8Array ? d : undefined;
  }

  /** Turns anything thrown into a TopspinError (`UNKNOWN` for foreign errors). */
  static from(e: unknown, fallback: Code = Code.UNKNOWN): TopspinError {
    if (e instanceof TopspinError) return e;
    if (e instanceof Error && e.name === "AbortError") return new TopspinError(Code.CANCELLED, e.message);
    return new TopspinError(fallback, e instanceof Error ? e.message : String(e));
  }
}
