/**
 * What a {@link Connection} reports to the application.
 * @module
 */
import type { Metadata } from "../frame.js";

/** What the engine reports to the application. */
export type Event =
  | { type: "Established" }
  | { type: "CallStarted"; callId: number; method: string; codec: number; timeoutUs: bigint; metadata: Metadata }
  | { type: "Headers"; callId: number; metadata: Metadata }
  /** `creditDue`: wire bytes to pass to {@link Connection.consumed} once the application took it. */
  | { type: "Message"; callId: number; message: Uint8Array; creditDue: number }
  | { type: "HalfClosed"; callId: number }
  | { type: "Ended"; callId: number; code: number; message: string; trailers: Metadata }
  | { type: "Cancelled"; callId: number; code: number; message: string }
  | { type: "Writable"; callId: number }
  | { type: "Pong"; data: Uint8Array }
  | { type: "GoAway"; lastCallId: number; code: number; reason: string }
  | { type: "Closed"; error: number | null; reason: string };
