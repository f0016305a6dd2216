//! Generates topspin's `BenchClient` / `BenchServer` for proto/bench/v1/bench.proto with
//! topspin-build — what a topspin user gets. The messages are topspin-bench-common's prost
//! types (extern_path), shared with the tonic and tarpc peers.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
    topspin_build::configure()
        .extern_path(".bench.v1", "::topspin_bench_common::pb")
        // The GetStructs reply: a type whose encoding borrows the server's shared data (no deep
        // clone per call) and whose decoding owns native structs (src/bin/topspin-bench-topspin.rs).
        .extern_path(".bench.v1.StructsReply", "crate::shared::StructsReply")
        .compile(
            &[format!("{proto_dir}/bench/v1/bench.proto")],
            &[proto_dir.to_string()],
        )?;
    Ok(())
}
