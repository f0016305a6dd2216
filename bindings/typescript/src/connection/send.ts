/**
 * Sending (§5, §7.2): starting calls (method interning), messages (split when larger than the
 * peer's frames, resumed as credit arrives), half-closing, cancelling, response headers and
 * ends, PING and GOAWAY.
 * @module
 */
import { ErrorCode, Flags, HEADER_LEN, metadataSize, truncateUtf8, type Frame, type Metadata } from "../frame.js";
import { Code, TopspinError } from "../status.js";
import type { Call } from "./calls.js";
import { FlowControl } from "./flow.js";

/** @internal The sending layer of the engine: the application's commands. */
export abstract class Sender extends FlowControl {
  /** Client: whether a new call may be sent now (else queue it, or fail it when {@link refusesCalls}). */
  canStartCall(): boolean {
    return this.phase === "open" && this.goawayReceived === null && this.goawaySent === null && this.calls.size < this.peer.maxConcurrentCalls;
  }

  /** Client: whether the server takes no calls at all (MAX_CONCURRENT_CALLS 0) or is going away. */
  get refusesCalls(): boolean {
    return this.phase === "closed" || this.goingAway || (this.phase === "open" && this.peer.maxConcurrentCalls === 0);
  }

  /**
   * Client: starts a call and returns its id. Throws {@link TopspinError} to refuse it locally
   * (`UNAVAILABLE` when the server takes no calls or went away, `RESOURCE_EXHAUSTED` for
   * metadata over the server's limit).
   */
  startCall(method: string, codec: number, timeoutUs: bigint, metadata: Metadata): number {
    this.checkCallStart();
    const { methodId, methodName } = this.bindMethod(method);
    const nameLen = methodName === null ? 0 : 2 + new TextEncoder().encode(methodName).length;
    const mds = metadataSize(metadata);
    const limit = Math.min(this.peer.maxMetadataSize, this.peer.maxFrameSize - 12 - nameLen);
    if (mds > limit) {
      if (methodName !== null && methodId !== 0) this.boundNames.delete(method);
      throw new TopspinError(Code.RESOURCE_EXHAUSTED, `request metadata of ${mds} bytes exceeds the server's limit of ${limit} bytes (max_metadata_size)`);
    }
    const id = ++this.highest;
    this.send({ type: "CALL", flags: methodName === null ? 0 : Flags.NAMED, callId: id, methodId, methodName, codec, timeoutUs, metadata });
    this.newCall(id);
    return id;
  }

  /** Throws unless this client connection may start a call now. */
  private checkCallStart(): void {
    if (this.role !== "client") throw new Error("startCall on a server connection");
    if (this.phase !== "open") throw new TopspinError(Code.UNAVAILABLE, this.phase === "closed" ? "the connection is closed" : "the connection is not established");
    if (this.goingAway) throw new TopspinError(Code.UNAVAILABLE, "the connection is going away");
    if (this.peer.maxConcurrentCalls === 0) throw new TopspinError(Code.UNAVAILABLE, "the server takes no calls (MAX_CONCURRENT_CALLS 0)");
    if (this.calls.size >= this.peer.maxConcurrentCalls) throw new TopspinError(Code.RESOURCE_EXHAUSTED, "too many concurrent calls");
  }

  /**
   * Method interning (§5.2): a bound method goes by id alone; a new one by name, binding the next
   * id while there are ids left (1..1023), else with id 0 (named every time).
   */
  private bindMethod(method: string): { methodId: number; methodName: string | null } {
    const bound = this.boundNames.get(method);
    if (bound !== undefined) return { methodId: bound, methodName: null };
    let methodId = 0;
    if (this.nextMethodId <= 1023) {
      methodId = this.nextMethodId++;
      this.boundNames.set(method, methodId);
    }
    return { methodId, methodName: method };
  }

  /** Whether a message may be sent on the call now (credit above zero, no split message pending). */
  writable(callId: number): boolean {
    const c = this.open(callId);
    return c !== undefined && c.sendCredit > 0 && c.out === null && !(this.role === "client" && c.halfClosed);
  }

  /**
   * Sends one message. Returns `false` when it must wait (no credit, or a split message still
   * going out; a `Writable` event follows). Throws {@link TopspinError} `RESOURCE_EXHAUSTED` for a
   * message over the peer's MAX_MESSAGE_SIZE. Returns `true` for a call that is no longer open
   * (the message is dropped; the call's end is reported by its own event).
   */
  sendMessage(callId: number, message: Uint8Array, endStream = false): boolean {
    const c = this.open(callId);
    if (c === undefined) return true;
    if (this.role === "client" && c.halfClosed) throw new TopspinError(Code.INTERNAL, "message after half-close");
    if (message.length > this.peer.maxMessageSize) {
      throw new TopspinError(Code.RESOURCE_EXHAUSTED, `message of ${message.length} bytes exceeds the peer's limit of ${this.peer.maxMessageSize} bytes (max_message_size)`);
    }
    if (c.sendCredit <= 0 || c.out !== null) return false;
    const flags = endStream && this.role === "client" ? Flags.END_STREAM : 0;
    if (this.role === "server") c.answered = true;
    if (flags) c.halfClosed = true;
    const max = this.peer.maxFrameSize;
    if (message.length <= max) {
      this.send({ type: "MESSAGE", flags, callId, endStream: flags !== 0, totalLen: null, chunk: message });
      c.sendCredit -= HEADER_LEN + message.length;
      return true;
    }
    const first = message.subarray(0, max - 4);
    this.send({ type: "MESSAGE", flags: flags | Flags.SPLIT, callId, endStream: flags !== 0, totalLen: message.length, chunk: first });
    c.sendCredit -= HEADER_LEN + 4 + first.length;
    c.out = { data: message, offset: first.length };
    this.flush(c);
    return true;
  }

  /** Sends the rest of the call's split message while it has credit, then what waits behind it. */
  protected flush(c: Call): void {
    while (c.out !== null && c.sendCredit > 0) {
      const o = c.out;
      const chunk = o.data.subarray(o.offset, o.offset + this.peer.maxFrameSize);
      this.send({ type: "CONTINUATION", flags: 0, callId: c.id, chunk });
      c.sendCredit -= HEADER_LEN + chunk.length;
      o.offset += chunk.length;
      if (o.offset >= o.data.length) {
        c.out = null;
        if (c.tail !== null) {
          const t = c.tail;
          c.tail = null;
          this.send(t);
          if (t.type === "END") this.forget(c.id);
        }
      }
    }
  }

  /** Client: no more messages on the call. */
  halfClose(callId: number): void {
    const c = this.open(callId);
    if (c === undefined || c.halfClosed) return;
    c.halfClosed = true;
    const f: Frame = { type: "HALF_CLOSE", flags: 0, callId };
    if (c.out !== null) c.tail = f;
    else this.send(f);
  }

  /** Client: abandon the call with a code (`CANCELLED`, `DEADLINE_EXCEEDED` …). */
  cancel(callId: number, code: number): void {
    const c = this.open(callId);
    if (c === undefined) return;
    this.forget(callId);
    this.send({ type: "CANCEL", flags: 0, callId, code });
  }

  /** Server: response headers. Throws `RESOURCE_EXHAUSTED` when over the client's limit. */
  sendHeaders(callId: number, metadata: Metadata): void {
    const c = this.open(callId);
    if (c === undefined || c.headers || c.answered) return;
    const size = metadataSize(metadata);
    const limit = Math.min(this.peer.maxMetadataSize, this.peer.maxFrameSize);
    if (size > limit) throw new TopspinError(Code.RESOURCE_EXHAUSTED, `response headers of ${size} bytes exceed the client's limit of ${limit} bytes`);
    c.headers = true;
    c.answered = true;
    this.send({ type: "HEADERS", flags: 0, callId, metadata });
  }

  /** Server: ends the call with a status; shortened to fit the client's limits (§5.6). */
  endCall(callId: number, code: number, message: string, trailers: Metadata = []): void {
    const c = this.open(callId);
    if (c === undefined) return;
    const limit = Math.min(this.peer.maxMetadataSize, this.peer.maxFrameSize - 2);
    let msg: Uint8Array = new TextEncoder().encode(message);
    let tr = trailers;
    if (2 + msg.length + metadataSize(tr) > limit) {
      tr = [];
      msg = truncateUtf8(msg, Math.max(0, limit - 4));
    }
    const f: Frame = { type: "END", flags: 0, callId, code, message: new TextDecoder().decode(msg), trailers: tr };
    c.answered = true;
    if (c.out !== null) {
      c.tail = f;
      return;
    }
    this.forget(callId);
    this.send(f);
  }

  /** Sends a PING with 8 bytes of data; its answer is a `Pong` event. */
  ping(data: Uint8Array): void {
    if (this.phase === "closed") return;
    const d = data.slice(0, 8);
    this.pingsSent.push(d);
    this.send({ type: "PING", flags: 0, callId: 0, ack: false, data: d });
  }

  /** Starts a graceful shutdown (§8.3): GOAWAY with the highest call id. */
  goAway(code: number = ErrorCode.NO_ERROR, reason = ""): void {
    if (this.phase === "closed") return;
    const last = this.goawaySent === null ? this.highest : Math.min(this.goawaySent, this.highest);
    this.goawaySent = last;
    this.send({ type: "GOAWAY", flags: 0, callId: 0, lastCallId: last, code, reason });
  }
}
