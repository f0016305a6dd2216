//! TLS and mutual TLS over TCP (feature `tls`): `tls://host:port` addresses, with rustls and
//! its `ring` provider (no OpenSSL). ALPN names the protocol: `topspin/1` ([`ALPN`]).
//!
//! - A server takes a [`ServerTls`]: a certificate chain and key from PEM files (reloadable
//!   without a restart through its [`TlsReloader`]) or a whole `rustls::ServerConfig`; with
//!   [`ServerTls::client_ca_pem_file`] every client must present a certificate signed by that
//!   CA (mutual TLS), and handlers see it through
//!   [`Request::tls_peer`](crate::Request::tls_peer).
//! - A client takes a [`ClientTls`]: the webpki roots or a given CA, an optional client
//!   certificate, and an optional server-name override.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use topspin::tls::{ClientTls, ServerTls};
//! use topspin::{Endpoint, Server};
//! let tls = ServerTls::from_pem_files("server.pem", "server.key")?;
//! let reloader = tls.reloader(); // reloader.reload()? after the files were replaced
//! let server = Server::builder().tls(tls).bind("tls://0.0.0.0:50051").await?;
//! let client = ClientTls::ca_pem_file("ca.pem")?;
//! let channel = Endpoint::new("tls://localhost:50051")?.tls(client).connect().await?;
//! # Ok(()) }
//! ```

pub use tokio_rustls::rustls;

mod handshake;
#[cfg(feature = "websocket")]
pub(crate) use handshake::dial_ws;
pub(crate) use handshake::{accept, dial, dial_grpc};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The ALPN protocol name of topspin over TLS (protocol.md, "Transports").
pub const ALPN: &[u8] = b"topspin/1";

/// Why TLS settings could not be loaded or built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{path}: {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// rustls refused the settings (for example a key that does not fit the certificate).
    #[error("TLS settings: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built (for example an empty CA file).
    #[error("client certificate verification: {0}")]
    Verifier(String),
}

/// The one crypto provider: ring.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pem_err(path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::Pem {
        path: path.to_owned(),
        what: e.to_string(),
    }
}

/// Every certificate of a PEM file (at least one).
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(path, e))?;
    if certs.is_empty() {
        return Err(pem_err(path, "no CERTIFICATE block"));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem_err(path, e))
}

/// A root store of every certificate of a PEM file.
fn read_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in read_certs(path)? {
        roots.add(c).map_err(|e| pem_err(path, e))?;
    }
    Ok(roots)
}

/// Loads a certificate chain and its key.
fn load_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = read_certs(cert)?;
    let key = provider()
        .key_provider
        .load_private_key(read_key(key)?)
        .map_err(TlsError::Rustls)?;
    let ck = CertifiedKey::new(chain, key);
    ck.keys_match().map_err(TlsError::Rustls)?;
    Ok(Arc::new(ck))
}

/// The server's certificate, re-read from its files on [`TlsReloader::reload`].
#[derive(Debug)]
struct ReloadingResolver {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ReloadingResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

/// Replaces a running server's certificate and key without a restart: [`TlsReloader::reload`]
/// re-reads the PEM files the [`ServerTls`] was made from. Handshakes after it use the new
/// certificate; established connections keep theirs. Cheap to clone.
#[derive(Clone, Debug)]
pub struct TlsReloader {
    resolver: Arc<ReloadingResolver>,
}

impl TlsReloader {
    /// Re-reads the certificate chain and key. On an error (a file missing, half written, or a
    /// key that does not fit) the server keeps the certificate it had.
    pub fn reload(&self) -> Result<(), TlsError> {
        let new = load_key(&self.resolver.cert, &self.resolver.key)?;
        *self
            .resolver
            .current
            .write()
            .unwrap_or_else(|e| e.into_inner()) = new;
        Ok(())
    }
}

/// A server's TLS settings (see the [module](self) docs).
#[derive(Clone, Debug)]
pub struct ServerTls {
    config: Arc<ServerConfig>,
    resolver: Option<Arc<ReloadingResolver>>,
    /// Every client must present a certificate ([`ServerTls::client_ca_pem_file`]).
    mutual: bool,
}

impl ServerTls {
    /// The certificate chain (PEM, leaf first) and its private key (PEM) from files, no client
    /// certificates asked for. [`ServerTls::reloader`] re-reads the files.
    pub fn from_pem_files(
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<ServerTls, TlsError> {
        let (cert, key) = (cert.as_ref().to_owned(), key.as_ref().to_owned());
        let current = RwLock::new(load_key(&cert, &key)?);
        let resolver = Arc::new(ReloadingResolver { cert, key, current });
        ServerTls::with_resolver(resolver, None)
    }

    fn with_resolver(
        resolver: Arc<ReloadingResolver>,
        client_roots: Option<RootCertStore>,
    ) -> Result<ServerTls, TlsError> {
        let mutual = client_roots.is_some();
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let builder = match client_roots {
            Some(roots) => {
                let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                    .build()
                    .map_err(|e| TlsError::Verifier(e.to_string()))?;
                builder.with_client_cert_verifier(v)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(ServerTls {
            config: Arc::new(config),
            resolver: Some(resolver),
            mutual,
        })
    }

    /// Mutual TLS: every client must present a certificate that chains to a CA of this PEM
    /// file; a client without one fails its handshake. Handlers see the verified certificate
    /// through [`Request::tls_peer`](crate::Request::tls_peer). A sniffing port
    /// ([`ServerBuilder::sniff_transports`](crate::ServerBuilder::sniff_transports)) with
    /// these settings then serves TLS clients only, unless
    /// [`ServerBuilder::plaintext_beside_mtls`](crate::ServerBuilder::plaintext_beside_mtls)
    /// says otherwise: a plaintext face would let clients without a certificate in.
    pub fn client_ca_pem_file(self, ca: impl AsRef<Path>) -> Result<ServerTls, TlsError> {
        let roots = read_roots(ca.as_ref())?;
        match self.resolver {
            Some(resolver) => ServerTls::with_resolver(resolver, Some(roots)),
            None => Err(TlsError::Verifier(
                "a ServerTls made from a rustls::ServerConfig sets client verification there"
                    .into(),
            )),
        }
    }

    /// A complete rustls configuration. Its ALPN list, if empty, becomes `topspin/1`; it
    /// should use the `ring` provider this crate builds with. If it verifies client
    /// certificates, say so with [`ServerTls::requiring_client_certificates`] (rustls does not
    /// tell), so that a sniffing port serves no plaintext face beside it.
    pub fn from_config(mut config: ServerConfig) -> ServerTls {
        if config.alpn_protocols.is_empty() {
            config.alpn_protocols = vec![ALPN.to_vec()];
        }
        ServerTls {
            config: Arc::new(config),
            resolver: None,
            mutual: false,
        }
    }

    /// Marks these settings as requiring client certificates (set by
    /// [`ServerTls::client_ca_pem_file`]; for a configuration of your own).
    pub fn requiring_client_certificates(mut self) -> ServerTls {
        self.mutual = true;
        self
    }

    /// Whether every client must present a certificate.
    pub fn requires_client_certificates(&self) -> bool {
        self.mutual
    }

    /// The handle that reloads the certificate from its files (`None` for a `ServerTls` made
    /// from a `rustls::ServerConfig`: put a resolver of your own in it instead).
    pub fn reloader(&self) -> Option<TlsReloader> {
        self.resolver
            .clone()
            .map(|resolver| TlsReloader { resolver })
    }

    /// The rustls configuration.
    pub fn config(&self) -> &Arc<ServerConfig> {
        &self.config
    }

    /// The same settings with another ALPN list (WebSocket over TLS speaks `http/1.1`; one
    /// port with several faces accepts both).
    pub(crate) fn with_alpn(&self, alpn: &[&[u8]]) -> ServerTls {
        let mut config = (*self.config).clone();
        config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
        ServerTls {
            config: Arc::new(config),
            resolver: self.resolver.clone(),
            mutual: self.mutual,
        }
    }

    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }
}

/// A client's TLS settings (see the [module](self) docs). The default trusts the webpki roots
/// (Mozilla's CA list) and checks the certificate against the address's host.
#[derive(Clone)]
pub struct ClientTls {
    roots: Arc<RootCertStore>,
    identity: Option<Arc<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>>,
    server_name: Option<ServerName<'static>>,
    config: Option<Arc<ClientConfig>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("roots", &self.roots.len())
            .field("client_certificate", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .field("rustls_config", &self.config.is_some())
            .finish()
    }
}

impl Default for ClientTls {
    fn default() -> ClientTls {
        ClientTls::webpki_roots()
    }
}

impl ClientTls {
    /// Trusts the webpki roots (Mozilla's CA list, compiled in).
    pub fn webpki_roots() -> ClientTls {
        let roots = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        ClientTls {
            roots: Arc::new(roots),
            identity: None,
            server_name: None,
            config: None,
        }
    }

    /// Trusts only the CA certificates of a PEM file (a private CA).
    pub fn ca_pem_file(ca: impl AsRef<Path>) -> Result<ClientTls, TlsError> {
        Ok(ClientTls {
            roots: Arc::new(read_roots(ca.as_ref())?),
            ..ClientTls::webpki_roots()
        })
    }

    /// Presents this certificate chain and key (PEM files) when the server asks (mutual TLS).
    pub fn identity_pem_files(
        mut self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<ClientTls, TlsError> {
        let chain = read_certs(cert.as_ref())?;
        let key = read_key(key.as_ref())?;
        self.identity = Some(Arc::new((chain, key)));
        Ok(self)
    }

    /// Checks the server's certificate against this name (and sends it as SNI) instead of the
    /// address's host: for connecting by IP address or through a tunnel.
    pub fn server_name(mut self, name: &str) -> Result<ClientTls, TlsError> {
        let n = ServerName::try_from(name.to_owned())
            .map_err(|e| TlsError::Verifier(format!("server name {name:?}: {e}")))?;
        self.server_name = Some(n);
        Ok(self)
    }

    /// These settings, checking certificates against `name` unless a server name was set.
    pub(crate) fn or_server_name(self, name: &str) -> Result<ClientTls, TlsError> {
        match self.server_name {
            Some(_) => Ok(self),
            None => self.server_name(name),
        }
    }

    /// A complete rustls configuration (its ALPN list, if empty, becomes `topspin/1`).
    pub fn from_config(mut config: ClientConfig) -> ClientTls {
        if config.alpn_protocols.is_empty() {
            config.alpn_protocols = vec![ALPN.to_vec()];
        }
        ClientTls {
            config: Some(Arc::new(config)),
            ..ClientTls::webpki_roots()
        }
    }

    /// The rustls configuration, offering `alpn`.
    fn client_config(&self, alpn: &[u8]) -> Result<Arc<ClientConfig>, TlsError> {
        if let Some(c) = &self.config {
            return Ok(c.clone());
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(self.roots.clone());
        let mut config = match &self.identity {
            Some(id) => builder.with_client_auth_cert(id.0.clone(), id.1.clone_key())?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok(Arc::new(config))
    }

    /// Connects TCP to `host_port` and runs the TLS handshake, checking the certificate
    /// against the server-name override or `host`. Errors name the step and the TLS problem.
    pub(crate) async fn connect(
        &self,
        host_port: &str,
        host: &str,
        alpn: &[u8],
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
        let config = self.client_config(alpn).map_err(|e| e.to_string())?;
        let name = match &self.server_name {
            Some(n) => n.clone(),
            None => ServerName::try_from(host.to_owned())
                .map_err(|e| format!("{host:?} is not a valid TLS server name: {e}"))?,
        };
        let tcp = tokio::net::TcpStream::connect(host_port)
            .await
            .map_err(|e| e.to_string())?;
        let _ = tcp.set_nodelay(true);
        tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| handshake_error(&e))
    }
}

/// A TLS handshake failure, named so that a reader knows what to fix.
pub(crate) fn handshake_error(e: &io::Error) -> String {
    let text = e.to_string();
    let hint = if text.contains("InvalidContentType")
        || text.contains("corrupt message")
        || e.kind() == io::ErrorKind::UnexpectedEof
    {
        " (is the peer speaking TLS? a plaintext tcp:// server answers a TLS client so)"
    } else {
        ""
    };
    format!("TLS handshake failed: {text}{hint}")
}

/// What a server's TLS handshake established about the client: its verified certificate
/// chain (mutual TLS), the ALPN protocol and the server name it asked for.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct TlsPeer {
    certificates: Vec<CertificateDer<'static>>,
    alpn: Option<Vec<u8>>,
    server_name: Option<String>,
}

impl TlsPeer {
    pub(crate) fn from_server(c: &rustls::ServerConnection) -> TlsPeer {
        TlsPeer {
            certificates: c
                .peer_certificates()
                .map(|cs| cs.iter().map(|c| c.clone().into_owned()).collect())
                .unwrap_or_default(),
            alpn: c.alpn_protocol().map(<[u8]>::to_vec),
            server_name: c.server_name().map(str::to_owned),
        }
    }

    /// The client's certificate chain, DER, leaf first; empty when it presented none. With
    /// [`ServerTls::client_ca_pem_file`] it was verified against that CA.
    pub fn certificates(&self) -> &[CertificateDer<'static>] {
        &self.certificates
    }

    /// The DNS names (subject alternative names) of the client's leaf certificate.
    pub fn dns_names(&self) -> Vec<String> {
        let Some(leaf) = self.certificates.first() else {
            return Vec::new();
        };
        match webpki::EndEntityCert::try_from(leaf) {
            Ok(cert) => cert.valid_dns_names().map(|n| n.to_owned()).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The ALPN protocol agreed on (`topspin/1`, or `http/1.1` under a WebSocket).
    pub fn alpn(&self) -> Option<&[u8]> {
        self.alpn.as_deref()
    }

    /// The server name (SNI) the client asked for.
    pub fn server_name(&self) -> Option<&str> {
        self.server_name.as_deref()
    }
}
