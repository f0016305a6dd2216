// Runs every vector of testdata/vectors/ (README there) against the TypeScript codec and engine.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";
import {
  ErrorCode,
  FrameDecoder,
  ProtocolError,
  decodeFrame,
  effectiveSettings,
  encodeFrame,
  errorCodeName,
  type Frame,
  type Metadata,
  type Settings,
} from "../src/frame.js";
import { Connection, type Event, type Limits } from "../src/connection.js";
import { Code } from "../src/status.js";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");
const vectorsDir = join(root, "testdata", "vectors");

type J = Record<string, unknown>;

function load(name: string): J[] {
  // u64 values past 2^53 are kept exact: quote long integers before parsing.
  const text = readFileSync(join(vectorsDir, name), "utf8").replace(/("timeout_us": )(\d{16,})/g, '$1"$2"');
  const doc = JSON.parse(text) as { version: number; vectors: J[] };
  assert.equal(doc.version, 1, `${name}: unknown version`);
  assert.ok(doc.vectors.length > 0, `${name}: no vectors`);
  return doc.vectors;
}

function hex(v: unknown): Uint8Array {
  if (typeof v === "string") return Buffer.from(v, "hex");
  const parts = (v as unknown[]).map((p) => {
    if (typeof p === "string") return Buffer.from(p, "hex");
    const r = p as { repeat: string; count: number };
    return Buffer.from(r.repeat.repeat(r.count), "hex");
  });
  return Buffer.concat(parts);
}
const toHex = (b: Uint8Array): string => Buffer.from(b).toString("hex");

const errCode = (v: unknown): number => (typeof v === "number" ? v : (ErrorCode as Record<string, number>)[v as string] ?? -1);
const statusCode = (v: unknown): number => (typeof v === "number" ? v : (Code as unknown as Record<string, number>)[v as string] ?? -1);
const statusName = (c: number): string => Code[c] ?? String(c);

function md(v: unknown): Metadata {
  return (v as J[]).map((e) => ({ key: e.key as string, value: "value_hex" in e ? hex(e.value_hex) : (e.value as string) }));
}
function mdJson(m: Metadata): J[] {
  return m.map((e) => (typeof e.value === "string" ? { key: e.key, value: e.value } : { key: e.key, value_hex: toHex(e.value) }));
}

const SETTING_NAMES: Record<string, keyof Settings> = {
  MAX_FRAME_SIZE: "maxFrameSize",
  MAX_CONCURRENT_CALLS: "maxConcurrentCalls",
  INITIAL_CALL_WINDOW: "initialCallWindow",
  MAX_MESSAGE_SIZE: "maxMessageSize",
  MAX_METADATA_SIZE: "maxMetadataSize",
};

/** A decoded frame in the vectors' JSON shape. */
function frameJson(f: Frame): J {
  const b: J = { type: f.type, flags: f.flags, call_id: f.callId };
  switch (f.type) {
    case "SETTINGS": {
      const s = effectiveSettings(f.entries);
      const settings: J = {};
      for (const [n, k] of Object.entries(SETTING_NAMES)) settings[n] = s[k];
      return { ...b, entries: f.entries.map((e) => ({ id: e.id, value: e.value })), settings };
    }
    case "CALL":
      return { ...b, method_id: f.methodId, method_name: f.methodName, codec: f.codec, timeout_us: f.timeoutUs, metadata: mdJson(f.metadata) };
    case "MESSAGE":
      return { ...b, end_stream: f.endStream, total_len: f.totalLen, chunk_hex: toHex(f.chunk) };
    case "CONTINUATION":
      return { ...b, chunk_hex: toHex(f.chunk) };
    case "HEADERS":
      return { ...b, metadata: mdJson(f.metadata) };
    case "HALF_CLOSE":
      return b;
    case "END":
      return { ...b, code: statusName(f.code), message: f.message, trailers: mdJson(f.trailers) };
    case "CANCEL":
      return { ...b, code: statusName(f.code) };
    case "CREDIT":
      return { ...b, increment: f.increment };
    case "PING":
      return { ...b, ack: f.ack, data_hex: toHex(f.data) };
    case "GOAWAY":
      return { ...b, last_call_id: f.lastCallId, code: errorCodeNameOrNumber(f.code), reason: f.reason };
    case "ERROR":
      return { ...b, code: errorCodeNameOrNumber(f.code), reason: f.reason };
    case "EXTENSION":
      return { ...b, ext_type: f.extType, payload_hex: toHex(f.payload) };
  }
}
function errorCodeNameOrNumber(c: number): string | number {
  const n = errorCodeName(c);
  return n === String(c) ? c : n;
}

/** The vectors' JSON frame to a Frame for the encoder. */
function frameFrom(j: J): Frame {
  const b = { flags: j.flags as number, callId: j.call_id as number };
  switch (j.type) {
    case "SETTINGS":
      return { ...b, type: "SETTINGS", entries: (j.entries as { id: number; value: number }[]).map((e) => ({ ...e })) };
    case "CALL":
      return { ...b, type: "CALL", methodId: j.method_id as number, methodName: j.method_name as string | null, codec: j.codec as number, timeoutUs: BigInt(j.timeout_us as string | number), metadata: md(j.metadata) };
    case "MESSAGE":
      return { ...b, type: "MESSAGE", endStream: j.end_stream as boolean, totalLen: j.total_len as number | null, chunk: hex(j.chunk_hex) };
    case "CONTINUATION":
      return { ...b, type: "CONTINUATION", chunk: hex(j.chunk_hex) };
    case "HEADERS":
      return { ...b, type: "HEADERS", metadata: md(j.metadata) };
    case "HALF_CLOSE":
      return { ...b, type: "HALF_CLOSE" };
    case "END":
      return { ...b, type: "END", code: statusCode(j.code), message: j.message as string, trailers: md(j.trailers) };
    case "CANCEL":
      return { ...b, type: "CANCEL", code: statusCode(j.code) };
    case "CREDIT":
      return { ...b, type: "CREDIT", increment: j.increment as number };
    case "PING":
      return { ...b, type: "PING", ack: j.ack as boolean, data: hex(j.data_hex) };
    case "GOAWAY":
      return { ...b, type: "GOAWAY", lastCallId: j.last_call_id as number, code: errCode(j.code), reason: j.reason as string };
    case "ERROR":
      return { ...b, type: "ERROR", code: errCode(j.code), reason: j.reason as string };
    case "EXTENSION":
      return { ...b, type: "EXTENSION", extType: j.ext_type as number, payload: hex(j.payload_hex) };
    default:
      throw new Error(`unknown frame type ${String(j.type)}`);
  }
}

/** Normalises an expected JSON value for comparison (hex lists to strings, bigints). */
function norm(key: string, v: unknown): unknown {
  if (key.endsWith("_hex") || key === "hex") return toHex(hex(v));
  if (key === "timeout_us") return BigInt(v as string | number);
  if (key === "metadata" || key === "trailers") return mdJson(md(v));
  return v;
}

/** Partial match: every field of `want` must equal the one in `got`. */
function partial(got: J, want: J, where: string): void {
  for (const [k, v] of Object.entries(want)) {
    if (k === "description") continue;
    const g = k === "timeout_us" ? BigInt(got[k] as bigint) : got[k];
    assert.deepEqual(g, norm(k, v), `${where}: field ${k}: got ${JSON.stringify(g, big)} want ${JSON.stringify(v)}`);
  }
}
const big = (_: string, v: unknown): unknown => (typeof v === "bigint" ? v.toString() : v);

for (const v of load("frames_valid.json")) {
  test(`frame valid: ${v.name as string}`, () => {
    const bytes = hex(v.hex);
    const { frame, consumed } = decodeFrame(bytes, (v.max_frame_size as number | undefined) ?? 16777216);
    assert.ok(frame, "a whole frame");
    assert.equal(consumed, bytes.length, "every byte consumed");
    const want = v.frame as J;
    const got = frameJson(frame);
    assert.deepEqual(Object.keys(got).sort(), Object.keys(want).sort(), "exactly the fields");
    partial(got, want, "decode");
    if (v.roundtrip !== false) assert.equal(toHex(encodeFrame(frameFrom(want))), toHex(bytes), "encode gives the bytes back");
  });
}

for (const v of load("frames_invalid.json")) {
  test(`frame invalid: ${v.name as string}`, () => {
    const d = new FrameDecoder((v.max_frame_size as number | undefined) ?? 16777216);
    d.push(hex(v.hex));
    assert.throws(
      () => d.next(),
      (e: unknown) => e instanceof ProtocolError && e.code === errCode(v.error),
      `fails with ${v.error as string}`,
    );
  });
}

function eventJson(e: Event): J {
  switch (e.type) {
    case "Established":
      return { type: e.type };
    case "CallStarted":
      return { type: e.type, call_id: e.callId, method: e.method, codec: e.codec, timeout_us: e.timeoutUs, metadata: mdJson(e.metadata) };
    case "Headers":
      return { type: e.type, call_id: e.callId, metadata: mdJson(e.metadata) };
    case "Message":
      return { type: e.type, call_id: e.callId, message_hex: toHex(e.message) };
    case "HalfClosed":
    case "Writable":
      return { type: e.type, call_id: e.callId };
    case "Ended":
      return { type: e.type, call_id: e.callId, code: statusName(e.code), message: e.message, trailers: mdJson(e.trailers) };
    case "Cancelled":
      return { type: e.type, call_id: e.callId, code: statusName(e.code), message: e.message };
    case "Pong":
      return { type: e.type, data_hex: toHex(e.data) };
    case "GoAway":
      return { type: e.type, last_call_id: e.lastCallId, code: errorCodeNameOrNumber(e.code), reason: e.reason };
    case "Closed":
      return { type: e.type, error: e.error === null ? null : errorCodeNameOrNumber(e.error) };
  }
}

function runSession(v: J, bytewise: boolean): void {
  const settings: Partial<Settings> = {};
  for (const [n, val] of Object.entries((v.local_settings as Record<string, number> | undefined) ?? {})) {
    const k = SETTING_NAMES[n];
    if (k) settings[k] = val;
  }
  const limits: Partial<Limits> = {};
  const ll = (v.local_limits as Record<string, number> | undefined) ?? {};
  if (ll.PING_BURST !== undefined) limits.pingBurst = ll.PING_BURST;
  if (ll.RAPID_RESET_BURST !== undefined) limits.rapidResetBurst = ll.RAPID_RESET_BURST;
  if (ll.REFUSED_CALL_BURST !== undefined) limits.refusedCallBurst = ll.REFUSED_CALL_BURST;
  const conn = new Connection(v.role as "client" | "server", { settings, limits, now: () => 0 });
  // Our own preface and SETTINGS are never part of expect_sent.
  const own = new FrameDecoder(0xffffffff);
  conn.takeOutput().forEach(() => undefined);
  const sent: Frame[] = [];
  const events: Event[] = [];
  const drain = (): void => {
    for (const b of conn.takeOutput()) own.push(b);
    for (let f = own.next(); f !== null; f = own.next()) sent.push(f);
    events.push(...conn.takeEvents());
  };
  const steps = v.steps as J[];
  for (let i = 0; i < steps.length; i++) {
    const s = steps[i] as J;
    const where = `step ${i} ${JSON.stringify(s).slice(0, 80)}`;
    if ("recv_hex" in s) {
      const b = hex(s.recv_hex);
      if (bytewise) for (let k = 0; k < b.length; k++) conn.receive(b.subarray(k, k + 1));
      else conn.receive(b);
      drain();
      const next = steps[i + 1];
      if (next === undefined || !("expect_error" in next)) {
        assert.equal(conn.closeError, null, `${where}: unexpected connection error ${errorCodeName(conn.closeError ?? 0)}`);
      }
    } else if ("expect_error" in s) {
      assert.equal(conn.closed, true, `${where}: connection must have failed`);
      assert.equal(conn.closeError, errCode(s.expect_error), `${where}: error code`);
    } else if ("command" in s) {
      const id = s.call_id as number;
      switch (s.command) {
        case "start_call":
          if (s.refused === true) {
            assert.throws(() => conn.startCall(s.method as string, s.codec as number, BigInt(s.timeout_us as number), md(s.metadata)));
          } else {
            assert.equal(conn.startCall(s.method as string, s.codec as number, BigInt(s.timeout_us as number), md(s.metadata)), id);
          }
          break;
        case "send_headers":
          conn.sendHeaders(id, md(s.metadata));
          break;
        case "send_message": {
          const ok = conn.sendMessage(id, hex(s.message_hex), (s.end_stream as boolean | undefined) ?? false);
          assert.equal(ok, s.blocked !== true, `${where}: blocked`);
          break;
        }
        case "half_close":
          conn.halfClose(id);
          break;
        case "end_call":
          conn.endCall(id, statusCode(s.code), (s.message as string | undefined) ?? "", md(s.trailers ?? []));
          break;
        case "cancel":
          conn.cancel(id, statusCode(s.code));
          break;
        case "grant_credit":
          conn.grantCredit(id, s.increment as number);
          break;
        case "ping":
          conn.ping(hex(s.data_hex));
          break;
        case "go_away":
          conn.goAway(errCode(s.code), (s.reason as string | undefined) ?? "");
          break;
        default:
          throw new Error(`unknown command ${String(s.command)}`);
      }
      drain();
    } else if ("expect_sent" in s) {
      drain();
      const got = sent.splice(0).filter((f) => s.include_credit === true || f.type !== "CREDIT");
      const want = s.expect_sent as J[];
      assert.equal(got.length, want.length, `${where}: sent ${JSON.stringify(got.map(frameJson), big)}`);
      want.forEach((w, k) => partial(frameJson(got[k] as Frame), w, `${where} frame ${k}`));
    } else if ("expect_events" in s) {
      drain();
      const got = events.splice(0).filter((e) => e.type !== "Writable").map(eventJson);
      const want = s.expect_events as J[];
      assert.equal(got.length, want.length, `${where}: events ${JSON.stringify(got, big)}`);
      if (s.unordered === true) {
        for (const w of want) {
          const k = got.findIndex((g) => {
            try {
              partial(g, w, "");
              return true;
            } catch {
              return false;
            }
          });
          assert.ok(k >= 0, `${where}: no event matches ${JSON.stringify(w)} in ${JSON.stringify(got, big)}`);
          got.splice(k, 1);
        }
      } else {
        want.forEach((w, k) => partial(got[k] as J, w, `${where} event ${k}`));
      }
    } else {
      throw new Error(`unknown step ${JSON.stringify(s)}`);
    }
  }
}

for (const file of ["sessions_valid.json", "sessions_invalid.json"]) {
  for (const v of load(file)) {
    test(`session: ${v.name as string}`, () => {
      runSession(v, false);
      runSession(v, true);
    });
  }
}
