//! The health watch of a balanced channel's subchannel (`grpc.health.v1.Health/Watch`, as
//! gRPC clients do with a health-check config): a subchannel whose server says it is not
//! serving is not picked.

use super::{SubState, NOT_SERVING, SERVING, UNKNOWN};
use crate::client::pool::Pool;
use crate::client::Channel;
use crate::{Code, Request, Status};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// The `grpc.health.v1.Health/Watch` method.
const WATCH: &str = "/grpc.health.v1.Health/Watch";

/// `grpc.health.v1.HealthCheckRequest`, as `topspin-health`'s proto/grpc/health/v1/health.proto
/// has it (that crate depends on this one, so its generated types cannot be used here).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    pub(super) service: String,
}

/// `grpc.health.v1.HealthCheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct HealthCheckResponse {
    #[prost(enumeration = "ServingStatus", tag = "1")]
    pub(super) status: i32,
}

/// `grpc.health.v1.HealthCheckResponse.ServingStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub(super) enum ServingStatus {
    Unknown = 0,
    Serving = 1,
    NotServing = 2,
    ServiceUnknown = 3,
}

/// The health messages through prost, under the protobuf codec id (what a `grpc.health.v1`
/// server such as `topspin-health` registers). An answer that does not decode is `None` (the
/// endpoint counts as not serving) rather than an error that would end the watch.
#[derive(Clone, Copy, Debug)]
pub(super) struct HealthCodec;

impl crate::codec::Codec for HealthCodec {
    type Encode = HealthCheckRequest;
    type Decode = Option<HealthCheckResponse>;
    const ID: u8 = crate::codec::CODEC_PROTOBUF;
    fn encode(&self, item: HealthCheckRequest) -> Result<Bytes, Status> {
        Ok(prost::Message::encode_to_vec(&item).into())
    }
    fn decode(&self, buf: Bytes) -> Result<Option<HealthCheckResponse>, Status> {
        Ok(prost::Message::decode(buf).ok())
    }
}

/// Watches one endpoint's health for as long as the subchannel lives.
pub(super) async fn watch_health(
    pool: Arc<Pool>,
    st: Arc<SubState>,
    changed: Arc<Notify>,
    service: String,
) {
    let channel = Channel::from_shared(pool.clone());
    let request = HealthCheckRequest { service };
    let set = |v: u8| {
        if st.health.swap(v, Ordering::AcqRel) != v {
            changed.notify_waiters();
        }
    };
    loop {
        let r = channel
            .server_streaming(HealthCodec, WATCH, Request::new(request.clone()))
            .await;
        // A call that fails before any answer fails on its stream's first item.
        let end = match r {
            Ok(resp) => {
                let mut answers = resp.into_inner();
                loop {
                    match answers.message().await {
                        Ok(Some(m)) => set(match m.map(|r| r.status()) {
                            Some(ServingStatus::Serving) => SERVING,
                            _ => NOT_SERVING,
                        }),
                        Ok(None) => break None,
                        Err(e) => break Some(e),
                    }
                }
            }
            Err(e) => Some(e),
        };
        if end.is_some_and(|e| e.code() == Code::Unimplemented) {
            // No health service: serving for as long as it is reachable.
            set(SERVING);
            return;
        }
        // The watch ended: the last answer stands while a connection is up.
        if pool.ready().is_none() {
            set(UNKNOWN);
        }
        let pause = Duration::from_millis(250 + fastrand::u64(..250));
        tokio::time::sleep(pause).await;
    }
}
