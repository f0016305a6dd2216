/**
 * Node-only parts of topspin: TCP and Unix socket transports, WebSocket through `ws`, and the
 * server.
 * @module
 */
export * from "./net.js";
export * from "./server.js";
export * from "./gzip.js";
export { Health, HealthService, ServingStatus } from "./health.js";
export { DescriptorIndex } from "./reflection.js";
