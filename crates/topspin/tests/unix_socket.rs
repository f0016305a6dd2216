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

#[test]
fn servers_starting_at_once_on_a_stale_path_do_not_race() {
    let p = path("race");
    let addr = format!("unix://{}", p.display());
    for round in 0..50 {
        let _ = std::fs::remove_file(&p);
        drop(std::os::unix::net::UnixListener::bind(&p).expect("stale socket"));
        // Eight servers, on threads of their own, bind the stale path at once: exactly one
        // wins, and its socket is not deleted by one that found the path stale a moment
        // earlier (without the lock, a loser removes the winner's fresh socket and binds).
        let start = std::sync::Arc::new(std::sync::Barrier::new(8));
        let binds: Vec<_> = (0..8)
            .map(|_| {
                let (addr, start) = (addr.clone(), start.clone());
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("runtime");
                    start.wait();
                    let bound = rt.block_on(builder().bind(addr.as_str()));
                    (bound, rt)
                })
            })
            .collect();
        // Every server is kept until all have tried.
        let results: Vec<_> = binds
            .into_iter()
            .map(|b| b.join().expect("bind thread"))
            .collect();
        let mut winners = 0;
        for (bound, _) in &results {
            match bound {
                Ok(_) => winners += 1,
                Err(e) => assert!(e.to_string().contains("in use"), "round {round}: {e}"),
            }
        }
        assert_eq!(winners, 1, "round {round}: exactly one server binds");
        assert!(p.exists(), "round {round}: the winner's socket is there");
        for (bound, rt) in results {
            let _guard = rt.enter();
            drop(bound);
        }
        assert!(!p.exists(), "round {round}: the winner removed its socket");
        let mut lock = p.as_os_str().to_owned();
        lock.push(".lock");
        assert!(
            !std::path::Path::new(&lock).exists(),
            "the lock file is removed once bound"
        );
    }
}

/// Takes `<p>.lock` the way another server would.
fn hold_lock(p: &std::path::Path) -> std::fs::File {
    let mut lock = p.as_os_str().to_owned();
    lock.push(".lock");
    let f = std::fs::File::create(&lock).expect("lock file");
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).expect("flock");
    f
}

#[tokio::test]
async fn a_bind_waits_for_the_lock_and_names_it_if_it_stays_held() {
    let p = path("locked");
    let _ = std::fs::remove_file(&p);
    let addr = format!("unix://{}", p.display());

    // Another server is in the middle of binding: this one waits for it…
    let holder = hold_lock(&p);
    let bind = tokio::spawn({
        let addr = addr.clone();
        async move { builder().bind(addr.as_str()).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!bind.is_finished() && !p.exists(), "it waits for the lock");
    drop(holder);
    let server = bind
        .await
        .expect("task")
        .expect("bound once the lock was released");
    drop(server);
    assert!(!p.exists());

    // …but not forever: a lock held for long is an error that names it.
    let _holder = hold_lock(&p);
    let err = builder()
        .bind(addr.as_str())
        .await
        .expect_err("the lock stays held");
    assert!(err.to_string().contains(".lock"), "{err}");
    assert!(!p.exists(), "nothing was bound");
    let mut lock = p.into_os_string();
    lock.push(".lock");
    let _ = std::fs::remove_file(lock);
}

#[tokio::test]
async fn the_socket_file_gets_the_configured_permissions() {
    use std::os::unix::fs::PermissionsExt;
    for (mode, want) in [(None, 0o660), (Some(0o600), 0o600), (Some(0o666), 0o666)] {
        let p = path(&format!("mode{want:o}"));
        let _ = std::fs::remove_file(&p);
        let mut b = builder();
        if let Some(m) = mode {
            b = b.config(topspin::Config::default().with_unix_socket_mode(m));
        }
        let server = b
            .bind(format!("unix://{}", p.display()))
            .await
            .expect("bind");
        let got = std::fs::metadata(&p)
            .expect("socket file")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(got, want, "{mode:?}");
        drop(server);
    }
}

/// The effective uid of this process: the owner of a file it creates.
fn my_uid_gid() -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let p = path("uid");
    std::fs::write(&p, b"").expect("write");
    let m = std::fs::metadata(&p).expect("metadata");
    let _ = std::fs::remove_file(&p);
    (m.uid(), m.gid())
}

#[tokio::test]
async fn handlers_see_the_unix_peers_credentials() {
    let p = path("cred");
    let _ = std::fs::remove_file(&p);
    let server = Server::builder()
        .unary("/t.S/Who", RawCodec, |r: Request<Bytes>| async move {
            let c = r
                .peer_addr()
                .and_then(|a| a.credentials().copied())
                .ok_or_else(|| topspin::Status::internal("no credentials"))?;
            let who = format!("{} {} {}", c.uid, c.gid, c.pid.unwrap_or(-1));
            Ok(Response::new(Bytes::from(who)))
        })
        .bind(format!("unix://{}", p.display()))
        .await
        .expect("bind");
    let addr = server.local_addr().clone();
    let stop = server.shutdown_handle();
    tokio::spawn(server.serve());
    let ch = Channel::connect(addr).await.expect("connect");
    let who = ch
        .unary(RawCodec, "/t.S/Who", Bytes::new())
        .await
        .expect("call")
        .into_inner();
    let (uid, gid) = my_uid_gid();
    let want = format!("{uid} {gid} {}", std::process::id());
    assert_eq!(String::from_utf8_lossy(&who), want);
    stop.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn abstract_unix_addresses_need_no_file() {
    let name = format!("topspin-test-abstract-{}", std::process::id());
    let addr = format!("unix:@{name}");
    let server = builder().bind(addr.as_str()).await.expect("bind");
    assert_eq!(server.local_addr().to_string(), addr);
    let stop = server.shutdown_handle();
    let task = tokio::spawn(server.serve());
    assert!(!std::path::Path::new(&format!("@{name}")).exists());

    let ch = Channel::connect(addr.as_str()).await.expect("connect");
    let r = ch
        .unary(RawCodec, "/t.S/Echo", Bytes::from_static(b"abstract"))
        .await;
    assert_eq!(
        r.expect("served").into_inner(),
        Bytes::from_static(b"abstract")
    );

    // The name is taken while the server lives…
    let err = builder().bind(addr.as_str()).await.expect_err("in use");
    assert!(err.to_string().contains("in use"), "{err}");
    stop.shutdown(Duration::from_secs(1)).await;
    let _ = task.await;
    // …and free once it is gone.
    let again = builder().bind(addr.as_str()).await.expect("rebind");
    drop(again);
    // Nothing answers on a name nobody holds.
    let gone = Channel::connect(addr.as_str()).await;
    assert!(gone.is_err());
}
