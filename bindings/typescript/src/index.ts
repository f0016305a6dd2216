/**
 * topspin for browsers and Node: the protocol engine, the client, typed service clients.
 * Node-only pieces (TCP, Unix sockets, the server) are in `@topspin/client/node`.
 * @module
 */
export * from "./frame.js";
export * from "./connection.js";
export * from "./status.js";
