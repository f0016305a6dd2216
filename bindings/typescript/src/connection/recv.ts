/**
 * What a connection does with each received frame (§5, §6, §8): one method per frame type;
 * the dispatch is {@link Connection}'s (`../connection.ts`).
 * @module
 */
import { ErrorCode, Flags, HEADER_LEN, ProtocolError, metadataSize, type Frame } from "../frame.js";
import { Code } from "../status.js";
import type { Call } from "./calls.js";
import { MAX_CREDIT } from "./flow.js";
import { Sender } from "./send.js";

type FrameOf<T extends Frame["type"]> = Extract<Frame, { type: T }>;

/** @internal The receiving layer of the engine. */
export abstract class Receiver extends Sender {
  /** Sends GOAWAY `ENHANCE_YOUR_CALM` and throws it as the connection error (§9). */
  protected calm(what: string): never {
    this.send({ type: "GOAWAY", flags: 0, callId: 0, lastCallId: this.highest, code: ErrorCode.ENHANCE_YOUR_CALM, reason: what });
    throw new ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, what);
  }

  protected onPing(f: FrameOf<"PING">): void {
    if (f.ack) {
      const i = this.pingsSent.findIndex((d) => d.every((x, j) => x === f.data[j]));
      if (i >= 0) {
        this.pingsSent.splice(i, 1);
        this.events.push({ type: "Pong", data: f.data });
      }
      return;
    }
    if (!this.pingBucket.take(this.now())) this.calm("too_many_pings");
    if (!this.pingAnswerQueued) {
      this.send({ type: "PING", flags: Flags.ACK, callId: 0, ack: true, data: f.data });
      this.pingAnswerQueued = true;
    }
  }

  protected onGoAway(lastCallId: number, code: number, reason: string): void {
    if (this.goawayReceived !== null && lastCallId > this.goawayReceived) {
      throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `GOAWAY raised last_call_id from ${this.goawayReceived} to ${lastCallId}`);
    }
    this.goawayReceived = lastCallId;
    this.events.push({ type: "GoAway", lastCallId, code, reason });
    if (this.role === "client") {
      for (const c of [...this.calls.values()]) {
        if (c.id > lastCallId) {
          this.forget(c.id);
          this.events.push({ type: "Ended", callId: c.id, code: Code.UNAVAILABLE, message: `the server went away (GOAWAY ${reason}); the call was not processed`, trailers: [] });
        }
      }
    }
  }

  // ---- CALL (server) -----------------------------------------------------------------------

  protected onCall(f: FrameOf<"CALL">): void {
    if (f.callId <= this.highest) throw new ProtocolError(ErrorCode.DUPLICATE_CALL, `CALL ${f.callId} is not above ${this.highest}`);
    this.highest = f.callId;
    if (this.goawayReceived !== null) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `CALL ${f.callId} after the client's GOAWAY`);
    const method = this.resolveMethod(f);
    if (this.goawaySent !== null && f.callId > this.goawaySent) return;
    if (!this.admitCall(f)) return;
    this.newCall(f.callId);
    this.events.push({ type: "CallStarted", callId: f.callId, method, codec: f.codec, timeoutUs: f.timeoutUs, metadata: f.metadata });
  }

  /** The CALL's method: its name (binding its id when it has one), or the name bound to its id (§5.2). */
  private resolveMethod(f: FrameOf<"CALL">): string {
    if (f.methodId > 1023) {
      throw new ProtocolError(ErrorCode.METHOD_ID_ERROR, f.methodName !== null ? `NAMED CALL binds method id ${f.methodId}, above 1023` : `method id ${f.methodId} is above 1023`);
    }
    if (f.methodName !== null) {
      if (f.methodId !== 0) {
        if (this.boundIds.has(f.methodId)) throw new ProtocolError(ErrorCode.METHOD_ID_ERROR, `method id ${f.methodId} is already bound`);
        this.boundIds.set(f.methodId, f.methodName);
      }
      return f.methodName;
    }
    if (f.methodId === 0) throw new ProtocolError(ErrorCode.METHOD_ID_ERROR, "CALL without a name and method id 0");
    const m = this.boundIds.get(f.methodId);
    if (m === undefined) throw new ProtocolError(ErrorCode.METHOD_ID_ERROR, `method id ${f.methodId} is not bound`);
    return m;
  }

  /** Whether the call may open; if not, it is ended `RESOURCE_EXHAUSTED` (metadata, memory, concurrency). */
  private admitCall(f: FrameOf<"CALL">): boolean {
    const end = (message: string): false => {
      this.send({ type: "END", flags: 0, callId: f.callId, code: Code.RESOURCE_EXHAUSTED, message, trailers: [] });
      return false;
    };
    const mds = metadataSize(f.metadata);
    if (mds > this.local.maxMetadataSize) {
      return end(`request metadata of ${mds} bytes exceeds max_metadata_size ${this.local.maxMetadataSize}`);
    }
    if (this.memoryBudget.exhausted) {
      return end(`process memory budget for incoming messages exhausted (${this.memoryBudget.limit} bytes)`);
    }
    if (this.calls.size >= this.local.maxConcurrentCalls) {
      if (!this.refusedBucket.take(this.now())) this.calm("too_many_refused_calls");
      return end("too many concurrent calls");
    }
    return true;
  }

  // ---- frames of an open call --------------------------------------------------------------

  protected onMessage(c: Call, f: FrameOf<"MESSAGE">): void {
    const client = this.role === "client";
    if (client && f.endStream) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, "END_STREAM from the server");
    if (!client && c.halfClosed) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `MESSAGE on call ${c.id} after its half-close`);
    if (c.split !== null) throw new ProtocolError(ErrorCode.MESSAGE_LENGTH_MISMATCH, `MESSAGE on call ${c.id} while a split message is open`);
    this.chargeRecv(c, f.chunk.length + (f.totalLen === null ? 0 : 4));
    if (f.totalLen !== null && f.chunk.length >= f.totalLen) {
      throw new ProtocolError(ErrorCode.MESSAGE_LENGTH_MISMATCH, `SPLIT first chunk of ${f.chunk.length} bytes already holds total_len ${f.totalLen}`);
    }
    const size = f.totalLen ?? f.chunk.length;
    if (size > this.local.maxMessageSize) {
      this.tooLarge(c, size);
      return;
    }
    if (client) c.answered = true;
    if (f.totalLen === null) {
      this.deliver(c, f.chunk.slice(), HEADER_LEN + f.chunk.length);
      if (f.endStream) this.halfClosedByClient(c);
    } else {
      // Bounded by what arrived, not by total_len (a claim): at most twice the chunk, never
      // past total_len (itself ≤ maxMessageSize, checked above); charged by hold().
      const buf = new Uint8Array(Math.min(f.totalLen, 2 * f.chunk.length));
      buf.set(f.chunk);
      this.hold(buf.length);
      c.split = { total: f.totalLen, got: f.chunk.length, buf, endStream: f.endStream };
      this.splitsOpen++;
      this.lastChunkAt = this.now();
      this.chunkCredit(c, HEADER_LEN + 4 + f.chunk.length);
    }
  }

  protected onContinuation(c: Call, f: FrameOf<"CONTINUATION">): void {
    const s = c.split;
    if (s === null) throw new ProtocolError(ErrorCode.MESSAGE_LENGTH_MISMATCH, `CONTINUATION on call ${c.id} with no split message open`);
    this.chargeRecv(c, f.chunk.length);
    if (s.got + f.chunk.length > s.total) {
      throw new ProtocolError(ErrorCode.MESSAGE_LENGTH_MISMATCH, `CONTINUATION goes past total_len ${s.total}`);
    }
    const need = s.got + f.chunk.length;
    if (need > s.buf.length) {
      // At most twice what arrived, never past the total; the growth is charged by hold().
      const grown = new Uint8Array(Math.min(s.total, 2 * need));
      grown.set(s.buf.subarray(0, s.got));
      this.hold(grown.length - s.buf.length);
      s.buf = grown;
    }
    s.buf.set(f.chunk, s.got);
    s.got = need;
    if (s.got < s.total) {
      this.lastChunkAt = this.now();
      this.chunkCredit(c, HEADER_LEN + f.chunk.length);
    } else {
      this.dropSplit(c);
      this.grantNow(c, HEADER_LEN + f.chunk.length);
      this.deliver(c, s.buf, 0);
      if (s.endStream) this.halfClosedByClient(c);
    }
  }

  protected onHeaders(c: Call, f: FrameOf<"HEADERS">): void {
    if (c.headers || c.answered) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `HEADERS on call ${c.id} after HEADERS or a message`);
    c.headers = true;
    const size = metadataSize(f.metadata);
    if (size > this.local.maxMetadataSize) {
      this.forget(c.id);
      this.send({ type: "CANCEL", flags: 0, callId: c.id, code: Code.RESOURCE_EXHAUSTED });
      this.events.push({ type: "Ended", callId: c.id, code: Code.RESOURCE_EXHAUSTED, message: `response headers of ${size} bytes exceed max_metadata_size ${this.local.maxMetadataSize}`, trailers: [] });
      return;
    }
    this.events.push({ type: "Headers", callId: c.id, metadata: f.metadata });
  }

  protected onEnd(c: Call, f: FrameOf<"END">): void {
    this.forget(c.id);
    const statusSize = 2 + new TextEncoder().encode(f.message).length + metadataSize(f.trailers);
    if (statusSize > this.local.maxMetadataSize) {
      this.events.push({ type: "Ended", callId: c.id, code: Code.RESOURCE_EXHAUSTED, message: `END status of ${statusSize} bytes exceeds max_metadata_size ${this.local.maxMetadataSize}`, trailers: [] });
      return;
    }
    this.events.push({ type: "Ended", callId: c.id, code: f.code, message: f.message, trailers: f.trailers });
  }

  protected onHalfClose(c: Call): void {
    if (c.halfClosed) throw new ProtocolError(ErrorCode.ILLEGAL_FRAME, `second half-close on call ${c.id}`);
    if (c.split !== null) throw new ProtocolError(ErrorCode.MESSAGE_LENGTH_MISMATCH, `HALF_CLOSE on call ${c.id} inside a split message`);
    this.halfClosedByClient(c);
  }

  protected onCancel(c: Call, f: FrameOf<"CANCEL">): void {
    if (!c.answered && !this.resetBucket.take(this.now())) this.calm("too_many_resets");
    this.forget(c.id);
    this.events.push({ type: "Cancelled", callId: c.id, code: f.code, message: "the client cancelled the call" });
  }

  protected onCredit(c: Call, f: FrameOf<"CREDIT">): void {
    const before = c.sendCredit;
    if (before + f.increment > MAX_CREDIT) throw new ProtocolError(ErrorCode.FLOW_CONTROL, `CREDIT raises call ${c.id}'s credit above 2^31-1`);
    c.sendCredit += f.increment;
    if (before <= 0 && c.sendCredit > 0) {
      this.flush(c);
      if (this.calls.has(c.id) && c.out === null) this.events.push({ type: "Writable", callId: c.id });
    }
  }

  private deliver(c: Call, message: Uint8Array, creditDue: number): void {
    this.events.push({ type: "Message", callId: c.id, message, creditDue });
  }

  private halfClosedByClient(c: Call): void {
    c.halfClosed = true;
    this.events.push({ type: "HalfClosed", callId: c.id });
  }

  /** A message over our MAX_MESSAGE_SIZE: the call ends `RESOURCE_EXHAUSTED` both ways. */
  private tooLarge(c: Call, size: number): void {
    const message = `message of ${size} bytes exceeds the limit of ${this.local.maxMessageSize} bytes (max_message_size)`;
    this.forget(c.id);
    if (this.role === "server") {
      this.send({ type: "END", flags: 0, callId: c.id, code: Code.RESOURCE_EXHAUSTED, message, trailers: [] });
      this.events.push({ type: "Cancelled", callId: c.id, code: Code.RESOURCE_EXHAUSTED, message });
    } else {
      this.send({ type: "CANCEL", flags: 0, callId: c.id, code: Code.RESOURCE_EXHAUSTED });
      this.events.push({ type: "Ended", callId: c.id, code: Code.RESOURCE_EXHAUSTED, message, trailers: [] });
    }
  }
}
