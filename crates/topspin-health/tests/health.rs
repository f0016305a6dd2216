//! The health service over real sockets (loopback TCP and a Unix socket): Check, an unknown
//! service, Watch following changes, and a graceful shutdown turning an open watch NOT_SERVING.

use std::time::{Duration, Instant};
use topspin::{Code, Request, Server, ShutdownHandle, Streaming};
use topspin_health::v1::{HealthCheckRequest, HealthCheckResponse, HealthClient};
use topspin_health::{HealthReporter, ServingStatus};

async fn start(address: &str) -> (HealthClient, HealthReporter, ShutdownHandle) {
    let (health, reporter) = topspin_health::service();
    let server = Server::builder()
        .add_service(health)
        .bind(address)
        .await
        .unwrap();
    let address = server.local_addr().clone();
    let shutdown = server.shutdown_handle();
    tokio::spawn(server.serve());
    (
        HealthClient::connect(address).await.unwrap(),
        reporter,
        shutdown,
    )
}

fn ask(service: &str) -> Request<HealthCheckRequest> {
    Request::new(HealthCheckRequest {
        service: service.into(),
    })
}

async fn next(watch: &mut Streaming<HealthCheckResponse>) -> ServingStatus {
    tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("no status within 10 s")
        .unwrap()
        .expect("the watch ended")
        .status()
}

async fn check(client: &HealthClient, service: &str) -> Result<ServingStatus, Code> {
    client
        .check(ask(service))
        .await
        .map(|r| r.into_inner().status())
        .map_err(|s| s.code())
}

#[tokio::test]
async fn check_answers_the_status_and_not_found_for_an_unknown_service() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let (client, reporter, shutdown) = start("tcp://127.0.0.1:0").await;
        assert_eq!(check(&client, "").await, Ok(ServingStatus::Serving));
        assert_eq!(check(&client, "kv.v1.Store").await, Err(Code::NotFound));
        reporter.set_serving("kv.v1.Store");
        assert_eq!(
            check(&client, "kv.v1.Store").await,
            Ok(ServingStatus::Serving)
        );
        reporter.set_not_serving("kv.v1.Store");
        assert_eq!(
            check(&client, "kv.v1.Store").await,
            Ok(ServingStatus::NotServing)
        );
        reporter.clear_service_status("kv.v1.Store");
        assert_eq!(check(&client, "kv.v1.Store").await, Err(Code::NotFound));
        shutdown.shutdown(Duration::from_secs(1)).await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn watch_sees_every_change_and_unknown_services() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let dir = std::env::temp_dir().join(format!("topspin-health-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let address = format!("unix://{}", dir.join("h.sock").display());
        let (client, reporter, shutdown) = start(&address).await;
        reporter.set_serving("kv.v1.Store");

        let mut store = client.watch(ask("kv.v1.Store")).await.unwrap().into_inner();
        assert_eq!(next(&mut store).await, ServingStatus::Serving);
        reporter.set_not_serving("kv.v1.Store");
        assert_eq!(next(&mut store).await, ServingStatus::NotServing);
        reporter.set_serving("kv.v1.Store");
        assert_eq!(next(&mut store).await, ServingStatus::Serving);

        // An unknown service: SERVICE_UNKNOWN, and the stream stays open for when it appears.
        let mut later = client
            .watch(ask("later.v1.Svc"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(next(&mut later).await, ServingStatus::ServiceUnknown);
        reporter.set_not_serving("later.v1.Svc");
        assert_eq!(next(&mut later).await, ServingStatus::NotServing);

        shutdown.shutdown(Duration::from_secs(1)).await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_graceful_shutdown_turns_an_open_watch_not_serving_then_ends_it() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let (client, reporter, shutdown) = start("tcp://127.0.0.1:0").await;
        reporter.set_serving("kv.v1.Store");
        let mut whole = client.watch(ask("")).await.unwrap().into_inner();
        let mut store = client.watch(ask("kv.v1.Store")).await.unwrap().into_inner();
        assert_eq!(next(&mut whole).await, ServingStatus::Serving);
        assert_eq!(next(&mut store).await, ServingStatus::Serving);

        // A long grace period: the watches must not hold the drain open for all of it.
        let started = Instant::now();
        let stopping =
            tokio::spawn(async move { shutdown.shutdown(Duration::from_secs(60)).await });
        assert_eq!(next(&mut whole).await, ServingStatus::NotServing);
        assert_eq!(next(&mut store).await, ServingStatus::NotServing);
        assert!(
            whole.message().await.unwrap().is_none(),
            "the watch ends OK"
        );
        assert!(
            store.message().await.unwrap().is_none(),
            "the watch ends OK"
        );
        stopping.await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(30));

        // The reporter keeps the statuses, and ignores changes until resume.
        reporter.set_serving("kv.v1.Store");
        assert_eq!(
            reporter.status("kv.v1.Store"),
            Some(ServingStatus::NotServing)
        );
    })
    .await
    .unwrap();
}
