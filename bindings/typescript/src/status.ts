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

/**
 * A call that did not end with `OK`: `code` (§11), `message` for people, `details` (the bytes of
 * `topspin-status-details-bin`, if any) and `metadata` (the response headers and trailers).
 */
export class TopspinError extends Error {
  /** The status code. */
  readonly code: Code;
  /** The status message as the peer sent it (`message` also names the code). */
  readonly rawMessage: string;
  /** Binary status details (`topspin-status-details-bin`), or undefined. */
  readonly details: Uint8Array | undefined;
  /** Response headers followed by trailers. */
  readonly metadata: Metadata;

  constructor(code: Code, message: string, metadata: Metadata = [], details?: Uint8Array) {
    super(`[${Code[code] ?? code}] ${message}`);
    this.name = "TopspinError";
    this.code = code;
    this.rawMessage = message;
    this.metadata = metadata;
    const d = details ?? metadata.find((e) => e.key === DETAILS_KEY)?.value;
    this.details = d instanceof Uint8Array ? d : undefined;
  }

  /** Turns anything thrown into a TopspinError (`UNKNOWN` for foreign errors). */
  static from(e: unknown, fallback: Code = Code.UNKNOWN): TopspinError {
    if (e instanceof TopspinError) return e;
    if (e instanceof Error && e.name === "AbortError") return new TopspinError(Code.CANCELLED, e.message);
    return new TopspinError(fallback, e instanceof Error ? e.message : String(e));
  }
}
