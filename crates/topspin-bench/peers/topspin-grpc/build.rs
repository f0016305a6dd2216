//! topspin-build's `BenchServer` and `BenchClient` (what a topspin user writes) and
//! tonic-prost-build's `BenchClient` and `BenchServer` (what a gRPC user has), all for
//! proto/bench/v1/bench.proto; the messages are topspin-bench-common's prost types.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../../proto");
    let file = format!("{proto_dir}/bench/v1/bench.proto");
    println!("cargo:rerun-if-changed={file}");
    topspin_build::configure()
        .extern_path(".bench.v1", "::topspin_bench_common::pb")
        .compile(std::slice::from_ref(&file), &[proto_dir.to_string()])?;
    let tonic_out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("tonic");
    std::fs::create_dir_all(&tonic_out)?;
    let fds = protox::compile([&file], [proto_dir])?;
    tonic_prost_build::configure()
        .out_dir(&tonic_out)
        .extern_path(".bench.v1", "::topspin_bench_common::pb")
        .compile_fds(fds)?;
    Ok(())
}
