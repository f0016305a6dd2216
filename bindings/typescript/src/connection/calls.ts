/**
 * The state of one open call (§6–§8): credit both ways, the split message being reassembled,
 * the split message being sent and what waits behind it.
 * @module
 */
import type { Frame } from "../frame.js";

/** A split message being reassembled. */
export interface Split {
  total: number;
  got: number;
  /** Grows as chunks arrive: its length is never more than twice `got` (nor above `total`). */
  buf: Uint8Array;
  endStream: boolean;
}

/** The rest of a split message being sent. */
export interface OutMessage {
  data: Uint8Array;
  offset: number;
}

/** One open call. */
export interface Call {
  id: number;
  /** What we may still send (§7). */
  sendCredit: number;
  /** What the peer may still send, as we count it. */
  recvCredit: number;
  split: Split | null;
  /** Client: we half-closed. Server: the client half-closed. */
  halfClosed: boolean;
  /** Client: HEADERS seen. Server: HEADERS sent. */
  headers: boolean;
  /** Client: a MESSAGE seen. Server: we answered (HEADERS, MESSAGE or END sent). */
  answered: boolean;
  /** Rest of a split message we are sending. */
  out: OutMessage | null;
  /** A HALF_CLOSE or END waiting behind `out`. */
  tail: Frame | null;
  /** Credit owed to the peer for consumed messages, not yet sent. */
  owed: number;
  /** Chunk credit withheld while the memory budget is spent. */
  withheld: number;
}

/** A call just opened, with the initial windows of both sides. */
export function newCall(id: number, sendCredit: number, recvCredit: number): Call {
  return { id, sendCredit, recvCredit, split: null, halfClosed: false, headers: false, answered: false, out: null, tail: null, owed: 0, withheld: 0 };
}
