//! Snapshot tests of the generated source: the corpus in `compile-tests/proto` is generated and
//! compared with `tests/golden/`. After a deliberate change to the generator, regenerate with
//! `TOPSPIN_BLESS=1 cargo test -p topspin-build --test golden` and review the diff.

use std::path::{Path, PathBuf};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("compile-tests/proto")
}

#[test]
fn generated_source_matches_golden_files() {
    let root = corpus();
    let protos = [
        "acme/common/v1/common.proto",
        "acme/shop/v1/shop.proto",
        "edge/keywords.proto",
        "edge/nopkg.proto",
        "edge/proto2.proto",
    ]
    .map(|p| root.join(p));
    let generated = topspin_build::configure()
        .emit_rerun_if_changed(false)
        .generate(&protos, &[&root])
        .expect("the corpus compiles");
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let bless = std::env::var_os("TOPSPIN_BLESS").is_some();
    let mut mismatches = Vec::new();
    for (name, code) in &generated.files {
        let path = golden.join(name);
        if bless {
            std::fs::write(&path, code).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(want) if want == *code => {}
            Ok(want) => {
                let line = want
                    .lines()
                    .zip(code.lines())
                    .position(|(a, b)| a != b)
                    .map_or(want.lines().count().min(code.lines().count()), |i| i)
                    + 1;
                mismatches.push(format!("{name}: first difference at line {line}"));
            }
            Err(_) => mismatches.push(format!("{name}: no golden file")),
        }
    }
    if !bless {
        for entry in std::fs::read_dir(&golden).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if !generated.files.contains_key(&name) {
                mismatches.push(format!("{name}: golden file for code no longer generated"));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "generated code differs from tests/golden (rerun with TOPSPIN_BLESS=1 and review the diff):\n{}",
        mismatches.join("\n")
    );
    let names: Vec<&str> = generated.files.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "_.rs",
            "acme.common.v1.rs",
            "acme.shop.v1.rs",
            "edge.legacy.rs",
            "edge.r#type.rs"
        ]
    );
}

#[test]
fn only_client_or_only_server() {
    let root = corpus();
    let proto = root.join("edge/nopkg.proto");
    let client_only = topspin_build::configure()
        .build_server(false)
        .generate(&[&proto], &[&root])
        .unwrap();
    let code = &client_only.files["_.rs"];
    assert!(code.contains("pub struct EchoClient"));
    assert!(!code.contains("pub trait Echo"));
    let server_only = topspin_build::configure()
        .build_client(false)
        .generate(&[&proto], &[&root])
        .unwrap();
    let code = &server_only.files["_.rs"];
    assert!(code.contains("pub trait Echo"));
    assert!(code.contains("pub struct EchoServer"));
    assert!(!code.contains("EchoClient"));
}

#[test]
fn errors_name_the_file_and_problem() {
    let dir = tempfile::tempdir().unwrap();
    let missing = topspin_build::configure()
        .generate(&[dir.path().join("nope.proto")], &[dir.path()])
        .unwrap_err();
    assert!(missing.to_string().contains("nope.proto"), "{missing}");

    std::fs::write(
        dir.path().join("bad.proto"),
        "syntax = \"proto3\";\nmessage A { strin x = 1; }\n",
    )
    .unwrap();
    let bad = topspin_build::configure()
        .generate(&[dir.path().join("bad.proto")], &[dir.path()])
        .unwrap_err();
    let text = bad.to_string();
    assert!(text.starts_with("bad.proto:2:13: "), "{text}");
    assert!(text.contains("strin"), "{text}");
}

#[test]
fn compile_writes_code_and_descriptor_set() {
    let out = tempfile::tempdir().unwrap();
    let root = corpus();
    topspin_build::configure()
        .out_dir(out.path())
        .emit_rerun_if_changed(false)
        .file_descriptor_set_name("set.bin")
        .compile(&[root.join("edge/nopkg.proto")], &[&root])
        .unwrap();
    let code = std::fs::read_to_string(out.path().join("_.rs")).unwrap();
    assert!(code.contains("include_bytes!(\"set.bin\")"));
    assert!(!std::fs::read(out.path().join("set.bin"))
        .unwrap()
        .is_empty());
}
