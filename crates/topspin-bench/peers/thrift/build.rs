//! Generates the Thrift code of bench.thrift with the Apache Thrift compiler (`thrift`: Debian
//! `thrift-compiler`, installed by scripts/setup.sh), dropping its inner attributes so the file
//! can be `include!`d.
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=bench.thrift");
    let out = std::env::var("OUT_DIR").expect("OUT_DIR");
    let status = Command::new("thrift")
        .args(["--gen", "rs", "-out", &out, "bench.thrift"])
        .status()
        .expect("running `thrift` (is thrift-compiler installed? scripts/setup.sh installs it)");
    assert!(status.success(), "thrift --gen rs failed");
    let path = format!("{out}/bench.rs");
    let code = std::fs::read_to_string(&path).expect("generated bench.rs");
    let code: String = code
        .lines()
        .filter(|l| !l.starts_with("#![") && !l.starts_with("//!"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, code).expect("write bench.rs");
}
