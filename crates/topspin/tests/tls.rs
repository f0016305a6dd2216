//! TLS and mutual TLS over real TCP sockets, with certificates made at test time: the four
//! call kinds, the client's identity seen by handlers, certificate reload, and every way a
//! handshake fails — each a prompt UNAVAILABLE naming the TLS problem, never a hang.
#![cfg(feature = "tls")]

mod common;
mod layered;

use bytes::Bytes;
use common::{builder, unary, within, Probe};
use layered::{four_call_kinds, Ca, Pair};
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::tls::{ClientTls, ServerTls};
use topspin::{Address, Channel, Code, Endpoint, Request, Response, ServerBuilder, Status};

const WHO: &str = "/test.Tls/WhoAmI";

/// The test service plus a method that answers with the client certificate's DNS names.
fn service() -> ServerBuilder {
    builder(Probe::default()).unary(WHO, RawCodec, |req: Request<Bytes>| async move {
        let tls = req
            .tls_peer()
            .ok_or_else(|| Status::internal("no TLS peer"))?;
        let alpn = String::from_utf8_lossy(tls.alpn().unwrap_or_default()).into_owned();
        let certs = req.peer_certificates().map_or(0, |c| c.len());
        Ok(Response::new(Bytes::from(format!(
            "{} {alpn} {certs}",
            tls.dns_names().join(",")
        ))))
    })
}

struct Running {
    addr: Address,
    handle: topspin::ShutdownHandle,
}

async fn start(b: ServerBuilder, addr: &str) -> Running {
    let server = b.bind(addr).await.expect("bind");
    let addr = server.local_addr().clone();
    let handle = server.shutdown_handle();
    tokio::spawn(server.serve());
    Running { addr, handle }
}

fn server_tls(pair: &Pair) -> ServerTls {
    ServerTls::from_pem_files(&pair.cert, &pair.key).expect("server TLS")
}

async fn connect(addr: &Address, tls: ClientTls) -> Result<Channel, Status> {
    within(15, async {
        Endpoint::new(addr)?
            .timeout(Duration::from_secs(10))
            .tls(tls)
            .connect()
            .await
    })
    .await
}

/// `tls://localhost:PORT` for a server bound to 127.0.0.1.
fn by_name(addr: &Address) -> Address {
    let port = addr
        .host_port()
        .and_then(|hp| hp.rsplit_once(':'))
        .expect("port")
        .1;
    format!("tls://localhost:{port}").parse().expect("address")
}

fn expect_unavailable(r: Result<Channel, Status>, needle: &str) {
    let err = r.expect_err("the connection should fail");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains(needle),
        "{needle:?} not in {:?}",
        err.message()
    );
}

#[tokio::test]
async fn every_call_kind_over_tls() {
    let ca = Ca::new("test CA");
    let pair = ca.issue("server", &["localhost"], false);
    let s = start(service().tls(server_tls(&pair)), "tls://127.0.0.1:0").await;
    assert!(
        s.addr.to_string().starts_with("tls://127.0.0.1:"),
        "{}",
        s.addr
    );
    let ch = connect(&by_name(&s.addr), ClientTls::ca_pem_file(&ca.cert).unwrap())
        .await
        .expect("TLS connect");
    four_call_kinds(&ch).await;
    // Without mutual TLS the handler sees the TLS session but no client certificate.
    let who = unary(&ch, WHO, "").await.expect("who");
    assert_eq!(who, " topspin/1 0");
    s.handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn mutual_tls_shows_the_client_identity_to_handlers() {
    let ca = Ca::new("test CA");
    let server = ca.issue("server", &["localhost"], false);
    let client = ca.issue("client", &["client-7.example"], false);
    let tls = server_tls(&server)
        .client_ca_pem_file(&ca.cert)
        .expect("mTLS");
    let s = start(service().tls(tls), "tls://127.0.0.1:0").await;
    let ctls = ClientTls::ca_pem_file(&ca.cert)
        .unwrap()
        .identity_pem_files(&client.cert, &client.key)
        .unwrap();
    let ch = connect(&by_name(&s.addr), ctls)
        .await
        .expect("mTLS connect");
    assert_eq!(
        unary(&ch, WHO, "").await.expect("who"),
        "client-7.example topspin/1 1"
    );
    four_call_kinds(&ch).await;

    // A client without a certificate is refused, with the reason.
    let r = connect(&by_name(&s.addr), ClientTls::ca_pem_file(&ca.cert).unwrap()).await;
    expect_unavailable(r, "CertificateRequired");

    // A client certificate from another CA is refused.
    let other = Ca::new("other CA");
    let stranger = other.issue("client", &["stranger.example"], false);
    let ctls = ClientTls::ca_pem_file(&ca.cert)
        .unwrap()
        .identity_pem_files(&stranger.cert, &stranger.key)
        .unwrap();
    let r = connect(&by_name(&s.addr), ctls).await;
    expect_unavailable(r, "alert");
    // The server goes on serving the good client.
    assert_eq!(unary(&ch, common::UNARY, "still").await.unwrap(), "still");
    s.handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_server_certificate_from_an_unknown_ca_is_refused() {
    let ca = Ca::new("test CA");
    let other = Ca::new("other CA");
    let pair = ca.issue("server", &["localhost"], false);
    let s = start(service().tls(server_tls(&pair)), "tls://127.0.0.1:0").await;
    let r = connect(
        &by_name(&s.addr),
        ClientTls::ca_pem_file(&other.cert).unwrap(),
    )
    .await;
    expect_unavailable(r, "UnknownIssuer");
    // The webpki roots do not know the test CA either.
    let r = connect(&by_name(&s.addr), ClientTls::webpki_roots()).await;
    expect_unavailable(r, "invalid peer certificate");
    s.handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn an_expired_server_certificate_is_refused() {
    let ca = Ca::new("test CA");
    let pair = ca.issue("server", &["localhost"], true);
    let s = start(service().tls(server_tls(&pair)), "tls://127.0.0.1:0").await;
    let r = connect(&by_name(&s.addr), ClientTls::ca_pem_file(&ca.cert).unwrap()).await;
    expect_unavailable(r, "certificate expired");
    s.handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn the_wrong_host_name_is_refused_and_a_server_name_override_fixes_it() {
    let ca = Ca::new("test CA");
    let pair = ca.issue("server", &["api.example"], false);
    let s = start(service().tls(server_tls(&pair)), "tls://127.0.0.1:0").await;
    let r = connect(&by_name(&s.addr), ClientTls::ca_pem_file(&ca.cert).unwrap()).await;
    expect_unavailable(r, "not valid for name");
    // By IP address with the name the certificate carries.
    let tls = ClientTls::ca_pem_file(&ca.cert)
        .unwrap()
        .server_name("api.example")
        .unwrap();
    let ch = connect(&s.addr, tls).await.expect("override");
    assert_eq!(unary(&ch, common::UNARY, "x").await.unwrap(), "x");
    s.handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_plaintext_client_to_a_tls_port_fails_clearly() {
    let ca = Ca::new("test CA");
    let pair = ca.issue("server", &["localhost"], false);
    let s = start(service().tls(server_tls(&pair)), "tls://127.0.0.1:0").await;
    let plain: Address = s
        .addr
        .to_string()
        .replace("tls://", "tcp://")
        .parse()
        .unwrap();
    let r = within(15, Channel::connect(plain)).await;
    let err = r.expect_err("plaintext to TLS");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message()
            .contains("a tls:// or ws:// port closes a plaintext client"),
        "{:?}",
        err.message()
    );
    s.handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_tls_client_to_a_plaintext_port_fails_clearly() {
    let ca = Ca::new("test CA");
    let s = start(service(), "tcp://127.0.0.1:0").await;
    let tls: Address = s
        .addr
        .to_string()
        .replace("tcp://", "tls://")
        .parse()
        .unwrap();
    let r = connect(
        &tls,
        ClientTls::ca_pem_file(&ca.cert)
            .unwrap()
            .server_name("localhost")
            .unwrap(),
    )
    .await;
    expect_unavailable(r, "TLS handshake failed");
    // The plaintext server is unaffected.
    let ch = Channel::connect(s.addr.clone()).await.expect("plain");
    assert_eq!(unary(&ch, common::UNARY, "ok").await.unwrap(), "ok");
    s.handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_certificate_reload_takes_effect_without_a_restart() {
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let pair = old_ca.issue("server", &["localhost"], false);
    let tls = server_tls(&pair);
    let reloader = tls.reloader().expect("reloadable");
    let s = start(service().tls(tls), "tls://127.0.0.1:0").await;
    let trusts_new = || ClientTls::ca_pem_file(&new_ca.cert).unwrap();
    let old_ch = connect(
        &by_name(&s.addr),
        ClientTls::ca_pem_file(&old_ca.cert).unwrap(),
    )
    .await
    .expect("old certificate");
    expect_unavailable(
        connect(&by_name(&s.addr), trusts_new()).await,
        "UnknownIssuer",
    );

    // A broken file is refused and the old certificate stays.
    std::fs::write(&pair.cert, "not PEM").unwrap();
    assert!(reloader.reload().is_err());
    // The new certificate, written over the same files, then reloaded.
    let fresh = new_ca.issue("fresh", &["localhost"], false);
    std::fs::copy(&fresh.cert, &pair.cert).unwrap();
    std::fs::copy(&fresh.key, &pair.key).unwrap();
    reloader.reload().expect("reload");
    let ch = connect(&by_name(&s.addr), trusts_new())
        .await
        .expect("new certificate");
    assert_eq!(unary(&ch, common::UNARY, "new").await.unwrap(), "new");
    // Established connections keep going.
    assert_eq!(unary(&old_ch, common::UNARY, "old").await.unwrap(), "old");
    s.handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn tls_settings_are_required_for_a_tls_address() {
    let err = service()
        .bind("tls://127.0.0.1:0")
        .await
        .expect_err("no TLS settings");
    assert!(err.to_string().contains("ServerBuilder::tls"), "{err}");
    let err = ServerTls::from_pem_files("/nonexistent/cert.pem", "/nonexistent/key.pem")
        .expect_err("missing files");
    assert!(err.to_string().contains("/nonexistent/cert.pem"), "{err}");
}

#[tokio::test]
async fn a_channel_over_a_stream_the_application_set_up() {
    // Channel::from_stream and Server::serve_stream over TLS the application runs itself.
    let ca = Ca::new("test CA");
    let pair = ca.issue("server", &["localhost"], false);
    let server = service().bind("tcp://127.0.0.1:0").await.unwrap();
    let acceptor = server.stream_acceptor();
    let handle = server.shutdown_handle();
    tokio::spawn(server.serve());
    let (a, b) = tokio::io::duplex(64 * 1024);
    tokio::spawn(acceptor.serve(a));
    let ch = within(10, Channel::from_stream(b))
        .await
        .expect("over a pipe");
    four_call_kinds(&ch).await;
    let _ = pair;
    handle.shutdown(Duration::from_secs(1)).await;
}

/// Regression: a write the TLS layer buffered and could not flush at once (socket full) was
/// never flushed once the topspin write queue was empty, so a 16 MiB message stalled until the
/// peer's frame timeout.
#[test]
fn a_16_mib_message_each_way_over_tls() {
    let ca = Ca::new("test CA");
    let pair = ca.issue("server", &["localhost"], false);
    // The server on a runtime of its own (other threads), the client on this thread's: the
    // layout where the stall showed.
    let server_rt = tokio::runtime::Runtime::new().unwrap();
    let s = server_rt.block_on(start(service().tls(server_tls(&pair)), "tls://127.0.0.1:0"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ch = connect(&by_name(&s.addr), ClientTls::ca_pem_file(&ca.cert).unwrap())
            .await
            .expect("TLS connect");
        let big = Bytes::from(vec![5u8; 16 << 20]);
        for _ in 0..3 {
            let r = within(
                20,
                ch.unary(RawCodec, common::UNARY, Request::new(big.clone())),
            )
            .await
            .expect("16 MiB echo");
            assert_eq!(r.into_inner(), big);
        }
    });
    server_rt.block_on(s.handle.shutdown(Duration::from_secs(1)));
}

/// Regression: a transport that buffers writes (as TLS does) and cannot flush at once kept its
/// buffered bytes forever once topspin's own write queue was empty, so the call hung. A
/// `BufWriter` over a 64-byte pipe makes every flush wait for the reader.
#[tokio::test]
async fn a_buffering_stream_is_flushed_once_it_has_room() {
    let server = service().bind("tcp://127.0.0.1:0").await.unwrap();
    let acceptor = server.stream_acceptor();
    let handle = server.shutdown_handle();
    tokio::spawn(server.serve());
    let (a, b) = tokio::io::duplex(64);
    tokio::spawn(acceptor.serve(tokio::io::BufWriter::with_capacity(8192, a)));
    let ch = within(
        10,
        Channel::from_stream(tokio::io::BufWriter::with_capacity(8192, b)),
    )
    .await
    .expect("handshake");
    for n in [10usize, 1000, 100_000] {
        let body = Bytes::from(vec![1u8; n]);
        let r = within(
            10,
            ch.unary(RawCodec, common::UNARY, Request::new(body.clone())),
        )
        .await
        .expect("echo");
        assert_eq!(r.into_inner(), body);
    }
    handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_client_offering_another_alpn_protocol_is_refused() {
    use topspin::tls::rustls;
    let ca = Ca::new("test CA");
    let pair = ca.issue("server", &["localhost"], false);
    let s = start(service().tls(server_tls(&pair)), "tls://127.0.0.1:0").await;
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read_to_string(&ca.cert).unwrap();
    let der = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes()).unwrap();
    roots.add(der).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    // (h2 is accepted: it is the gRPC face's.)
    config.alpn_protocols = vec![b"spdy/3.1".to_vec()];
    let r = connect(&by_name(&s.addr), ClientTls::from_config(config)).await;
    expect_unavailable(r, "NoApplicationProtocol");
    s.handle.shutdown(Duration::from_secs(1)).await;
}

/// `dns:///name:port` with TLS settings dials each resolved address over TLS and checks the
/// certificate against the DNS name (not the resolved IP); a certificate for another name is
/// refused, and an explicit server name still wins.
#[tokio::test]
async fn a_dns_target_with_tls_settings_dials_tls_and_checks_the_name() {
    let ca = Ca::new("test CA");
    let pair = ca.issue("server", &["localhost"], false);
    let s = start(service().tls(server_tls(&pair)), "tls://127.0.0.1:0").await;
    let port = s
        .addr
        .host_port()
        .and_then(|hp| hp.rsplit_once(':'))
        .expect("port")
        .1;
    let target = format!("dns:///localhost:{port}");
    let call = |ch: Channel| async move {
        let req = Request::new(Bytes::from_static(b"x"))
            .with_wait_for_ready(true)
            .with_timeout(Duration::from_secs(10));
        within(15, ch.unary(RawCodec, WHO, req)).await
    };
    let tls = ClientTls::ca_pem_file(&ca.cert).unwrap();
    let ch = Endpoint::new(target.as_str())
        .unwrap()
        .tls(tls)
        .connect_lazy();
    let reply = call(ch).await.expect("TLS to every resolved address");
    assert!(String::from_utf8_lossy(reply.get_ref()).contains("topspin/1"));

    // The certificate is checked against the name: one for another name is refused.
    let other = ca.issue("other", &["api.example"], false);
    let s2 = start(service().tls(server_tls(&other)), "tls://127.0.0.1:0").await;
    let port2 = s2
        .addr
        .host_port()
        .and_then(|hp| hp.rsplit_once(':'))
        .expect("port")
        .1;
    let tls = ClientTls::ca_pem_file(&ca.cert).unwrap();
    let ch = Endpoint::new(format!("dns:///localhost:{port2}").as_str())
        .unwrap()
        .tls(tls)
        .connect_lazy();
    let req = Request::new(Bytes::from_static(b"x")).with_timeout(Duration::from_secs(3));
    let err = within(15, ch.unary(RawCodec, WHO, req)).await.unwrap_err();
    assert!(
        matches!(err.code(), Code::Unavailable | Code::DeadlineExceeded),
        "{err:?}"
    );
    // … unless the settings name the certificate's name.
    let tls = ClientTls::ca_pem_file(&ca.cert)
        .unwrap()
        .server_name("api.example")
        .unwrap();
    let ch = Endpoint::new(format!("dns:///localhost:{port2}").as_str())
        .unwrap()
        .tls(tls)
        .connect_lazy();
    call(ch).await.expect("server-name override");
    s.handle.shutdown(Duration::from_secs(1)).await;
    s2.handle.shutdown(Duration::from_secs(1)).await;
}
