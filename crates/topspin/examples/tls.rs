//! A TLS server and client in one process (`cargo run -p topspin --example tls`): makes a CA
//! and a `localhost` certificate (rcgen) in a temporary folder, serves over `tls://`, calls it,
//! and reloads the certificate without a restart. The README's TLS snippet is this file's core.

use bytes::Bytes;
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::tls::{ClientTls, ServerTls};
use topspin::{Endpoint, Request, Response, Server};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("topspin-tls-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (ca, cert, key) = make_certificates(&dir)?;

    // The server: a certificate chain and key from PEM files.
    let tls = ServerTls::from_pem_files(&cert, &key)?;
    let reloader = tls.reloader().expect("made from files");
    let server = Server::builder()
        .tls(tls)
        .unary(
            "/echo.Echo/Echo",
            RawCodec,
            |req: Request<Bytes>| async move { Ok(Response::new(req.into_inner())) },
        )
        .bind("tls://127.0.0.1:0")
        .await?;
    let port = server
        .local_addr()
        .host_port()
        .and_then(|hp| hp.rsplit_once(':'))
        .map(|(_, p)| p.to_owned());
    let shutdown = server.shutdown_handle();
    tokio::spawn(server.serve());

    // The client: trusts the private CA; the certificate is checked against "localhost".
    let channel = Endpoint::new(format!("tls://localhost:{}", port.unwrap_or_default()))?
        .tls(ClientTls::ca_pem_file(&ca)?)
        .connect()
        .await?;
    let reply = channel
        .unary(
            RawCodec,
            "/echo.Echo/Echo",
            Request::new(Bytes::from_static(b"over TLS")),
        )
        .await?;
    println!("reply: {}", String::from_utf8_lossy(reply.get_ref()));

    // Renewed certificate files are picked up for new handshakes without a restart.
    reloader.reload()?;

    shutdown.shutdown(Duration::from_secs(1)).await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A CA, and a certificate for `localhost` it signed, as PEM files: (ca, cert, key).
fn make_certificates(
    dir: &std::path::Path,
) -> Result<(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf), Box<dyn std::error::Error>>
{
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec!["localhost".to_owned()])?
        .signed_by(&key, &Issuer::from_params(&ca_params, &ca_key))?;
    let paths = (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    );
    std::fs::write(&paths.0, ca_cert.pem())?;
    std::fs::write(&paths.1, cert.pem())?;
    std::fs::write(&paths.2, key.serialize_pem())?;
    Ok(paths)
}
