package reflection

// reflectionpb is generated from a copy of crates/topspin-reflection/proto/topspin/reflection/v1/reflection.proto.
//go:generate go -C ../gen run ./cmd/topspin-gen -I ../reflection/proto -o .. -module github.com/topspin-rpc/topspin/go -M topspin/reflection/v1/reflection.proto=github.com/topspin-rpc/topspin/go/reflection/reflectionpb topspin/reflection/v1/reflection.proto
