// Package topspin is the Go runtime of the topspin RPC framework: a client (Dial) and a
// server (NewServer) speaking the topspin wire protocol v1 over TCP and Unix sockets.
//
// The protocol itself (frames, flow control, call states) is the sans-IO engine of package
// wire; this package runs it on connections. Its files, by concern:
//
//   - connections: conn.go (one connection: reader goroutine, engine, calls), write.go
//     (the writer and the send buffer bound), stream.go (a call's state shared by both
//     sides), watchdog.go and bounds.go (timeouts and limits), address.go and listen_*.go;
//   - server: server.go (Serve, the handshake, GracefulStop and Stop), dispatch.go (calls
//     started and run on workers, Unary and UnaryRaw), serverstream.go (the handler's
//     ServerStream), answer.go (its answers queued, their room in the send buffer taken
//     before they are encoded), interceptor.go, health.go, services.go;
//   - client: client.go (ClientConn: dial, reconnect, keep-alive), clientstream.go (calls
//     started, ClientStream), invoke.go (unary calls), callopts.go, client_interceptor.go;
//   - both: typed.go (the generated code's stream types), status.go, details.go,
//     options.go; the gRPC face on the same port in grpcface.go, grpcbridge.go,
//     grpcrefuse.go and grpczstd.go.
package topspin
