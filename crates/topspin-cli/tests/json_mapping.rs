//! JSON <-> protobuf through the `topspin` binary for every field kind and well-known types,
//! against the `acme.shop.v1` corpus service with reflection.

use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};
use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;
use topspin::{Request, Response, Server, Status, Streaming};
use topspin_build_compile_tests::acme::common::v1 as common;
use topspin_build_compile_tests::acme::shop::v1 as shop;

struct Shop;

fn product() -> shop::Product {
    shop::Product {
        id: "p1".into(),
        u64: u64::MAX,
        s32: -5,
        rating: 0.5,
        active: true,
        image: Bytes::from_static(b"\x00\x01hi"),
        price: Some(common::Money {
            currency: common::Currency::Usd as i32,
            units: 3,
            nanos: 0,
        }),
        tags: vec!["a".into()],
        counters: HashMap::from([("views".to_owned(), 7)]),
        note: Some(String::new()),
        shipping: Some(shop::product::Shipping::Freight(
            shop::product::Dimensions {
                width: 1.5,
                height: 0.0,
                unit: None,
            },
        )),
        kind: shop::product::Kind::Digital as i32,
        created: Some(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 0,
        }),
        warranty: Some(prost_types::Duration {
            seconds: 90,
            nanos: 0,
        }),
        subtitle: Some("sub".into()),
        ..Default::default()
    }
}

impl shop::Shop for Shop {
    async fn get_product(
        &self,
        _request: Request<shop::GetProductRequest>,
    ) -> Result<Response<shop::Product>, Status> {
        Ok(Response::new(product()))
    }
    type ListProductsStream = BoxStream<'static, Result<shop::Product, Status>>;
    async fn list_products(
        &self,
        _request: Request<shop::ListProductsRequest>,
    ) -> Result<Response<Self::ListProductsStream>, Status> {
        Ok(Response::new(stream::iter([Ok(product())]).boxed()))
    }
    async fn upload_products(
        &self,
        request: Request<Streaming<shop::Product>>,
    ) -> Result<Response<shop::UploadSummary>, Status> {
        // Answers with the Debug form of what arrived, so the test sees the decoded fields.
        let products: Vec<shop::Product> = request
            .into_inner()
            .map(|p| p.expect("valid product"))
            .collect()
            .await;
        Ok(Response::new(shop::UploadSummary {
            count: products.len() as u32,
            ids: products.iter().map(|p| format!("{p:?}")).collect(),
        }))
    }
    type ChatStream = BoxStream<'static, Result<shop::ChatMessage, Status>>;
    async fn chat(
        &self,
        request: Request<Streaming<shop::ChatMessage>>,
    ) -> Result<Response<Self::ChatStream>, Status> {
        Ok(Response::new(request.into_inner().boxed()))
    }
    async fn ping(&self, _request: Request<()>) -> Result<Response<()>, Status> {
        Ok(Response::new(()))
    }
    async fn now(&self, _request: Request<()>) -> Result<Response<prost_types::Timestamp>, Status> {
        Ok(Response::new(prost_types::Timestamp {
            seconds: 0,
            nanos: 500_000_000,
        }))
    }
    async fn price(
        &self,
        _request: Request<shop::GetProductRequest>,
    ) -> Result<Response<common::Money>, Status> {
        Ok(Response::new(common::Money::default()))
    }
}

fn topspin(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_topspin"))
        .args(args)
        .args(["--timeout", "10s"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "topspin {args:?}: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn every_field_kind_and_well_known_types() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let reflection = topspin_reflection::Reflection::new(&[shop::FILE_DESCRIPTOR_SET]).unwrap();
    let server = runtime
        .block_on(
            Server::builder()
                .add_service(shop::ShopServer::new(Shop))
                .add_service(reflection)
                .bind("tcp://127.0.0.1:0"),
        )
        .unwrap();
    let a = server.local_addr().to_string();
    let shutdown = server.shutdown_handle();
    runtime.spawn(server.serve());

    let p = topspin(&[
        "call",
        &a,
        "acme.shop.v1.Shop/GetProduct",
        "-d",
        r#"{"id": "p1"}"#,
    ]);
    assert_eq!(
        p,
        serde_json::json!({
            "id": "p1",
            "rating": 0.5,
            "u64": "18446744073709551615",
            "s32": -5,
            "active": true,
            "image": "AAFoaQ==",
            "price": {"currency": "CURRENCY_USD", "units": "3"},
            "tags": ["a"],
            "counters": {"views": "7"},
            "note": "",
            "freight": {"width": 1.5},
            "kind": "KIND_DIGITAL",
            "created": "2023-11-14T22:13:20Z",
            "warranty": "90s",
            "subtitle": "sub"
        })
    );

    // Whole well-known types as request and response.
    assert_eq!(
        topspin(&["call", &a, "acme.shop.v1.Shop/Ping"]),
        serde_json::json!({})
    );
    assert_eq!(
        topspin(&["call", &a, "acme.shop.v1.Shop/Now", "-d", "{}"]),
        serde_json::json!("1970-01-01T00:00:00.500Z")
    );

    // JSON in: the server sees every field decoded.
    let sent = r#"{"id": "x", "sf64": "-3", "f32": 9, "weightKg": 2.5, "image": "aGk=",
        "variants": {"4": {"sku": "v", "parent": {"sku": "root"}}}, "pickupStore": "north",
        "kind": "KIND_PHYSICAL", "created": "2024-01-01T00:00:00Z", "warranty": "1.5s",
        "limit": 0, "scores": [1, -2]}"#;
    let summary = topspin(&["call", &a, "acme.shop.v1.Shop/UploadProducts", "-d", sent]);
    let debug = summary["ids"][0].as_str().unwrap();
    for want in [
        "sf64: -3",
        "f32: 9",
        "weight_kg: 2.5",
        "image: b\"hi\"",
        "sku: \"root\"",
        "PickupStore(\"north\")",
        "kind: Physical",
        "seconds: 1704067200",
        "nanos: 500000000",
        "limit: Some(0)",
        "scores: [1, -2]",
    ] {
        assert!(debug.contains(want), "{want} not in {debug}");
    }
    runtime.block_on(shutdown.shutdown(Duration::from_millis(100)));
}
