/**
 * topspin for browsers and Node: the protocol engine, the client, typed service clients and the
 * WebSocket transport. Node-only pieces (TCP, Unix sockets, the server) are in
 * `@topspin/topspin/node`.
 * @module
 */
export * from "./frame.js";
export * from "./connection.js";
export * from "./status.js";
export * from "./queue.js";
export * from "./transport.js";
export * from "./channel.js";
export * from "./client.js";
export * from "./interceptor.js";
export * from "./calls.js";
