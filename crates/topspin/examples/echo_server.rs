//! An echo server: `cargo run -p topspin --example echo_server -- [ADDRESS]`
//! (default `tcp://127.0.0.1:50051`; `unix:///tmp/echo.sock` works too). Ctrl-C or SIGTERM shuts it down
//! gracefully.

use bytes::Bytes;
use futures_util::StreamExt;
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::{Request, Response, Server, Status, Streaming};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "tcp://127.0.0.1:50051".into());
    let server = Server::builder()
        // Unary: the request comes back.
        .unary(
            "/echo.Echo/Echo",
            RawCodec,
            |req: Request<Bytes>| async move { Ok(Response::new(req.into_inner())) },
        )
        // Bidirectional: every message comes back, upper-cased.
        .streaming(
            "/echo.Echo/Chat",
            RawCodec,
            |req: Request<Streaming<Bytes>>| async move {
                let replies = req
                    .into_inner()
                    .map(|m: Result<Bytes, Status>| m.map(|b| Bytes::from(b.to_ascii_uppercase())));
                Ok(Response::new(replies))
            },
        )
        .bind(address.as_str())
        .await?;
    println!("echo server listening on {}", server.local_addr());
    let stop = async {
        topspin::shutdown_signal().await;
        println!("shutting down (in-flight calls get 5 s)");
    };
    server
        .serve_with_shutdown(stop, Duration::from_secs(5))
        .await;
    Ok(())
}
