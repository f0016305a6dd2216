//! Unix socket paths: a live server's socket is never taken over or deleted by another server;
//! a stale socket file (nothing answers) is replaced.

use bytes::Bytes;
use std::time::Duration;
use topspin::codec::RawCodec;
use topspin::{Channel, Request, Response, Server, ServerBuilder};

fn builder() -> ServerBuilder {
    Server::builder().unary("/t.S/Echo", RawCodec, |r: Request<Bytes>| async move {
        Ok(Response::new(r.into_inner()))
    })
}

fn path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("topspin-{name}-{}.sock", std::process::id()))
}

#[tokio::test]
async fn a_live_servers_socket_is_neither_taken_over_nor_deleted() {
    let p = path("live");
    let _ = std::fs::remove_file(&p);
    let addr = format!("unix://{}", p.display());
    let first = builder().bind(addr.as_str()).await.expect("first bind");
    let first_stop = first.shutdown_handle();
    tokio::spawn(first.serve());

    let second = builder().bind(addr.as_str()).await;
    let err = second.expect_err("a second server must not take over a live socket");
    assert!(err.to_string().contains("in use"), "{err}");

    // The first server still answers on its path.
    let ch = Channel::connect(addr.as_str()).await.expect("connect");
    let r = ch
        .unary(RawCodec, "/t.S/Echo", Bytes::from_static(b"hi"))
        .await;
    assert_eq!(r.expect("served").into_inner(), Bytes::from_static(b"hi"));
    first_stop.shutdown(Duration::from_secs(1)).await;
    assert!(
        !p.exists(),
        "the server removes its own socket file on shutdown"
    );
}

#[tokio::test]
async fn a_stale_socket_file_is_replaced() {
    let p = path("stale");
    let _ = std::fs::remove_file(&p);
    // A socket file that nothing listens on any more (a crashed server's).
    drop(std::os::unix::net::UnixListener::bind(&p).expect("stale socket"));
    assert!(p.exists());
    let addr = format!("unix://{}", p.display());
    let server = builder()
        .bind(addr.as_str())
        .await
        .expect("replaces the stale file");
    let stop = server.shutdown_handle();
    tokio::spawn(server.serve());
    let ch = Channel::connect(addr.as_str()).await.expect("connect");
    assert!(ch.unary(RawCodec, "/t.S/Echo", Bytes::new()).await.is_ok());
    stop.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn shutting_down_never_deletes_another_servers_socket() {
    let p = path("replaced");
    let _ = std::fs::remove_file(&p);
    let addr = format!("unix://{}", p.display());
    let first = builder().bind(addr.as_str()).await.expect("first bind");
    // Someone removes the first server's file and another server binds the path.
    std::fs::remove_file(&p).expect("remove");
    let second = builder().bind(addr.as_str()).await.expect("second bind");
    let second_stop = second.shutdown_handle();
    tokio::spawn(second.serve());
    drop(first); // the first server goes away
    assert!(
        p.exists(),
        "the first server deleted the second one's socket"
    );
    let ch = Channel::connect(addr.as_str()).await.expect("connect");
    assert!(ch.unary(RawCodec, "/t.S/Echo", Bytes::new()).await.is_ok());
    second_stop.shutdown(Duration::from_secs(1)).await;
}
