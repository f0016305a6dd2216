// Package wire implements the topspin wire protocol v1 (docs/protocol.md): the frame codec
// and a sans-IO connection engine that turns received bytes into events and application
// commands into bytes to send. It does no I/O and starts no goroutine.
//
// The code is split by concern, as the Rust engine (crates/topspin-proto) is:
//
//   - the codec: frame.go (types, flags, error codes), settings.go, metadata.go,
//     decode.go, encode.go, compress.go, status.go;
//   - the engine: conn.go (the Conn and call state), event.go (what it reports),
//     handshake.go (preface and first SETTINGS), recv.go (input buffering and frame
//     dispatch), payload.go (MESSAGE and CONTINUATION received, split reassembly),
//     send.go (output and messages sent), flow.go (credit both ways), calls.go (call
//     lifetimes), client.go and server.go (what only one side does), control.go (PING,
//     GOAWAY, ERROR, closing), limits.go and budget.go (local flood and memory bounds).
package wire
