/**
 * Node-only parts of topspin: TCP and Unix socket transports, WebSocket through `ws`, and the
 * server.
 * @module
 */
export * from "./net.js";
export * from "./server.js";
export * from "./gzip.js";
