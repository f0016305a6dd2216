fn main() -> Result<(), topspin_build::Error> {
    topspin_build::compile_protos(
        &[
            "proto/topspin/reflection/v1/reflection.proto",
            "proto/grpc/reflection/v1/reflection.proto",
            "proto/grpc/reflection/v1alpha/reflection.proto",
        ],
        &["proto"],
    )
}
