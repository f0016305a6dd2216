//! Call metrics on a Prometheus endpoint: a server and a client, both with
//! `topspin::observe::Metrics`, and `metrics-exporter-prometheus` serving the text format.
//!
//! ```sh
//! cargo run -p topspin --features metrics --example prometheus
//! curl http://127.0.0.1:9000/metrics     # while it runs (Ctrl-C to stop)
//! ```
//!
//! Arguments: `[metrics address (default 127.0.0.1:9000)] [calls (default 100)]`.

use bytes::Bytes;
use metrics_exporter_prometheus::PrometheusBuilder;
use std::net::SocketAddr;
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::observe::Metrics;
use topspin::{Endpoint, Request, Response, Server, Status};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let listen: SocketAddr = args.next().as_deref().unwrap_or("127.0.0.1:9000").parse()?;
    let calls: u32 = args.next().as_deref().unwrap_or("100").parse()?;

    // The recorder first: `Metrics` registers its handles with the recorder installed then.
    PrometheusBuilder::new()
        .with_http_listener(listen)
        .install()?;
    let metrics = Metrics::new();

    let server = Server::builder()
        .interceptor(metrics.clone())
        .unary(
            "/echo.Echo/Echo",
            RawCodec,
            |req: Request<Bytes>| async move {
                if req.get_ref().is_empty() {
                    return Err(Status::invalid_argument("empty message"));
                }
                Ok(Response::new(req.into_inner()))
            },
        )
        .bind("tcp://127.0.0.1:0")
        .await?;
    let address = server.local_addr().clone();
    tokio::spawn(server.serve());

    let channel = Endpoint::new(address)?
        .interceptor(metrics)
        .connect()
        .await?;
    for i in 0..calls {
        // Every tenth call fails (INVALID_ARGUMENT), to show the `code` label.
        let message = if i % 10 == 9 {
            Bytes::new()
        } else {
            Bytes::from("hello")
        };
        let _ = channel
            .unary(RawCodec, "/echo.Echo/Echo", Request::new(message))
            .await;
    }
    println!("{calls} calls made; metrics on http://{listen}/metrics (Ctrl-C to stop)");
    tokio::select! {
        _ = topspin::shutdown_signal() => {}
        _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
    }
    Ok(())
}
