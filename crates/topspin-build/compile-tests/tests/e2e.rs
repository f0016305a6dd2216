//! The generated code of the corpus, exercised over loopback: every call kind, every field kind,
//! well-known types, keyword names, a package-less file, proto2, and the benchmark service.

use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};
use prost::Message;
use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;
use topspin::{CallKind, Channel, Code, Request, Response, Server, ServerBuilder, Status};
use topspin_build_compile_tests::acme::common::v1 as common;
use topspin_build_compile_tests::acme::shop::v1 as shop;
use topspin_build_compile_tests::bench::v1 as bench;
use topspin_build_compile_tests::edge::{legacy, r#type as kw};
use topspin_build_compile_tests::nopkg;

/// Runs a test body with a hard time limit.
async fn bounded<F: Future<Output = ()>>(f: F) {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("test timed out");
}

/// Binds on an ephemeral loopback port, serves in the background, returns a connected channel.
async fn serve(builder: ServerBuilder) -> (Channel, topspin::ShutdownHandle) {
    let server = builder.bind("tcp://127.0.0.1:0").await.expect("bind");
    let address = server.local_addr().clone();
    let handle = server.shutdown_handle();
    tokio::spawn(server.serve());
    (Channel::connect(address).await.expect("connect"), handle)
}

fn product(id: &str) -> shop::Product {
    shop::Product {
        id: id.to_owned(),
        name: format!("product {id}"),
        weight_kg: 1.5,
        rating: 4.25,
        stock: -3,
        sold: -1 << 40,
        u32: u32::MAX,
        u64: u64::MAX,
        s32: i32::MIN,
        s64: i64::MIN,
        f32: 7,
        f64: 8,
        sf32: -9,
        sf64: -10,
        active: true,
        image: Bytes::from_static(&[0, 1, 2, 255]),
        price: Some(common::Money {
            currency: common::Currency::Eur as i32,
            units: 12,
            nanos: 500_000_000,
        }),
        tags: vec!["a".into(), "b".into()],
        scores: vec![1, -2, 3],
        counters: HashMap::from([("views".to_owned(), 10)]),
        variants: HashMap::from([(
            1,
            shop::Variant {
                sku: "v1".into(),
                thumbnail: Bytes::from_static(b"thumb"),
                parent: Some(Box::new(shop::Variant {
                    sku: "root".into(),
                    ..Default::default()
                })),
            },
        )]),
        note: Some("fragile".into()),
        limit: None,
        shipping: Some(shop::product::Shipping::Freight(
            shop::product::Dimensions {
                width: 1.0,
                height: 2.0,
                unit: Some(shop::product::dimensions::Unit { symbol: "m".into() }),
            },
        )),
        kind: shop::product::Kind::Physical as i32,
        created: Some(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 0,
        }),
        warranty: Some(prost_types::Duration {
            seconds: 86_400,
            nanos: 0,
        }),
        subtitle: Some("sub".into()),
        audit: Some(common::Audit {
            actor: "ann".into(),
            at: None,
        }),
        all_variants: vec![shop::Variant::default()],
    }
}

struct ShopImpl;

impl shop::Shop for ShopImpl {
    async fn get_product(
        &self,
        request: Request<shop::GetProductRequest>,
    ) -> Result<Response<shop::Product>, Status> {
        let id = request.into_inner().id;
        if id == "missing" {
            return Err(Status::not_found(format!("no product {id}")));
        }
        Ok(Response::new(product(&id)))
    }

    type ListProductsStream = BoxStream<'static, Result<shop::Product, Status>>;

    async fn list_products(
        &self,
        request: Request<shop::ListProductsRequest>,
    ) -> Result<Response<Self::ListProductsStream>, Status> {
        let limit = request.get_ref().limit;
        let items = (0..limit).map(|i| Ok(product(&format!("p{i}"))));
        Ok(Response::new(stream::iter(items).boxed()))
    }

    async fn upload_products(
        &self,
        request: Request<topspin::Streaming<shop::Product>>,
    ) -> Result<Response<shop::UploadSummary>, Status> {
        let mut stream = request.into_inner();
        let mut ids = Vec::new();
        while let Some(p) = stream.message().await? {
            assert_eq!(p, product(&p.id), "every field survives the round trip");
            ids.push(p.id);
        }
        Ok(Response::new(shop::UploadSummary {
            count: ids.len() as u32,
            ids,
        }))
    }

    type ChatStream = BoxStream<'static, Result<shop::ChatMessage, Status>>;

    async fn chat(
        &self,
        request: Request<topspin::Streaming<shop::ChatMessage>>,
    ) -> Result<Response<Self::ChatStream>, Status> {
        let replies = request.into_inner().map(|m| {
            m.map(|m| shop::ChatMessage {
                from: "shop".into(),
                text: format!("re: {}", m.text),
            })
        });
        Ok(Response::new(replies.boxed()))
    }

    async fn ping(&self, _request: Request<()>) -> Result<Response<()>, Status> {
        Ok(Response::new(()))
    }

    async fn now(&self, _request: Request<()>) -> Result<Response<prost_types::Timestamp>, Status> {
        Ok(Response::new(prost_types::Timestamp {
            seconds: 42,
            nanos: 7,
        }))
    }

    async fn price(
        &self,
        _request: Request<shop::GetProductRequest>,
    ) -> Result<Response<common::Money>, Status> {
        Ok(Response::new(product("x").price.unwrap_or_default()))
    }
}

struct AdminImpl;

impl shop::Admin for AdminImpl {
    async fn reset(&self, _request: Request<()>) -> Result<Response<shop::UploadSummary>, Status> {
        Ok(Response::new(shop::UploadSummary {
            count: 0,
            ids: vec![],
        }))
    }
}

#[tokio::test]
async fn shop_all_call_kinds() {
    bounded(async {
        let builder = Server::builder()
            .add_service(shop::ShopServer::new(ShopImpl))
            .add_service(shop::AdminServer::new(AdminImpl));
        let names: Vec<&str> = builder.methods().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "/acme.shop.v1.Shop/GetProduct",
                "/acme.shop.v1.Shop/ListProducts",
                "/acme.shop.v1.Shop/UploadProducts",
                "/acme.shop.v1.Shop/Chat",
                "/acme.shop.v1.Shop/Ping",
                "/acme.shop.v1.Shop/Now",
                "/acme.shop.v1.Shop/Price",
                "/acme.shop.v1.Admin/Reset",
            ]
        );
        let (channel, shutdown) = serve(builder).await;
        let client = shop::ShopClient::new(channel.clone());

        // Unary, every field kind.
        let p = client
            .get_product(Request::new(shop::GetProductRequest { id: "p1".into() }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(p, product("p1"));

        // A plain message is a request too (no metadata, no timeout).
        let same = client
            .get_product(shop::GetProductRequest { id: "p1".into() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(same, p);

        // Errors carry the status.
        let err = client
            .get_product(shop::GetProductRequest {
                id: "missing".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
        assert_eq!(err.message(), "no product missing");

        // Server streaming.
        let mut stream = client
            .list_products(Request::new(shop::ListProductsRequest {
                tag: String::new(),
                limit: 5,
            }))
            .await
            .unwrap()
            .into_inner();
        let mut got = Vec::new();
        while let Some(p) = stream.message().await.unwrap() {
            got.push(p.id);
        }
        assert_eq!(got, ["p0", "p1", "p2", "p3", "p4"]);

        // Client streaming, from a bare stream (`Request::new(stream)` works too, see chat).
        let uploads = stream::iter((0..3).map(|i| product(&format!("u{i}"))));
        let summary = client.upload_products(uploads).await.unwrap().into_inner();
        assert_eq!(summary.count, 3);
        assert_eq!(summary.ids, ["u0", "u1", "u2"]);

        // Bidirectional.
        let msgs = stream::iter(["hi", "bye"].map(|t| shop::ChatMessage {
            from: "me".into(),
            text: t.into(),
        }));
        let replies: Vec<String> = client
            .chat(Request::new(msgs))
            .await
            .unwrap()
            .into_inner()
            .map(|m| m.unwrap().text)
            .collect()
            .await;
        assert_eq!(replies, ["re: hi", "re: bye"]);

        // Well-known types as whole messages.
        client.ping(Request::new(())).await.unwrap();
        let now = client.now(Request::new(())).await.unwrap().into_inner();
        assert_eq!((now.seconds, now.nanos), (42, 7));
        let money = client
            .price(Request::new(shop::GetProductRequest::default()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(money.currency(), common::Currency::Eur);

        // Second service of the package, through `From<Channel>`.
        let admin = shop::AdminClient::from(channel);
        assert_eq!(
            admin
                .reset(Request::new(()))
                .await
                .unwrap()
                .into_inner()
                .count,
            0
        );
        shutdown.shutdown(Duration::from_secs(1)).await;
    })
    .await;
}

#[test]
fn descriptors_name_every_method() {
    use shop::shop_descriptor as d;
    assert_eq!(d::SERVICE, "acme.shop.v1.Shop");
    assert_eq!(d::METHODS.len(), 7);
    assert_eq!(d::GET_PRODUCT.path, "/acme.shop.v1.Shop/GetProduct");
    assert_eq!(d::GET_PRODUCT.kind, CallKind::Unary);
    assert_eq!(d::LIST_PRODUCTS.kind, CallKind::ServerStreaming);
    assert_eq!(d::UPLOAD_PRODUCTS.kind, CallKind::ClientStreaming);
    assert_eq!(d::CHAT.kind, CallKind::Bidirectional);
    assert_eq!(d::CHAT.codec, topspin::codec::CODEC_PROTOBUF);
    assert_eq!(d::PING.input_type, "google.protobuf.Empty");
    assert_eq!(d::PRICE.output_type, "acme.common.v1.Money");
    assert!(kw::nothing_descriptor::METHODS.is_empty());
}

#[test]
fn file_descriptor_set_holds_the_files_and_comments() {
    let set = prost_types::FileDescriptorSet::decode(shop::FILE_DESCRIPTOR_SET).unwrap();
    let names: Vec<&str> = set.file.iter().map(|f| f.name()).collect();
    for want in [
        "acme/common/v1/common.proto",
        "acme/shop/v1/shop.proto",
        "google/protobuf/timestamp.proto",
        "edge/keywords.proto",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let shop_file = set
        .file
        .iter()
        .find(|f| f.name() == "acme/shop/v1/shop.proto")
        .unwrap();
    let comments: Vec<&str> = shop_file
        .source_code_info
        .as_ref()
        .unwrap()
        .location
        .iter()
        .filter_map(|l| l.leading_comments.as_deref())
        .collect();
    assert!(comments
        .iter()
        .any(|c| c.contains("The catalogue service.")));
    // Every package file carries the same set.
    assert_eq!(shop::FILE_DESCRIPTOR_SET, kw::FILE_DESCRIPTOR_SET);
}

struct Keywords;

impl kw::Async for Keywords {
    async fn r#type(&self, request: Request<kw::Self_>) -> Result<Response<kw::Result>, Status> {
        let s = request.into_inner();
        Ok(Response::new(kw::Result {
            ok: format!("{}/{}/{}/{}", s.r#type, s.r#match, s.r#fn, s.self_),
        }))
    }

    async fn r#match(
        &self,
        request: Request<topspin::Streaming<kw::Send>>,
    ) -> Result<Response<kw::Status>, Status> {
        let n = request.into_inner().count().await;
        Ok(Response::new(kw::Status { code: n as i32 }))
    }

    type AwaitStream = BoxStream<'static, Result<kw::Self_, Status>>;

    async fn r#await(
        &self,
        request: Request<kw::Stream>,
    ) -> Result<Response<Self::AwaitStream>, Status> {
        Ok(Response::new(
            stream::iter(request.into_inner().items.into_iter().map(Ok)).boxed(),
        ))
    }

    type LoopStream = BoxStream<'static, Result<kw::Result, Status>>;

    async fn r#loop(
        &self,
        request: Request<topspin::Streaming<kw::Status>>,
    ) -> Result<Response<Self::LoopStream>, Status> {
        let out = request.into_inner().map(|s| {
            s.map(|s| kw::Result {
                ok: s.code.to_string(),
            })
        });
        Ok(Response::new(out.boxed()))
    }

    async fn connect(&self, request: Request<kw::Self_>) -> Result<Response<kw::Self_>, Status> {
        Ok(Response::new(request.into_inner()))
    }

    async fn new(&self, request: Request<kw::Self_>) -> Result<Response<kw::Self_>, Status> {
        let mut s = request.into_inner();
        s.r#async = true;
        Ok(Response::new(s))
    }

    async fn channel(&self, request: Request<kw::Self_>) -> Result<Response<kw::Self_>, Status> {
        let mut s = request.into_inner();
        s.super_ = "channel".into();
        Ok(Response::new(s))
    }
}

struct NothingImpl;
impl kw::Nothing for NothingImpl {}

#[tokio::test]
async fn keyword_names_work_end_to_end() {
    bounded(async {
        let builder = Server::builder()
            .add_service(kw::AsyncServer::new(Keywords))
            .add_service(kw::NothingServer::new(NothingImpl));
        let (channel, shutdown) = serve(builder).await;
        // `new`, `connect` and `channel` are RPCs here, so the client is built with `From`.
        let client = kw::AsyncClient::from(channel);
        let s = kw::Self_ {
            r#type: "t".into(),
            r#match: 3,
            r#async: false,
            r#fn: "f".into(),
            self_: "s".into(),
            super_: String::new(),
        };
        let r = client.r#type(Request::new(s.clone())).await.unwrap();
        assert_eq!(r.into_inner().ok, "t/3/f/s");
        let sends = stream::iter((0..4).map(|i| kw::Send { to: i.to_string() }));
        let n = client.r#match(Request::new(sends)).await.unwrap();
        assert_eq!(n.into_inner().code, 4);
        let items: Vec<kw::Self_> = client
            .r#await(Request::new(kw::Stream {
                items: vec![s.clone(), s.clone()],
            }))
            .await
            .unwrap()
            .into_inner()
            .map(Result::unwrap)
            .collect()
            .await;
        assert_eq!(items, [s.clone(), s.clone()]);
        let looped: Vec<String> = client
            .r#loop(Request::new(stream::iter(
                (1..=3).map(|code| kw::Status { code }),
            )))
            .await
            .unwrap()
            .into_inner()
            .map(|r| r.unwrap().ok)
            .collect()
            .await;
        assert_eq!(looped, ["1", "2", "3"]);
        assert_eq!(
            client
                .connect(Request::new(s.clone()))
                .await
                .unwrap()
                .into_inner(),
            s
        );
        assert!(
            client
                .new(Request::new(s.clone()))
                .await
                .unwrap()
                .into_inner()
                .r#async
        );
        assert_eq!(
            client
                .channel(Request::new(s.clone()))
                .await
                .unwrap()
                .into_inner()
                .super_,
            "channel"
        );
        assert_eq!(kw::Loop::For.as_str_name(), "LOOP_FOR");
        shutdown.shutdown(Duration::from_secs(1)).await;
    })
    .await;
}

struct EchoImpl;
impl nopkg::Echo for EchoImpl {
    async fn echo(&self, request: Request<nopkg::Ping>) -> Result<Response<nopkg::Ping>, Status> {
        Ok(Response::new(request.into_inner()))
    }
}

struct LegacyImpl;
impl legacy::Legacy for LegacyImpl {
    async fn touch(&self, request: Request<legacy::Old>) -> Result<Response<legacy::Old>, Status> {
        let mut old = request.into_inner();
        old.count = Some(old.count() + 1);
        Ok(Response::new(old))
    }
}

#[tokio::test]
async fn package_less_and_proto2_files() {
    bounded(async {
        let builder = Server::builder()
            .add_service(nopkg::EchoServer::new(EchoImpl))
            .add_service(legacy::LegacyServer::new(LegacyImpl));
        assert_eq!(nopkg::echo_descriptor::ECHO.path, "/Echo/Echo");
        let (channel, shutdown) = serve(builder).await;
        let echo = nopkg::EchoClient::new(channel.clone());
        let r = echo
            .echo(Request::new(nopkg::Ping { seq: 9 }))
            .await
            .unwrap();
        assert_eq!(r.into_inner().seq, 9);
        let legacy = legacy::LegacyClient::new(channel);
        let old = legacy::Old {
            name: "n".into(),
            count: None,
            packed: vec![1, 2],
            blob: None,
        };
        assert_eq!(old.count(), 7, "proto2 default");
        let r = legacy.touch(Request::new(old)).await.unwrap().into_inner();
        assert_eq!(r.count, Some(8));
        shutdown.shutdown(Duration::from_secs(1)).await;
    })
    .await;
}

struct BenchImpl {
    blob: Bytes,
}

impl bench::Bench for BenchImpl {
    async fn echo(
        &self,
        request: Request<bench::EchoRequest>,
    ) -> Result<Response<bench::EchoReply>, Status> {
        Ok(Response::new(bench::EchoReply {
            data: request.into_inner().data,
        }))
    }
    async fn get_answer(
        &self,
        request: Request<bench::AnswerRequest>,
    ) -> Result<Response<bench::AnswerReply>, Status> {
        Ok(Response::new(bench::AnswerReply {
            answer: 41 + request.get_ref().n,
        }))
    }
    async fn get_blob(
        &self,
        request: Request<bench::BlobRequest>,
    ) -> Result<Response<bench::BlobReply>, Status> {
        let size = request.get_ref().size as usize;
        if size > self.blob.len() {
            return Err(Status::invalid_argument("too big"));
        }
        Ok(Response::new(bench::BlobReply {
            data: self.blob.slice(..size),
        }))
    }
    async fn get_structs(
        &self,
        _request: Request<bench::StructsRequest>,
    ) -> Result<Response<bench::StructsReply>, Status> {
        Ok(Response::new(bench::StructsReply {
            students: (0..34).map(student).collect(),
        }))
    }
    async fn nymph_uint32(
        &self,
        request: Request<bench::Uint32Value>,
    ) -> Result<Response<bench::Uint32Value>, Status> {
        Ok(Response::new(request.into_inner()))
    }
    async fn nymph_double(
        &self,
        request: Request<bench::DoubleValue>,
    ) -> Result<Response<bench::DoubleValue>, Status> {
        Ok(Response::new(request.into_inner()))
    }
    async fn nymph_array(
        &self,
        request: Request<bench::ArrayValue>,
    ) -> Result<Response<bench::ArrayValue>, Status> {
        Ok(Response::new(request.into_inner()))
    }
    async fn nymph_blob(
        &self,
        request: Request<bench::BlobValue>,
    ) -> Result<Response<bench::BlobValue>, Status> {
        Ok(Response::new(request.into_inner()))
    }
}

fn student(i: i32) -> bench::Student {
    let address = bench::Address {
        city: format!("city {i}"),
        zipcode: 1000 + i,
        street: "main street".into(),
        number: i,
    };
    let date = bench::Date {
        year: 2000 + i,
        month: 1 + i % 12,
        day: 1 + i % 28,
    };
    bench::Student {
        name: format!("student {i}"),
        friends: i,
        home_address: Some(address.clone()),
        birth_place: Some(address.clone()),
        birth: Some(date),
        favorite_subjects: vec![bench::Subject {
            id: i,
            title: "maths".into(),
            code: "M1".into(),
        }],
        email_addresses: vec![format!("s{i}@example.com")],
        schools: vec![bench::School {
            name: "school".into(),
            address: Some(address),
            foundation: Some(date),
            email_addresses: vec!["office@example.com".into()],
        }],
    }
}

#[tokio::test]
async fn bench_service_every_method() {
    bounded(async {
        let blob = Bytes::from((0..1_000_000u32).map(|i| i as u8).collect::<Vec<u8>>());
        let builder = Server::builder()
            .add_service(bench::BenchServer::new(BenchImpl { blob: blob.clone() }));
        let (channel, shutdown) = serve(builder).await;
        let c = bench::BenchClient::new(channel);
        let data = Bytes::from_static(b"echo me");
        let r = c
            .echo(Request::new(bench::EchoRequest { data: data.clone() }))
            .await
            .unwrap();
        assert_eq!(r.into_inner().data, data);
        let r = c
            .get_answer(Request::new(bench::AnswerRequest { n: 1 }))
            .await
            .unwrap();
        assert_eq!(r.into_inner().answer, 42);
        for size in [0u32, 1, 4096, 1_000_000] {
            let r = c
                .get_blob(Request::new(bench::BlobRequest { size }))
                .await
                .unwrap();
            assert_eq!(r.into_inner().data, blob.slice(..size as usize));
        }
        let r = c
            .get_structs(Request::new(bench::StructsRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.students.len(), 34);
        assert_eq!(r.students[33], student(33));
        let r = c
            .nymph_uint32(Request::new(bench::Uint32Value { value: 7 }))
            .await
            .unwrap();
        assert_eq!(r.into_inner().value, 7);
        let r = c
            .nymph_double(Request::new(bench::DoubleValue { value: 2.5 }))
            .await
            .unwrap();
        assert_eq!(r.into_inner().value, 2.5);
        let values: Vec<u32> = (0..1000).collect();
        let r = c
            .nymph_array(Request::new(bench::ArrayValue {
                values: values.clone(),
            }))
            .await
            .unwrap();
        assert_eq!(r.into_inner().values, values);
        let r = c
            .nymph_blob(Request::new(bench::BlobValue {
                data: blob.slice(..65536),
            }))
            .await
            .unwrap();
        assert_eq!(r.into_inner().data, blob.slice(..65536));
        assert_eq!(bench::bench_descriptor::METHODS.len(), 8);
        shutdown.shutdown(Duration::from_secs(1)).await;
    })
    .await;
}
