//! Protobuf messages with large `bytes` fields over real sockets: sent by reference in
//! segments (`ProstCodec::encode_payload`), they arrive intact through unary, server
//! streaming, client streaming and bidirectional calls, over TCP and Unix sockets, with and
//! without compression, and through the gRPC face (topspin's gRPC client to the same port).

mod common;

use bytes::Bytes;
use common::*;
use futures_util::{stream, StreamExt};
use topspin::codec::ProstCodec;
use topspin::{
    Channel, Compression, Config, Encoding, Endpoint, Request, Response, Server, Streaming,
};

#[derive(Clone, PartialEq, prost::Message)]
struct Blob {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(bytes = "bytes", tag = "2")]
    data: Bytes,
    #[prost(bytes = "bytes", tag = "3")]
    small: Bytes,
}

type C = ProstCodec<Blob, Blob>;

fn blob(i: usize, n: usize) -> Blob {
    let data: Vec<u8> = (0..n).map(|k| ((k * 31 + i * 7) % 253) as u8).collect();
    Blob {
        name: format!("blob {i}"),
        data: data.into(),
        small: Bytes::from(vec![i as u8; 100]),
    }
}

/// A 2.5 MiB field: more than one 1 MiB call window, so sending it also waits for credit.
const N: usize = (5 << 20) / 2;

fn service(config: Config) -> topspin::ServerBuilder {
    Server::builder()
        .config(config)
        .unary("/t.B/Echo", C::default(), |r: Request<Blob>| async move {
            Ok(Response::new(r.into_inner()))
        })
        .server_streaming("/t.B/Three", C::default(), |r: Request<Blob>| async move {
            let b = r.into_inner();
            Ok(Response::new(stream::iter((0..3).map(move |i| {
                let mut m = b.clone();
                m.name = format!("{} #{i}", m.name);
                Ok(m)
            }))))
        })
        .client_streaming(
            "/t.B/Last",
            C::default(),
            |r: Request<Streaming<Blob>>| async move {
                let mut s = r.into_inner();
                let mut last = Blob::default();
                while let Some(m) = s.message().await? {
                    last = m;
                }
                Ok(Response::new(last))
            },
        )
        .streaming(
            "/t.B/Bidi",
            C::default(),
            |r: Request<Streaming<Blob>>| async move { Ok(Response::new(r.into_inner())) },
        )
}

async fn every_kind(ch: &Channel, what: &str) {
    let b = blob(1, N);
    let r = within(60, ch.unary(C::default(), "/t.B/Echo", b.clone()))
        .await
        .expect("unary");
    assert!(r.into_inner() == b, "{what}: unary came back different");

    let mut s = within(
        60,
        ch.server_streaming(C::default(), "/t.B/Three", b.clone()),
    )
    .await
    .expect("server streaming")
    .into_inner();
    for i in 0..3 {
        let m = within(60, s.message())
            .await
            .expect("message")
            .expect("three messages");
        assert_eq!(m.name, format!("blob 1 #{i}"), "{what}");
        assert!(m.data == b.data, "{what}: streamed message {i} differs");
    }
    assert!(within(60, s.message()).await.expect("end").is_none());

    let reqs: Vec<Blob> = (0..3).map(|i| blob(i, N + i)).collect();
    let last = reqs[2].clone();
    let r = within(
        60,
        ch.client_streaming(C::default(), "/t.B/Last", stream::iter(reqs.clone())),
    )
    .await
    .expect("client streaming");
    assert!(r.into_inner() == last, "{what}: client stream differs");

    let s = within(
        60,
        ch.streaming(C::default(), "/t.B/Bidi", stream::iter(reqs.clone())),
    )
    .await
    .expect("bidi")
    .into_inner();
    let got: Vec<Blob> = within(60, s.map(|m| m.expect("bidi message")).collect()).await;
    assert!(got == reqs, "{what}: bidi differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bytes_fields_arrive_intact_every_call_kind_and_transport() {
    each_transport(
        &[
            (
                Transport::Grpc,
                "large_bytes_fields_arrive_intact_through_the_grpc_face runs it, with and without gzip",
            ),
            not_standard("its server is a protobuf service of its own"),
        ],
        |t| async move {
            let server = serve(service(Config::default()), t).await;
            let ch = server.channel().await;
            every_kind(&ch, &t.to_string()).await;
            server.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bytes_fields_arrive_intact_compressed() {
    // Pseudo-random data does not shrink (sent as is, its segments kept); a run of one byte
    // does (compressed from the segments).
    let gz = Some(Compression::new(Encoding::Gzip));
    let server = serve(
        service(Config::default().with_compression(gz)),
        Transport::Tcp,
    )
    .await;
    let ch = Endpoint::new(server.addr.clone())
        .unwrap()
        .config(Config::default().with_compression(gz))
        .connect()
        .await
        .unwrap();
    every_kind(&ch, "gzip").await;
    let mut b = blob(2, N);
    b.data = Bytes::from(vec![5u8; N]);
    let r = within(60, ch.unary(C::default(), "/t.B/Echo", b.clone()))
        .await
        .expect("unary");
    assert!(r.into_inner() == b, "compressible message differs");
    server.stop().await;
}

#[cfg(feature = "grpc")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bytes_fields_arrive_intact_through_the_grpc_face() {
    let server = serve(service(Config::default()), Transport::Tcp).await;
    let port = server.addr.to_string();
    let port = port.rsplit(':').next().expect("a port").to_owned();
    for compression in [None, Some(Compression::new(Encoding::Gzip))] {
        let ch = Endpoint::new(format!("grpc://127.0.0.1:{port}"))
            .unwrap()
            .config(Config::default().with_compression(compression))
            .connect()
            .await
            .unwrap();
        every_kind(&ch, &format!("gRPC, {compression:?}")).await;
    }
    server.stop().await;
}
