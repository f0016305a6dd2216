//! Fixtures of the transport tests (TLS, WebSocket, sniffing): the four call kinds run over any
//! channel (the certificates made at test time are in `common`).
#![allow(dead_code)]

use super::common::{self, bytes, feed, unary, within};
use bytes::Bytes;
use futures_util::StreamExt;
use topspin::codec::RawCodec;
use topspin::{Channel, Request};

#[allow(unused_imports)] // not every transport test uses both
pub use super::common::{Ca, Pair};

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
