//! The generated topspin client for `kv.v1.Store`, unchanged, calling a tonic server of the
//! same service through a `grpc://` address: migration in the other direction. The tonic
//! service is routed as tonic's generated servers route (by path, `tonic::server::Grpc` with
//! tonic's prost codec) and answers from the example's `KvStore`.

use futures_util::stream::{self, BoxStream, StreamExt};
use kvstore::kv::{self, event::Kind, mutation::Op, Store};
use kvstore::KvStore;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::codegen::{http, Service};
use tonic::server::{Grpc, NamedService};
use tonic_prost::ProstCodec;
use topspin::{Code, Request};

/// A topspin status as tonic's.
fn to_tonic(s: topspin::Status) -> tonic::Status {
    tonic::Status::with_details(
        tonic::Code::from_i32(i32::from(s.code().as_u16())),
        s.message().to_owned(),
        s.details().clone(),
    )
}

type BoxFut<T> = Pin<Box<dyn Future<Output = Result<T, tonic::Status>> + Send>>;
type Events = BoxStream<'static, Result<kv::Event, tonic::Status>>;
type Entries = BoxStream<'static, Result<kv::Entry, tonic::Status>>;
type HandlerFn<Req, Resp> = fn(KvStore, tonic::Request<Req>) -> BoxFut<tonic::Response<Resp>>;

/// A tower service from a handler: tonic's `UnaryService` and friends are implemented for it.
struct Handler<Req, Resp>(KvStore, HandlerFn<Req, Resp>);

impl<Req, Resp> Service<tonic::Request<Req>> for Handler<Req, Resp> {
    type Response = tonic::Response<Resp>;
    type Error = tonic::Status;
    type Future = BoxFut<tonic::Response<Resp>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), tonic::Status>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: tonic::Request<Req>) -> Self::Future {
        (self.1)(self.0.clone(), req)
    }
}

fn get(s: KvStore, r: tonic::Request<kv::GetRequest>) -> BoxFut<tonic::Response<kv::Entry>> {
    Box::pin(async move {
        let e = s
            .get(Request::new(r.into_inner()))
            .await
            .map_err(to_tonic)?;
        Ok(tonic::Response::new(e.into_inner()))
    })
}

fn put(s: KvStore, r: tonic::Request<kv::PutRequest>) -> BoxFut<tonic::Response<kv::PutResponse>> {
    Box::pin(async move {
        let v = s
            .put(Request::new(r.into_inner()))
            .await
            .map_err(to_tonic)?;
        Ok(tonic::Response::new(v.into_inner()))
    })
}

fn delete(
    s: KvStore,
    r: tonic::Request<kv::DeleteRequest>,
) -> BoxFut<tonic::Response<kv::DeleteResponse>> {
    Box::pin(async move {
        let d = s
            .delete(Request::new(r.into_inner()))
            .await
            .map_err(to_tonic)?;
        Ok(tonic::Response::new(d.into_inner()))
    })
}

fn watch(s: KvStore, r: tonic::Request<kv::WatchRequest>) -> BoxFut<tonic::Response<Events>> {
    Box::pin(async move {
        let w = s
            .watch(Request::new(r.into_inner()))
            .await
            .map_err(to_tonic)?;
        let events = w.into_inner().map(|e| e.map_err(to_tonic)).boxed();
        Ok(tonic::Response::new(events))
    })
}

fn apply(
    s: KvStore,
    r: tonic::Request<tonic::Streaming<kv::Mutation>>,
) -> BoxFut<tonic::Response<kv::ApplySummary>> {
    Box::pin(async move {
        let mut muts = r.into_inner();
        let mut sum = kv::ApplySummary::default();
        while let Some(m) = muts.message().await? {
            match m.op {
                Some(Op::Put(p)) => {
                    s.put(Request::new(p)).await.map_err(to_tonic)?;
                    sum.puts += 1;
                }
                Some(Op::Delete(d)) => {
                    s.delete(Request::new(d)).await.map_err(to_tonic)?;
                    sum.deletes += 1;
                }
                None => {}
            }
        }
        Ok(tonic::Response::new(sum))
    })
}

fn get_many(
    s: KvStore,
    r: tonic::Request<tonic::Streaming<kv::GetRequest>>,
) -> BoxFut<tonic::Response<Entries>> {
    Box::pin(async move {
        let entries = r
            .into_inner()
            .then(move |g| {
                let s = s.clone();
                async move {
                    let g = g?;
                    let e = s.get(Request::new(g)).await.map_err(to_tonic)?;
                    Ok(e.into_inner())
                }
            })
            .boxed();
        Ok(tonic::Response::new(entries))
    })
}

/// `kv.v1.Store` on tonic.
#[derive(Clone)]
struct TonicStore(KvStore);

impl NamedService for TonicStore {
    const NAME: &'static str = "kv.v1.Store";
}

impl Service<http::Request<tonic::body::Body>> for TonicStore {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let s = self.0.clone();
        Box::pin(async move {
            let res = match req.uri().path() {
                "/kv.v1.Store/Get" => {
                    let mut g = Grpc::new(ProstCodec::default());
                    g.unary(Handler(s, get), req).await
                }
                "/kv.v1.Store/Put" => {
                    let mut g = Grpc::new(ProstCodec::default());
                    g.unary(Handler(s, put), req).await
                }
                "/kv.v1.Store/Delete" => {
                    let mut g = Grpc::new(ProstCodec::default());
                    g.unary(Handler(s, delete), req).await
                }
                "/kv.v1.Store/Watch" => {
                    let mut g = Grpc::new(ProstCodec::default());
                    g.server_streaming(Handler(s, watch), req).await
                }
                "/kv.v1.Store/Apply" => {
                    let mut g = Grpc::new(ProstCodec::default());
                    g.client_streaming(Handler(s, apply), req).await
                }
                "/kv.v1.Store/GetMany" => {
                    let mut g = Grpc::new(ProstCodec::default());
                    g.streaming(Handler(s, get_many), req).await
                }
                _ => tonic::Status::unimplemented("no such method").into_http(),
            };
            Ok(res)
        })
    }
}

fn put_req(key: &str, value: &str) -> kv::PutRequest {
    kv::PutRequest {
        key: key.into(),
        value: value.into(),
        expected_version: None,
    }
}

#[tokio::test]
async fn the_generated_client_calls_a_tonic_server() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = tonic::transport::Server::builder().add_service(TonicStore(KvStore::default()));
    tokio::spawn(router.serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)));
    tokio::time::timeout(Duration::from_secs(30), async {
        // The only change from a topspin server: the address's scheme.
        let client = kv::StoreClient::connect(format!("grpc://127.0.0.1:{port}"))
            .await
            .unwrap();
        let mut watch = client
            .watch(Request::new(kv::WatchRequest {
                prefix: "user/".into(),
                include_existing: false,
            }))
            .await
            .unwrap()
            .into_inner();
        let v = client
            .put(Request::new(put_req("user/ann", "1")))
            .await
            .unwrap();
        assert_eq!(v.into_inner().version, 1);
        let e = client
            .get(Request::new(kv::GetRequest {
                key: "user/ann".into(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!((e.value.as_str(), e.version), ("1", 1));
        let missing = client
            .get(Request::new(kv::GetRequest { key: "nope".into() }))
            .await
            .unwrap_err();
        assert_eq!(missing.code(), Code::NotFound, "{missing}");
        // Server streaming: the put above shows up on the watch.
        let ev = watch.message().await.unwrap().unwrap();
        assert!(
            matches!(ev.kind, Some(Kind::Put(ref e)) if e.key == "user/ann"),
            "{ev:?}"
        );
        // Client streaming.
        let muts = vec![
            kv::Mutation {
                op: Some(Op::Put(put_req("user/bob", "2"))),
            },
            kv::Mutation {
                op: Some(Op::Delete(kv::DeleteRequest {
                    key: "user/ann".into(),
                })),
            },
        ];
        let sum = client.apply(stream::iter(muts)).await.unwrap().into_inner();
        assert_eq!((sum.puts, sum.deletes), (1, 1));
        // Bidirectional.
        let gets = vec![kv::GetRequest {
            key: "user/bob".into(),
        }];
        let mut many = client
            .get_many(stream::iter(gets))
            .await
            .unwrap()
            .into_inner();
        let bob = many.message().await.unwrap().unwrap();
        assert_eq!(bob.value, "2");
        assert!(many.message().await.unwrap().is_none());
        let deleted = client
            .delete(Request::new(kv::DeleteRequest {
                key: "user/bob".into(),
            }))
            .await
            .unwrap();
        assert!(deleted.into_inner().existed);
    })
    .await
    .expect("test timed out");
}
