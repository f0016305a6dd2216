// The Node server's time bounds and connection limit (docs/hardening.md; the Rust server's
// handshake_timeout, frame_timeout, idle_timeout, keep-alive and max_connections), each
// attacked at the frame level over loopback while a well-behaved client keeps being served.
// Timeouts are short here; nothing asserts on speed, only on what the server did.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Code, ErrorCode, PREFACE } from "../src/index.js";
import { connect } from "../src/node/index.js";
import { failsWith } from "./suite.js";
import { Raw, echoServer, extensionHeader, goodClient, livePeer, sleep, until } from "./hostile.js";

test("handshake timeout: silence, half a preface, a preface without SETTINGS are closed with TIMEOUT", async () => {
  const server = echoServer({ handshakeTimeoutMs: 300 });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const good = goodClient(addr);
  try {
    const silent = await Raw.open(addr);
    const half = await Raw.open(addr);
    half.send(PREFACE.subarray(0, 4));
    const noSettings = await Raw.open(addr);
    noSettings.send(PREFACE);
    for (const r of [silent, half, noSettings]) {
      await r.closedByServer();
      const err = await r.frame("ERROR", 0);
      assert.equal(err.code, ErrorCode.TIMEOUT);
      assert.match(err.reason, /handshake_timeout/);
    }
    assert.ok((await good.stop()) > 0, "the good client was served");
  } finally {
    await good.stop().catch(() => undefined);
    await server.close(100);
  }
});

test("frame timeout: half a frame and a stall closes the connection with TIMEOUT; a quiet one stays", async () => {
  const server = echoServer({ frameTimeoutMs: 300 });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const good = goodClient(addr);
  try {
    const quiet = await Raw.open(addr);
    quiet.handshake();
    const stall = await Raw.open(addr);
    stall.handshake();
    stall.send(extensionHeader(1000));
    stall.send(new Uint8Array(10));
    await stall.closedByServer();
    const err = await stall.frame("ERROR", 0);
    assert.equal(err.code, ErrorCode.TIMEOUT);
    assert.match(err.reason, /frame_timeout/);
    // a connection with no frame under way is not touched by the frame timer
    assert.ok(!quiet.closed, "the quiet connection stays");
    assert.equal(quiet.frames.filter((f) => f.type === "ERROR" || f.type === "GOAWAY").length, 0);
    quiet.destroy();
    assert.ok((await good.stop()) > 0);
  } finally {
    await good.stop().catch(() => undefined);
    await server.close(100);
  }
});

test("idle timeout: a connection without calls gets GOAWAY and is closed; one with a call open stays", async () => {
  const server = echoServer({ idleTimeoutMs: 300 });
  const addr = await server.listen("tcp://127.0.0.1:0");
  try {
    const idle = await Raw.open(addr);
    idle.handshake();
    const busy = await Raw.open(addr);
    busy.handshake();
    busy.call(1, "/t.T/Hang");
    busy.message(1, new Uint8Array([1]));
    await idle.closedByServer();
    const ga = await idle.frame("GOAWAY", 0);
    assert.equal(ga.code, ErrorCode.NO_ERROR);
    assert.match(ga.reason, /idle timeout/);
    assert.ok(!busy.closed, "a connection with a call open is not idle");
    assert.equal(busy.frames.filter((f) => f.type === "GOAWAY").length, 0);
    // its call ends: from then on it is idle, and goes the same way
    busy.send({ type: "CANCEL", flags: 0, callId: 1, code: Code.CANCELLED });
    await busy.closedByServer();
    assert.match((await busy.frame("GOAWAY", 0)).reason, /idle timeout/);
    // a channel whose connection went idle reconnects for its next call
    const ch = connect(addr);
    for (let i = 0; i < 2; i++) {
      const call = await ch.start("/t.T/Echo");
      await call.send(new Uint8Array([i]), true);
      assert.deepEqual([...((await call.receive()) ?? [])], [i]);
      await call.end();
      if (i === 0) await sleep(600);
    }
    ch.close();
  } finally {
    await server.close(100);
  }
});

test("idle timeout: counts from the handshake, not from when the handshake timer would have lapsed", async () => {
  // Regression: the idle timer was set only when another timer fired, so with the default
  // 10 s handshake timeout a connection idle for 300 ms was closed after about 10 s.
  const server = echoServer({ idleTimeoutMs: 300, handshakeTimeoutMs: 120_000 });
  const addr = await server.listen("tcp://127.0.0.1:0");
  try {
    const idle = await Raw.open(addr);
    idle.handshake();
    await idle.closedByServer(20_000);
    assert.match((await idle.frame("GOAWAY", 0)).reason, /idle timeout/);
  } finally {
    await server.close(100);
  }
});

test("idle timeout: a peer that only sends PINGs still goes idle (the time counts from the last call, not the last read)", async () => {
  // Regression: the idle time counted from the last read, so a PING now and then kept a
  // connection (and a maxConnections slot) for ever. As grpc-go's MaxConnectionIdle.
  const server = echoServer({ idleTimeoutMs: 500 });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const chatty = await Raw.open(addr);
  try {
    chatty.handshake();
    const t0 = Date.now();
    for (let i = 0; i < 100 && !chatty.closed; i++) {
      chatty.send({ type: "PING", flags: 0, callId: 0, ack: false, data: new Uint8Array(8).fill(i) });
      await sleep(150);
    }
    assert.ok(chatty.closed, "a connection that only pings is never closed");
    assert.ok(Date.now() - t0 < 5000, `closed only after ${Date.now() - t0} ms`);
    assert.match((await chatty.frame("GOAWAY", 0)).reason, /idle timeout/);
  } finally {
    chatty.destroy();
    await server.close(100);
  }
});

test("keep-alive: a peer that never answers PINGs is closed with TIMEOUT; one that answers stays", async () => {
  const server = echoServer({ keepalive: { intervalMs: 100, timeoutMs: 300 } });
  const addr = await server.listen("tcp://127.0.0.1:0");
  try {
    const deaf = await Raw.open(addr);
    deaf.handshake();
    const alive = await livePeer(addr);
    await deaf.closedByServer();
    assert.ok(deaf.frames.some((f) => f.type === "PING" && !f.ack), "the server sent a PING");
    const err = await deaf.frame("ERROR", 0);
    assert.equal(err.code, ErrorCode.TIMEOUT);
    assert.match(err.reason, /keep-alive/);
    assert.ok(alive.engine.established && !alive.raw.closed, "a peer that answers PINGs stays");
    alive.raw.destroy();
  } finally {
    await server.close(100);
  }
});

test("max connections: one over the limit is told `max_connections (N) reached` and closed; the others go on", async () => {
  const server = echoServer({ maxConnections: 3 });
  const addr = await server.listen("tcp://127.0.0.1:0");
  const good = goodClient(addr);
  const held: Raw[] = [];
  try {
    assert.ok(await until(() => good.served() > 0), "the good client is served first");
    for (let i = 0; i < 2; i++) {
      const r = await Raw.open(addr);
      r.handshake();
      held.push(r);
    }
    assert.ok(await until(() => (server as unknown as { conns: Set<unknown> }).conns.size === 3), "three connections served");
    // a client over the limit: its first call fails with the reason
    const over = connect(addr, { backoff: { initialMs: 10_000, maxMs: 10_000 } });
    const call = await over.start("/t.T/Echo");
    await call.send(new Uint8Array([1]), true);
    const e = await failsWith(call.end(), Code.UNAVAILABLE);
    assert.match(e.rawMessage, /max_connections \(3\) reached/);
    over.close();
    // a raw one that makes no call is told after a while, with ERROR
    const silent = await Raw.open(addr);
    silent.handshake();
    await silent.closedByServer();
    const err = await silent.frame("ERROR", 0);
    assert.equal(err.code, ErrorCode.INTERNAL_ERROR);
    assert.match(err.reason, /max_connections \(3\) reached/);
    // the good client was served throughout; once a slot is free a new client is served
    assert.ok((await good.stop()) > 0);
    held[0]?.destroy();
    assert.ok(await until(() => (server as unknown as { conns: Set<unknown> }).conns.size < 3), "a slot freed");
    const ch = connect(addr);
    const c2 = await ch.start("/t.T/Echo");
    await c2.send(new Uint8Array([7]), true);
    assert.deepEqual([...((await c2.receive()) ?? [])], [7]);
    ch.close();
  } finally {
    for (const r of held) r.destroy();
    await good.stop().catch(() => undefined);
    await server.close(100);
  }
});

test("WebSocket listener: an upgrade request that never ends is closed by the handshake timeout; a good client is served", async () => {
  const server = echoServer({ handshakeTimeoutMs: 300 });
  const addr = await server.listen("ws://127.0.0.1:0/topspin");
  const good = goodClient(addr);
  const stall = await Raw.open(`tcp://127.0.0.1:${new URL(addr).port}`);
  try {
    stall.send(new TextEncoder().encode("GET /topspin HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"));
    await stall.closedByServer();
    assert.match(Buffer.concat(stall.bytes).toString("latin1"), /^HTTP\/1\.1 408/);
    assert.ok((await good.stop()) > 0);
  } finally {
    stall.destroy();
    await good.stop().catch(() => undefined);
    await server.close(100);
  }
});
