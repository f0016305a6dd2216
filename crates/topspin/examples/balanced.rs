//! A channel over several servers: a static list, a DNS name and a resolver stream whose set
//! changes, with the default balancing (least loaded of two random choices).
//!
//! `cargo run -p topspin --example balanced`

use bytes::Bytes;
use futures_util::stream;
use std::collections::BTreeMap;
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::{resolve, Address, Balancing, Channel, Endpoint, Request, Response, Server, Status};

/// A replica that answers with its name.
async fn replica(name: &'static str) -> Result<Address, Box<dyn std::error::Error>> {
    let server = Server::builder()
        .unary(
            "/demo.Replica/Who",
            RawCodec,
            move |_: Request<Bytes>| async move {
                Ok(Response::new(Bytes::from_static(name.as_bytes())))
            },
        )
        .bind("tcp://127.0.0.1:0")
        .await?;
    let address = server.local_addr().clone();
    tokio::spawn(server.serve());
    Ok(address)
}

/// Which replica answered each of `n` calls.
async fn spread(channel: &Channel, n: usize) -> Result<BTreeMap<String, usize>, Status> {
    let mut hits = BTreeMap::new();
    for _ in 0..n {
        let reply = channel
            .unary(RawCodec, "/demo.Replica/Who", Request::new(Bytes::new()))
            .await?;
        *hits
            .entry(String::from_utf8_lossy(reply.get_ref()).into_owned())
            .or_default() += 1;
    }
    Ok(hits)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (a, b, c) = (
        replica("a").await?,
        replica("b").await?,
        replica("c").await?,
    );

    // 1. A fixed list of servers (each gets its own connection pool).
    let channel = Endpoint::balanced([a.clone(), b.clone(), c.clone()])?
        .timeout(Duration::from_secs(5))
        .connect()
        .await?;
    println!(
        "static list, least loaded of two: {:?}",
        spread(&channel, 300).await?
    );
    let channel = Endpoint::balanced([a.clone(), b.clone(), c.clone()])?
        .balancing(Balancing::round_robin())
        .connect()
        .await?;
    println!(
        "static list, round robin:         {:?}",
        spread(&channel, 300).await?
    );

    // 2. Every address of a DNS name (here `localhost`, one address): `dns:///host:port`, as
    //    in gRPC. Resolved again every 30 s and when a connection fails.
    let port = a
        .host_port()
        .and_then(|hp| hp.rsplit_once(':'))
        .map(|(_, p)| p);
    let dns = Channel::connect(format!("dns:///localhost:{}", port.unwrap_or("0"))).await?;
    println!(
        "dns:///localhost:{}: {:?} -> {:?}",
        port.unwrap_or("?"),
        dns.endpoints(),
        spread(&dns, 10).await?
    );

    // 3. Any source of endpoint sets (Kubernetes endpoints, Consul, xDS): a stream.
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<Address>>(4);
    let sets = stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|s| (Ok(s), rx)) },
    );
    let watched = Endpoint::with_resolver(resolve::from_stream(sets)).connect_lazy();
    tx.send(vec![a.clone(), b.clone()]).await?;
    println!("resolver says a, b:  {:?}", spread(&watched, 100).await?);
    tx.send(vec![c.clone()]).await?;
    while watched.endpoints() != [c.clone()] {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("resolver says c:     {:?}", spread(&watched, 100).await?);
    Ok(())
}
