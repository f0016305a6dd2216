//! (The tonic peer's build script.) Generates tonic's client and server for proto/bench/v1/bench.proto (protox, no protoc). The
//! messages themselves are topspin-bench-common's prost types (extern_path).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../../proto");
    let file = format!("{proto_dir}/bench/v1/bench.proto");
    println!("cargo:rerun-if-changed={file}");
    let fds = protox::compile([&file], [proto_dir])?;
    tonic_prost_build::configure()
        .extern_path(".bench.v1", "::topspin_bench_common::pb")
        .compile_fds(fds)?;
    Ok(())
}
