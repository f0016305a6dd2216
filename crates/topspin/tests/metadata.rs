//! Metadata both ways: request headers, response headers and trailers, text and binary.

mod common;

use common::*;
use topspin::codec::RawCodec;
use topspin::{Metadata, Request};

#[tokio::test]
async fn request_metadata_reaches_the_handler_and_comes_back() {
    for t in BOTH {
        let server = serve(builder(Probe::default()), t).await;
        let ch = server.channel().await;
        let md = Metadata::builder()
            .text("user", "ann")
            .unwrap()
            .text("greeting", "grüße 👋")
            .unwrap()
            .binary("trace-bin", &[0, 1, 2, 255])
            .unwrap()
            .text("user", "bob")
            .unwrap()
            .build();
        let r = ch
            .unary(
                RawCodec,
                HEADERS,
                Request::new(bytes("x")).with_metadata(md),
            )
            .await
            .unwrap();
        for got in [r.metadata(), r.trailers()] {
            assert_eq!(got.get_str("greeting"), Some("grüße 👋"));
            assert_eq!(got.get("trace-bin"), Some(&[0u8, 1, 2, 255][..]));
            assert_eq!(got.get_all("user").count(), 2);
        }
        assert!(
            r.metadata().get_str("peer").is_some(),
            "handler sees the peer address"
        );
        server.stop().await;
    }
}

#[tokio::test]
async fn invalid_metadata_is_refused_before_sending() {
    assert!(Metadata::builder().text("Bad Key", "x").is_err());
    assert!(Metadata::builder().text("k-bin", "x").is_err());
}
