//! Generates the prost messages of proto/bench/v1/bench.proto with protox (no protoc needed).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../proto");
    let file = format!("{proto_dir}/bench/v1/bench.proto");
    println!("cargo:rerun-if-changed={file}");
    let fds = protox::compile([&file], [proto_dir])?;
    prost_build::Config::new()
        .bytes(["."])
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .compile_fds(fds)?;
    Ok(())
}
