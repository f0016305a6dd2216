fn main() -> Result<(), topspin_build::Error> {
    topspin_build::compile_protos(&["proto/grpc/health/v1/health.proto"], &["proto"])
}
