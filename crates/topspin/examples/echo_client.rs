//! An echo client: `cargo run -p topspin --example echo_client -- [ADDRESS] [MESSAGE]`
//! (default `tcp://127.0.0.1:50051`). Start `echo_server` first, in another terminal.

use bytes::Bytes;
use futures_util::stream;
use std::time::{Duration, Instant};
use topspin::codec::RawCodec;
use topspin::{Channel, Request};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let address = args
        .next()
        .unwrap_or_else(|| "tcp://127.0.0.1:50051".into());
    let message = args.next().unwrap_or_else(|| "hello, topspin".into());
    let channel = Channel::connect(address.as_str()).await?;

    let request = Request::new(Bytes::from(message.clone())).with_timeout(Duration::from_secs(2));
    let reply = channel.unary(RawCodec, "/echo.Echo/Echo", request).await?;
    println!("Echo: {:?}", String::from_utf8_lossy(reply.get_ref()));

    let words = message
        .split_whitespace()
        .map(|w| Bytes::from(w.to_owned()))
        .collect::<Vec<_>>();
    let mut replies = channel
        .streaming(
            RawCodec,
            "/echo.Echo/Chat",
            Request::new(stream::iter(words)),
        )
        .await?
        .into_inner();
    while let Some(m) = replies.message().await? {
        println!("Chat: {:?}", String::from_utf8_lossy(&m));
    }

    let n = 10_000;
    let start = Instant::now();
    for _ in 0..n {
        channel
            .unary(
                RawCodec,
                "/echo.Echo/Echo",
                Request::new(Bytes::from_static(b"ping")),
            )
            .await?;
    }
    println!(
        "{n} calls in {:?} ({:.1} µs per call)",
        start.elapsed(),
        start.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    Ok(())
}
