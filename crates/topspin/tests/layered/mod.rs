//! Fixtures of the transport tests (TLS, WebSocket, sniffing): certificates made at test time
//! with rcgen, and the four call kinds run over any channel.
#![allow(dead_code)]

use super::common::{self, bytes, feed, unary, within};
use bytes::Bytes;
use futures_util::StreamExt;
use rcgen::{date_time_ymd, BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use topspin::codec::RawCodec;
use topspin::{Channel, Request};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A certificate authority that issues server and client certificates into PEM files.
pub struct Ca {
    pub dir: PathBuf,
    pub cert: PathBuf,
    params: CertificateParams,
    key: KeyPair,
}

/// A certificate and its key, as PEM files.
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn temp_dir() -> PathBuf {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("topspin-pki-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let dir = temp_dir();
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("self-signed CA");
        let path = dir.join("ca.pem");
        std::fs::write(&path, cert.pem()).expect("write CA");
        Ca {
            dir,
            cert: path,
            params,
            key,
        }
    }

    /// A certificate for `names` (DNS names or IP addresses), valid now unless `expired`.
    pub fn issue(&self, file: &str, names: &[&str], expired: bool) -> Pair {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, names.first().copied().unwrap_or("x"));
        if expired {
            params.not_before = date_time_ymd(2000, 1, 1);
            params.not_after = date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().expect("key");
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("sign");
        self.write(file, &cert.pem(), &key.serialize_pem())
    }

    /// Writes a certificate and key (replacing files of the same name).
    pub fn write(&self, file: &str, cert: &str, key: &str) -> Pair {
        let pair = Pair {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&pair.cert, cert).expect("write cert");
        std::fs::write(&pair.key, key).expect("write key");
        pair
    }
}

impl Drop for Ca {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Every call kind of the test service, over `ch`.
pub async fn four_call_kinds(ch: &Channel) {
    within(20, async {
        // Unary, small and large.
        assert_eq!(
            unary(ch, common::UNARY, "hello").await.expect("unary"),
            "hello"
        );
        let big = Bytes::from(vec![9u8; 3 * 1024 * 1024]);
        let r = ch
            .unary(RawCodec, common::UNARY, Request::new(big.clone()))
            .await
            .expect("large unary");
        assert_eq!(r.into_inner(), big);
        // Server streaming.
        let mut s = ch
            .server_streaming(RawCodec, common::SERVER_STREAM, Request::new(bytes("5")))
            .await
            .expect("server streaming")
            .into_inner();
        let mut got = Vec::new();
        while let Some(m) = s.message().await.expect("message") {
            got.push(String::from_utf8_lossy(&m).into_owned());
        }
        assert_eq!(got, ["0", "1", "2", "3", "4"]);
        // Client streaming.
        let (tx, rx) = feed();
        for p in ["a", "b", "c"] {
            tx.send(bytes(p)).expect("feed");
        }
        drop(tx);
        let r = ch
            .client_streaming(RawCodec, common::CLIENT_STREAM, Request::new(rx))
            .await
            .expect("client streaming");
        assert_eq!(r.into_inner(), "abc");
        // Bidirectional.
        let (tx, rx) = feed();
        let mut s = ch
            .streaming(RawCodec, common::BIDI, Request::new(rx))
            .await
            .expect("bidi")
            .into_inner();
        for i in 0..3 {
            tx.send(bytes(&i.to_string())).expect("feed");
            let m = s.next().await.expect("an answer").expect("ok");
            assert_eq!(m, format!("echo:{i}").as_bytes());
        }
        drop(tx);
        assert!(s.next().await.is_none());
    })
    .await;
}
