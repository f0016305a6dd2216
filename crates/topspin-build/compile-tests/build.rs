fn main() -> Result<(), Box<dyn std::error::Error>> {
    topspin_build::compile_protos(
        &[
            "proto/acme/common/v1/common.proto",
            "proto/acme/shop/v1/shop.proto",
            "proto/edge/keywords.proto",
            "proto/edge/nopkg.proto",
            "proto/edge/proto2.proto",
        ],
        &["proto"],
    )?;
    // The benchmark service (crates/topspin-bench uses the same file).
    topspin_build::configure()
        .file_descriptor_set_name("bench_descriptor_set.bin")
        .compile(
            &["../../../proto/bench/v1/bench.proto"],
            &["../../../proto"],
        )?;
    Ok(())
}
