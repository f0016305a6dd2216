//! Certificates for the TLS peers, made at start (rcgen): a CA and a `localhost` certificate,
//! and the rustls configurations (ring provider) both ends use.

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::sync::Arc;

pub struct Pki {
    ca: CertificateDer<'static>,
    cert: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
}

pub fn make() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().expect("key");
    let ca = ca_params.self_signed(&ca_key).expect("CA");
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec!["localhost".to_owned()])
        .expect("params")
        .signed_by(&key, &Issuer::from_params(&ca_params, &ca_key))
        .expect("certificate");
    Pki {
        ca: ca.der().clone(),
        cert: cert.der().clone(),
        key: PrivatePkcs8KeyDer::from(key.serialize_der()),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Pki {
    #[allow(dead_code)]
    pub fn server_config(&self, alpn: &[u8]) -> rustls::ServerConfig {
        let mut c = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![self.cert.clone()],
                PrivateKeyDer::Pkcs8(self.key.clone_key()),
            )
            .expect("server config");
        c.alpn_protocols = vec![alpn.to_vec()];
        c
    }

    #[allow(dead_code)]
    pub fn client_config(&self, alpn: &[u8]) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone()).expect("CA");
        let mut c = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        c.alpn_protocols = vec![alpn.to_vec()];
        c
    }
}
