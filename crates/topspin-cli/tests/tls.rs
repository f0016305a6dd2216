//! The `topspin` command over TLS and mutual TLS (--tls, --ca, --cert, --key, --server-name)
//! against the kvstore example served on `tls://`, with certificates made at test time.

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use topspin::tls::ServerTls;

struct Files {
    dir: PathBuf,
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A CA, a server certificate for `localhost` and a client certificate, as PEM files.
fn pki() -> Files {
    let dir = std::env::temp_dir().join(format!("topspin-cli-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    std::fs::write(
        dir.join("ca.pem"),
        ca_params.self_signed(&ca_key).unwrap().pem(),
    )
    .unwrap();
    let issuer = Issuer::from_params(&ca_params, &ca_key);
    for (name, san) in [("server", "localhost"), ("client", "cli.example")] {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![san.to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
    Files { dir }
}

fn topspin(args: &[&str]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_topspin"))
        .args(args)
        .args(["--timeout", "10s"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "topspin {args:?} hung"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn p(dir: &Path, f: &str) -> String {
    dir.join(f).display().to_string()
}

#[test]
fn list_over_tls_and_mutual_tls() {
    let files = pki();
    let d = &files.dir;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tls = ServerTls::from_pem_files(d.join("server.pem"), d.join("server.key"))
        .unwrap()
        .client_ca_pem_file(d.join("ca.pem"))
        .unwrap();
    let server = rt
        .block_on(
            kvstore::server_builder(kvstore::KvStore::default())
                .tls(tls)
                .bind("tls://127.0.0.1:0"),
        )
        .unwrap();
    let hp = server.local_addr().host_port().unwrap().to_owned();
    let shutdown = server.shutdown_handle();
    rt.spawn(server.serve());
    let (ca, cert, key) = (p(d, "ca.pem"), p(d, "client.pem"), p(d, "client.key"));
    let mtls = [
        "--ca",
        &ca,
        "--cert",
        &cert,
        "--key",
        &key,
        "--server-name",
        "localhost",
    ];

    // --tls turns a bare host:port into tls://; by IP address, with the certificate's name.
    let mut args = vec!["list", hp.as_str(), "--tls"];
    args.extend(mtls);
    let (code, out, err) = topspin(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("kv.v1.Store"), "{out}");

    // Without a client certificate the server refuses, and the command says why.
    let tls_addr = format!("tls://{hp}");
    let (code, _, err) = topspin(&["list", &tls_addr, "--ca", &ca, "--server-name", "localhost"]);
    assert_ne!(code, 0);
    assert!(err.contains("CertificateRequired"), "{err}");

    // Without --ca the private CA is unknown.
    let (code, _, err) = topspin(&["list", &tls_addr, "--server-name", "localhost"]);
    assert_ne!(code, 0);
    assert!(err.contains("UnknownIssuer"), "{err}");

    rt.block_on(shutdown.shutdown(Duration::from_millis(100)));
}
