//! The topspin RPC runtime: a [`Channel`] to call servers and a [`Server`] to serve them, over
//! TCP and Unix sockets, TLS ([`tls`], feature `tls`), WebSocket ([`ws`], feature `websocket`)
//! or any connected byte stream ([`Channel::from_stream`], [`Server::serve_stream`]), on tokio.
//!
//! Calls are unary, server-streaming, client-streaming or bidirectional, with deadlines,
//! metadata both ways, cancellation (drop the future), flow control and typed [`Status`]
//! errors. The wire protocol is `topspin-proto`'s; this crate does the I/O.
//!
//! **Handlers and threads.** A handler is first polled on its connection's task: one that
//! answers at once leaves in the same write, with no hop to another thread. A handler not done
//! after that first poll goes on on a task of its own (`tokio::spawn`), where blocking or
//! burning CPU holds up only its own call. So do not block before a handler's first `.await`
//! that waits (that part holds up every call of the connection); run blocking work with
//! `tokio::task::spawn_blocking`. A panicking handler ends its own call with `INTERNAL`.
//!
//! [`interceptor`]s run around calls on either side (authentication, logging, metrics), and
//! [`observe`] gives every call a `tracing` span, with OpenTelemetry trace propagation (feature
//! `otel`) and per-method metrics (feature `metrics`).
//!
//! ```
//! use bytes::Bytes;
//! use topspin::{codec::RawCodec, Channel, Request, Response, Server};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = Server::builder()
//!     .unary("/echo.Echo/Echo", RawCodec, |req: Request<Bytes>| async move {
//!         Ok(Response::new(req.into_inner()))
//!     })
//!     .bind("tcp://127.0.0.1:0")
//!     .await?;
//! let address = server.local_addr().clone();
//! let shutdown = server.shutdown_handle();
//! tokio::spawn(server.serve());
//!
//! let channel = Channel::connect(address).await?;
//! let reply = channel
//!     .unary(RawCodec, "/echo.Echo/Echo", Request::new(Bytes::from_static(b"hello")))
//!     .await?;
//! assert_eq!(reply.into_inner(), Bytes::from_static(b"hello"));
//! shutdown.shutdown(std::time::Duration::from_secs(1)).await;
//! # Ok(()) }
//! ```
// Three audited `unsafe` lines, all in transport/socket.rs, each with a measured reason: marking
// bytes `recv` wrote as initialised, and registering a socket with the reactor for one
// readiness only (tokio's descriptor-ownership contract); and codec.rs's `BufMut` for segmented
// protobuf encoding (delegating to `BytesMut`; `bytes` fields sent by reference, not copied).
// Everything else is safe code.
#![deny(unsafe_code)]
#![warn(missing_docs, unreachable_pub, clippy::too_many_lines)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod address;
mod client;
pub mod codec;
mod compression;
mod config;
mod connection;
#[cfg(all(fuzzing, feature = "grpc", feature = "websocket"))]
#[doc(hidden)]
pub mod fuzzing;
mod grpc;
pub mod interceptor;
pub mod observe;
mod request;
mod server;
mod stats;
mod status;
mod streaming;
#[cfg(test)]
mod test_util;
mod transport;

pub use address::{Address, AddressError, IntoAddress};
pub use client::resolve;
pub use client::retry::{self, HedgingPolicy, RetryBudget, RetryPolicy};
pub use client::{Balancing, Channel, Endpoint, MethodName, Policy};
pub use compression::{Compression, Encoding, MessageCompression};
pub use config::Config;
pub use interceptor::{AsyncInterceptor, CallEnd, CallInfo, Interceptor};
pub use request::{Cancellation, IntoRequest, IntoStreamingRequest, Protocol, Request, Response};
pub use server::{
    shutdown_signal, CallKind, ServeError, Server, ServerBuilder, Service, ShutdownHandle,
    StreamAcceptor,
};
pub use stats::{process_memory_budget, GaugeSnapshot, Gauges};
pub use status::{Code, Status, DETAILS_KEY};
pub use streaming::Streaming;
pub use topspin_proto::{MemoryBudget, SHARE_OF_BUDGET};
pub use topspin_proto::{Metadata, MetadataBuilder};
#[cfg(feature = "tls")]
pub use transport::tls;
#[cfg(feature = "websocket")]
pub use transport::ws;
pub use transport::{LocalUsers, PeerAddr, PeerCredentials};

/// The crate README's example, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
