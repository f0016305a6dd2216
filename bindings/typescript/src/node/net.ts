/**
 * Node transports: TCP and Unix domain sockets (`net`), WebSocket through the `ws` package (or
 * Node's own `WebSocket` where present), and address parsing.
 * @module
 */
import * as net from "node:net";
import { nodeCodecs } from "./gzip.js";
import WebSocket from "ws";
import { Channel, type ChannelOptions } from "../channel.js";
import { Code, TopspinError } from "../status.js";
import { HeldDuplex, webSocketDialer, type Dialer, type Duplex, type WebSocketCtor } from "../transport.js";

/** Wraps a connected socket as a {@link Duplex}. */
export function socketDuplex(socket: net.Socket): Duplex {
  socket.setNoDelay(true);
  // One waiter at a time (the driver's), so 'drain' never collects listeners.
  let drained: (() => void) | null = null;
  socket.on("drain", () => {
    const f = drained;
    drained = null;
    f?.();
  });
  const d = new HeldDuplex(
    (chunks) => {
      if (socket.destroyed) return;
      if (chunks.length === 1) {
        socket.write(chunks[0] as Uint8Array);
        return;
      }
      let total = 0;
      for (const c of chunks) total += c.length;
      if (total <= 16384) {
        // Small frames: one copy into one buffer is cheaper than a writev of many.
        const b = Buffer.allocUnsafe(total);
        let off = 0;
        for (const c of chunks) {
          b.set(c, off);
          off += c.length;
        }
        socket.write(b);
        return;
      }
      socket.cork();
      for (const c of chunks) socket.write(c);
      socket.uncork();
    },
    () => {
      socket.end();
      socket.destroySoon();
    },
    {
      pending: () => socket.writableLength,
      pause: () => socket.pause(),
      resume: () => socket.resume(),
      onDrain: (f) => (drained = f),
      abort: () => socket.destroy(),
    },
  );
  let why = "the peer closed the connection";
  socket.on("data", (b: Buffer) => d.deliver(b));
  socket.on("error", (e) => (why = e.message));
  socket.on("close", () => d.end(why));
  return d;
}

/** A dialer for a TCP `host:port` or a Unix socket `path` (`net.connect` options). */
export function netDialer(opts: net.NetConnectOpts): Dialer {
  return (signal?: AbortSignal) =>
    new Promise<Duplex>((resolve, reject) => {
      const s = net.connect(opts);
      const onAbort = (): void => {
        s.destroy();
        reject(new TopspinError(Code.CANCELLED, "connect aborted"));
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      s.once("connect", () => {
        signal?.removeEventListener("abort", onAbort);
        s.removeAllListeners("error");
        resolve(socketDuplex(s));
      });
      s.once("error", (e) => {
        signal?.removeEventListener("abort", onAbort);
        reject(new TopspinError(Code.UNAVAILABLE, `cannot connect: ${e.message}`));
      });
    });
}

/** A parsed address: `tcp://host:port` (or `host:port`), `unix:///path`, `ws://…`, `wss://…`. */
export type Address = { kind: "tcp"; host: string; port: number } | { kind: "unix"; path: string } | { kind: "ws"; url: string };

/** Parses an address of §14. */
export function parseAddress(address: string): Address {
  if (address.startsWith("unix://")) return { kind: "unix", path: address.slice("unix://".length) };
  if (address.startsWith("ws://") || address.startsWith("wss://")) return { kind: "ws", url: address };
  const rest = address.startsWith("tcp://") ? address.slice("tcp://".length) : address;
  const i = rest.lastIndexOf(":");
  const port = Number(rest.slice(i + 1));
  if (i < 0 || !Number.isInteger(port) || port < 0 || port > 65535) throw new TopspinError(Code.INVALID_ARGUMENT, `bad address ${address}`);
  let host = rest.slice(0, i);
  if (host.startsWith("[") && host.endsWith("]")) host = host.slice(1, -1);
  return { kind: "tcp", host, port };
}

/** The dialer for an address. */
export function dialerFor(address: string): Dialer {
  const a = parseAddress(address);
  switch (a.kind) {
    case "tcp":
      return netDialer({ host: a.host, port: a.port });
    case "unix":
      return netDialer({ path: a.path });
    case "ws": {
      const native = (globalThis as unknown as { WebSocket?: WebSocketCtor }).WebSocket;
      return webSocketDialer(a.url, native ?? (WebSocket as unknown as WebSocketCtor));
    }
  }
}

/** A channel to `address` (`tcp://127.0.0.1:50051`, `unix:///run/kv.sock`, `ws://host:port/path`). */
export function connect(address: string, options: Omit<ChannelOptions, "dial"> = {}): Channel {
  return new Channel({ codecs: nodeCodecs, ...options, dial: dialerFor(address) });
}
