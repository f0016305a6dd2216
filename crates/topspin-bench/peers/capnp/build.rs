//! Generates the Cap'n Proto code of bench.capnp (needs the `capnp` tool: Debian `capnproto`,
//! installed by scripts/setup.sh).
fn main() {
    println!("cargo:rerun-if-changed=bench.capnp");
    capnpc::CompilerCommand::new()
        .file("bench.capnp")
        .run()
        .expect("compiling bench.capnp (is `capnp` installed? scripts/setup.sh installs it)");
}
