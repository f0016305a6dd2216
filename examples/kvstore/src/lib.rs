//! An example topspin service: a key-value store defined in `proto/kv/v1/kv.proto`, with unary
//! (`Get`, `Put`, `Delete`), server-streaming (`Watch`), client-streaming (`Apply`) and
//! bidirectional (`GetMany`) methods. `build.rs` generates the code with `topspin-build`.
//!
//! ```
//! use kvstore::{kv, server_builder, KvStore};
//! use topspin::Request;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = server_builder(KvStore::default()).bind("tcp://127.0.0.1:0").await?;
//! let address = server.local_addr().clone();
//! let shutdown = server.shutdown_handle();
//! tokio::spawn(server.serve());
//!
//! let client = kv::StoreClient::connect(address).await?;
//! let put = kv::PutRequest { key: "greeting".into(), value: "hello".into(), expected_version: None };
//! client.put(Request::new(put)).await?;
//! let entry = client.get(Request::new(kv::GetRequest { key: "greeting".into() })).await?;
//! assert_eq!(entry.into_inner().value, "hello");
//! shutdown.shutdown(std::time::Duration::from_secs(1)).await;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

use futures_util::stream::{self, BoxStream, StreamExt};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;
use topspin::{Request, Response, Server, ServerBuilder, Status, Streaming};

/// The `kv.v1` package: messages, the `Store` trait, `StoreServer` and `StoreClient`.
pub mod kv {
    include!(concat!(env!("OUT_DIR"), "/kv.v1.rs"));
}

use kv::event::Kind;
use kv::mutation::Op;

/// `google.rpc.Status`, the conventional content of a gRPC status's details
/// (`grpc-status-details-bin`): code, message and typed detail messages.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    /// The status code.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// The message.
    #[prost(string, tag = "2")]
    pub message: String,
    /// Detail messages, each an `Any`.
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<prost_types::Any>,
}

/// Watchers that fall this many events behind are ended with `RESOURCE_EXHAUSTED`.
const WATCH_BUFFER: usize = 1024;

/// The store: a sorted map behind a mutex and a broadcast of changes. Cheap to clone; clones
/// share the data.
#[derive(Clone, Debug)]
pub struct KvStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    map: Mutex<BTreeMap<String, kv::Entry>>,
    changes: broadcast::Sender<kv::Event>,
}

impl Default for KvStore {
    fn default() -> KvStore {
        KvStore {
            inner: Arc::new(Inner {
                map: Mutex::new(BTreeMap::new()),
                changes: broadcast::channel(WATCH_BUFFER).0,
            }),
        }
    }
}

/// A server builder with the store, server reflection (so `topspin list` and `topspin call`
/// work without the `.proto`) and health checking (`topspin health ADDR kv.v1.Store`: the
/// server and `kv.v1.Store` are `SERVING` until a graceful shutdown begins).
pub fn server_builder(store: KvStore) -> ServerBuilder {
    let reflection = topspin_reflection::Reflection::new(&[
        kv::FILE_DESCRIPTOR_SET,
        topspin_health::v1::FILE_DESCRIPTOR_SET,
    ])
    .expect("the generated descriptor sets are valid");
    let (health, reporter) = topspin_health::service();
    reporter.set_serving(kv::store_descriptor::SERVICE);
    Server::builder()
        .add_service(kv::StoreServer::new(store))
        .add_service(reflection)
        .add_service(health)
}

impl KvStore {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, kv::Entry>> {
        self.inner.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get_entry(&self, key: &str) -> Result<kv::Entry, Status> {
        self.map()
            .get(key)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("no key {key:?}")))
    }

    fn put_entry(&self, put: kv::PutRequest) -> Result<u64, Status> {
        if put.key.is_empty() {
            return Err(Status::invalid_argument("the key is empty"));
        }
        let mut map = self.map();
        let current = map.get(&put.key).map_or(0, |e| e.version);
        if let Some(expected) = put.expected_version {
            if expected != current {
                let message = format!("key {:?} is at version {current}, not {expected}", put.key);
                // The details say what the key holds now, as gRPC's richer error model does:
                // a google.rpc.Status carrying the current Entry (grpcio's
                // `rpc_status.from_call`, grpc-go's `status.Details()` read it).
                let now = map.get(&put.key).cloned().unwrap_or_default();
                let details = RpcStatus {
                    code: topspin::Code::FailedPrecondition as i32,
                    message: message.clone(),
                    details: vec![prost_types::Any {
                        type_url: "type.googleapis.com/kv.v1.Entry".into(),
                        value: prost::Message::encode_to_vec(&now),
                    }],
                };
                return Err(Status::failed_precondition(message)
                    .with_details(prost::Message::encode_to_vec(&details)));
            }
        }
        let entry = kv::Entry {
            key: put.key.clone(),
            value: put.value,
            version: current + 1,
        };
        map.insert(put.key, entry.clone());
        // Sent under the lock so watchers see changes in order.
        let _ = self.inner.changes.send(kv::Event {
            kind: Some(Kind::Put(entry)),
        });
        Ok(current + 1)
    }

    fn delete_entry(&self, key: &str) -> bool {
        let mut map = self.map();
        let existed = map.remove(key).is_some();
        if existed {
            let _ = self.inner.changes.send(kv::Event {
                kind: Some(Kind::Deleted(key.to_owned())),
            });
        }
        existed
    }
}

impl kv::Store for KvStore {
    async fn get(&self, request: Request<kv::GetRequest>) -> Result<Response<kv::Entry>, Status> {
        self.get_entry(&request.get_ref().key).map(Response::new)
    }

    async fn put(
        &self,
        request: Request<kv::PutRequest>,
    ) -> Result<Response<kv::PutResponse>, Status> {
        let version = self.put_entry(request.into_inner())?;
        Ok(Response::new(kv::PutResponse { version }))
    }

    async fn delete(
        &self,
        request: Request<kv::DeleteRequest>,
    ) -> Result<Response<kv::DeleteResponse>, Status> {
        let existed = self.delete_entry(&request.get_ref().key);
        Ok(Response::new(kv::DeleteResponse { existed }))
    }

    type WatchStream = BoxStream<'static, Result<kv::Event, Status>>;

    async fn watch(
        &self,
        request: Request<kv::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let kv::WatchRequest {
            prefix,
            include_existing,
        } = request.into_inner();
        // Subscribe and snapshot under the lock: no change is missed or seen twice.
        let (rx, existing) = {
            let map = self.map();
            let rx = self.inner.changes.subscribe();
            let existing: Vec<kv::Event> = if include_existing {
                map.range(prefix.clone()..)
                    .take_while(|(k, _)| k.starts_with(&prefix))
                    .map(|(_, e)| kv::Event {
                        kind: Some(Kind::Put(e.clone())),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            (rx, existing)
        };
        let changes = stream::unfold(Some(rx), move |rx| {
            let prefix = prefix.clone();
            async move {
                let mut rx = rx?;
                loop {
                    match rx.recv().await {
                        Ok(event) => {
                            let key = match &event.kind {
                                Some(Kind::Put(e)) => &e.key,
                                Some(Kind::Deleted(k)) => k,
                                None => continue,
                            };
                            if key.starts_with(&prefix) {
                                return Some((Ok(event), Some(rx)));
                            }
                        }
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            let status = Status::resource_exhausted(format!(
                                "the watcher fell {n} changes behind; watch again"
                            ));
                            return Some((Err(status), None));
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            }
        });
        let events = stream::iter(existing.into_iter().map(Ok)).chain(changes);
        Ok(Response::new(events.boxed()))
    }

    async fn apply(
        &self,
        request: Request<Streaming<kv::Mutation>>,
    ) -> Result<Response<kv::ApplySummary>, Status> {
        let mut mutations = request.into_inner();
        let mut summary = kv::ApplySummary::default();
        while let Some(m) = mutations.message().await? {
            match m.op {
                Some(Op::Put(put)) => {
                    self.put_entry(put)?;
                    summary.puts += 1;
                }
                Some(Op::Delete(d)) => {
                    if self.delete_entry(&d.key) {
                        summary.deletes += 1;
                    }
                }
                None => return Err(Status::invalid_argument("a mutation has no op")),
            }
        }
        Ok(Response::new(summary))
    }

    type GetManyStream = BoxStream<'static, Result<kv::Entry, Status>>;

    async fn get_many(
        &self,
        request: Request<Streaming<kv::GetRequest>>,
    ) -> Result<Response<Self::GetManyStream>, Status> {
        let store = self.clone();
        let entries = request
            .into_inner()
            .map(move |r| r.and_then(|r| store.get_entry(&r.key)));
        Ok(Response::new(entries.boxed()))
    }
}

/// The top-level README's Rust examples, compiled as doctests of this crate, whose
/// dependencies are the ones the README lists.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;

/// docs/deploying.md's Rust examples (balancing, connection age, shutdown, retries), compiled
/// as doctests of this crate too (`no_run`: they name hosts that are not there).
#[cfg(doctest)]
#[doc = include_str!("../../../docs/deploying.md")]
pub struct DeployingExamples;
