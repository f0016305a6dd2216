fn main() -> Result<(), topspin_build::Error> {
    topspin_build::compile_protos(&["proto/grpc/testing/test.proto"], &["proto"])
}
