//! `grpc.health.v1` on a topspin server's gRPC face, asked by tonic's client over HTTP/2 — what
//! Kubernetes' gRPC probes, grpc_health_probe and load balancers do: Check, an unknown service,
//! and Watch following a change, from the same health state as the native service.

use std::time::Duration;
use tonic::codegen::http::uri::PathAndQuery;
use topspin::Server;
use topspin_health::v1::{HealthCheckRequest, HealthCheckResponse};
use topspin_health::ServingStatus;

fn codec() -> tonic_prost::ProstCodec<HealthCheckRequest, HealthCheckResponse> {
    tonic_prost::ProstCodec::default()
}

fn ask(service: &str) -> tonic::Request<HealthCheckRequest> {
    tonic::Request::new(HealthCheckRequest {
        service: service.into(),
    })
}

#[tokio::test]
async fn check_and_watch_over_the_grpc_face() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let (health, reporter) = topspin_health::service();
        let server = Server::builder()
            .add_service(health)
            .bind("tcp://127.0.0.1:0")
            .await
            .unwrap();
        let hp = server.local_addr().to_string().replace("tcp://", "");
        let shutdown = server.shutdown_handle();
        tokio::spawn(server.serve());
        reporter.set_serving("kv.v1.Store");

        let ch = tonic::transport::Endpoint::from_shared(format!("http://{hp}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut g = tonic::client::Grpc::new(ch);
        let check = PathAndQuery::from_static("/grpc.health.v1.Health/Check");
        for service in ["", "kv.v1.Store"] {
            g.ready().await.unwrap();
            let r = g.unary(ask(service), check.clone(), codec()).await.unwrap();
            assert_eq!(r.into_inner().status(), ServingStatus::Serving);
        }
        g.ready().await.unwrap();
        let err = g
            .unary(ask("no.such.Service"), check.clone(), codec())
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);

        g.ready().await.unwrap();
        let watch = PathAndQuery::from_static("/grpc.health.v1.Health/Watch");
        let mut s = g
            .server_streaming(ask("kv.v1.Store"), watch, codec())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            s.message().await.unwrap().unwrap().status(),
            ServingStatus::Serving
        );
        reporter.set_not_serving("kv.v1.Store");
        assert_eq!(
            s.message().await.unwrap().unwrap().status(),
            ServingStatus::NotServing
        );
        shutdown.shutdown(Duration::from_secs(1)).await;
    })
    .await
    .unwrap();
}
