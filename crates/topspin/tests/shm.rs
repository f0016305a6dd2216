//! The shared-memory transport (`shm://name`, Linux): the four call kinds, a 16 MiB message
//! through a 2 MiB ring, many concurrent calls, peer death both ways (a child process killed
//! with SIGKILL), and hostile peers that write garbage into the shared header, answer badly,
//! send no hello or never read — a connection error, never a crash.
#![cfg(target_os = "linux")]

mod common;

use bytes::Bytes;
use common::*;
use futures_util::stream;
use std::io::{BufRead, BufReader, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use topspin::codec::RawCodec;
use topspin::{Address, Channel, Code, Request};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A name no other test (or test run) uses.
fn name(what: &str) -> String {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("t-{what}-{}-{n}", std::process::id())
}

async fn serve_shm(name: &str) -> TestServer {
    let server = serve_at(
        builder(Probe::default()),
        Transport::Shm,
        &format!("shm://{name}"),
    )
    .await;
    assert_eq!(server.addr, Address::Shm(name.to_owned()));
    server
}

/// How many topspin shared-memory mappings this process has.
/// This process's mappings of `name`'s shared memory (the memfd is named after the endpoint,
/// so other tests running at the same time do not count).
fn mappings(name: &str) -> usize {
    let me = format!("memfd:topspin-shm:{name} ");
    std::fs::read_to_string("/proc/self/maps")
        .expect("maps")
        .lines()
        .filter(|l| l.contains(&me))
        .count()
}

/// Waits (bounded) until `f` holds.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn the_four_call_kinds() {
    let server = serve_shm(&name("kinds")).await;
    let ch = within(10, server.channel()).await;
    // Unary, and the peer address carries the client's credentials.
    assert_eq!(unary(&ch, UNARY, "hello").await.unwrap(), bytes("hello"));
    let r = ch
        .unary(RawCodec, HEADERS, Request::new(Bytes::new()))
        .await
        .unwrap();
    let peer = r.metadata().get_str("peer").unwrap_or_default().to_owned();
    assert!(
        peer.starts_with(&format!("shm:(pid {}", std::process::id())),
        "{peer}"
    );
    // Server streaming.
    let mut s = ch
        .server_streaming(RawCodec, SERVER_STREAM, Request::new(bytes("100")))
        .await
        .unwrap()
        .into_inner();
    for i in 0..100 {
        assert_eq!(s.message().await.unwrap().unwrap(), bytes(&i.to_string()));
    }
    assert_eq!(s.message().await.unwrap(), None);
    // Client streaming.
    let parts = stream::iter(["a", "bc", "", "def"].map(bytes));
    let r = ch
        .client_streaming(RawCodec, CLIENT_STREAM, Request::new(parts))
        .await
        .unwrap();
    assert_eq!(r.into_inner(), bytes("abcdef"));
    // Bidirectional.
    let (tx, rx) = feed();
    let mut s = ch
        .streaming(RawCodec, BIDI, Request::new(rx))
        .await
        .unwrap()
        .into_inner();
    for i in 0..20 {
        tx.send(bytes(&i.to_string())).unwrap();
        assert_eq!(
            s.message().await.unwrap().unwrap(),
            bytes(&format!("echo:{i}"))
        );
    }
    drop(tx);
    assert_eq!(s.message().await.unwrap(), None);
    // A status with details and trailers.
    let e = unary(&ch, FAIL, "NOT_FOUND:gone").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    drop(ch);
    within(10, server.stop()).await;
}

#[tokio::test]
async fn a_16_mib_message_each_way_and_many_concurrent_calls() {
    let server = serve_shm(&name("big")).await;
    let ch = within(10, server.channel()).await;
    let big: Bytes = (0..16 << 20)
        .map(|i: u32| (i % 251) as u8)
        .collect::<Vec<_>>()
        .into();
    let r = within(30, ch.unary(RawCodec, UNARY, Request::new(big.clone())))
        .await
        .unwrap();
    assert!(r.into_inner() == big, "16 MiB echo differs");
    // 500 calls at once, mixed sizes (some larger than half the ring).
    let calls = (0..500).map(|i| {
        let ch = ch.clone();
        async move {
            let body: Bytes =
                vec![(i % 256) as u8; if i % 50 == 0 { 1_500_000 } else { i * 13 }].into();
            let got = ch
                .unary(RawCodec, UNARY, Request::new(body.clone()))
                .await
                .unwrap()
                .into_inner();
            assert!(got == body, "call {i}");
        }
    });
    within(60, futures_util::future::join_all(calls)).await;
    // Streams while unary calls run.
    let mut s = ch
        .server_streaming(RawCodec, SERVER_STREAM, Request::new(bytes("64:100000")))
        .await
        .unwrap()
        .into_inner();
    let mut n = 0;
    while let Some(m) = within(30, s.message()).await.unwrap() {
        assert_eq!(m.len(), 100_000);
        n += 1;
    }
    assert_eq!(n, 64);
    drop((ch, s));
    within(10, server.stop()).await;
}

/// Limits apply as on a socket: a request over the server's `max_message_size` (larger than
/// the ring, too) fails alone, and the connection goes on.
#[tokio::test]
async fn limits_apply_as_on_sockets() {
    let name = name("limits");
    let server = builder(Probe::default())
        .config(topspin::Config::default().with_max_message_size(3 << 20))
        .bind(format!("shm://{name}"))
        .await
        .expect("bind");
    let stop = server.shutdown_handle();
    tokio::spawn(server.serve());
    let ch = within(10, Channel::connect(format!("shm://{name}")))
        .await
        .unwrap();
    let big = Bytes::from(vec![1u8; 4 << 20]);
    let e = within(10, ch.unary(RawCodec, UNARY, Request::new(big)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert_eq!(unary(&ch, UNARY, "next").await.unwrap(), bytes("next"));
    drop(ch);
    within(10, stop.shutdown(Duration::from_secs(1))).await;
}

#[tokio::test]
async fn connecting_to_no_server_is_unavailable() {
    let e = Channel::connect(format!("shm://{}", name("nobody")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
}

// --- Peer death: a child process killed with SIGKILL ---------------------------------------

const CHILD: &str = "TOPSPIN_SHM_CHILD";

/// Not a test of its own: the child process of the peer-death tests (does nothing unless
/// `TOPSPIN_SHM_CHILD` is set). `server NAME`: serves `shm://NAME`; `client NAME`: starts a
/// Slow call. Prints `READY` when there, then waits to be killed (60 s at most).
#[test]
fn shm_child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let (role, name) = spec.split_once(' ').expect("ROLE NAME");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        match role {
            "server" => {
                let server = serve_shm(name).await;
                println!("READY");
                tokio::time::sleep(Duration::from_secs(60)).await;
                drop(server);
            }
            _ => {
                let ch = Channel::connect(format!("shm://{name}"))
                    .await
                    .expect("connect");
                assert_eq!(unary(&ch, UNARY, "x").await.unwrap(), bytes("x"));
                let slow = tokio::spawn(async move { unary(&ch, SLOW, "slow").await });
                tokio::time::sleep(Duration::from_millis(100)).await;
                println!("READY");
                tokio::time::sleep(Duration::from_secs(60)).await;
                drop(slow);
            }
        }
    });
}

/// Starts the child in `role` on `name` and waits for its `READY`.
fn child(role: &str, name: &str) -> Child {
    let exe = std::env::current_exe().expect("test binary");
    let mut c = Command::new(exe)
        .args(["--exact", "shm_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{role} {name}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let out = c.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.trim_end().ends_with("READY") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = c.kill();
        panic!("the {role} child never got ready");
    }
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_client_ends_its_connection_and_the_mapping_goes() {
    let name = name("client-dies");
    let probe = Probe::default();
    let server = builder(probe.clone())
        .bind(format!("shm://{name}"))
        .await
        .expect("bind");
    let stop = server.shutdown_handle();
    tokio::spawn(server.serve());
    let before = mappings(&name);
    let mut c = tokio::task::spawn_blocking({
        let name = name.clone();
        move || child("client", &name)
    })
    .await
    .unwrap();
    within(10, probe.started.notified()).await;
    assert_eq!(
        mappings(&name),
        before + 1,
        "the client's connection maps one memfd"
    );
    c.kill().expect("SIGKILL");
    let _ = c.wait();
    // The handler of its call in flight is cancelled, the connection ends, the mapping goes.
    within(10, probe.cancelled_notify.notified()).await;
    assert_eq!(probe.cancelled.lock().unwrap().as_slice(), ["slow"]);
    eventually("the dead client's mapping is unmapped", || {
        mappings(&name) == before
    })
    .await;
    // The server goes on serving.
    let ch = Channel::connect(format!("shm://{name}")).await.unwrap();
    assert_eq!(unary(&ch, UNARY, "on").await.unwrap(), bytes("on"));
    drop(ch);
    within(10, stop.shutdown(Duration::from_secs(1))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_fails_calls_unavailable_and_the_mapping_goes() {
    let name = name("server-dies");
    let before = mappings(&name);
    let mut c = tokio::task::spawn_blocking({
        let name = name.clone();
        move || child("server", &name)
    })
    .await
    .unwrap();
    let ch = within(10, Channel::connect(format!("shm://{name}")))
        .await
        .unwrap();
    assert_eq!(unary(&ch, UNARY, "up").await.unwrap(), bytes("up"));
    assert_eq!(mappings(&name), before + 1);
    let slow = tokio::spawn({
        let ch = ch.clone();
        async move { unary(&ch, SLOW, "slow").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.kill().expect("SIGKILL");
    let _ = c.wait();
    let e = within(10, slow).await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    let e = within(10, unary(&ch, UNARY, "again")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    eventually("the dead server's mapping is unmapped", || {
        mappings(&name) == before
    })
    .await;
}

// --- Hostile peers ------------------------------------------------------------------------

/// A raw client: connects to `shm://name`'s socket, sends the hello with a memfd of its own
/// and maps it.
struct RawClient {
    sock: UnixStream,
    map: *mut u8,
    len: usize,
}

/// A sealed memfd of `4096 + 2 × ring` bytes, mapped.
fn rings(ring: usize) -> (OwnedFd, *mut u8, usize) {
    let len = 4096 + 2 * ring;
    let fd = rustix::fs::memfd_create(
        "topspin-shm-test",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )
    .unwrap();
    rustix::fs::ftruncate(&fd, len as u64).unwrap();
    use rustix::fs::SealFlags;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
        .unwrap();
    // SAFETY: a fresh shared mapping of the memfd, which is `len` long and sealed.
    let map = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            &fd,
            0,
        )
    }
    .expect("mmap")
    .cast::<u8>();
    (fd, map, len)
}

/// Sends `hello` with `fd` attached, as a client does.
fn send_with(sock: &UnixStream, hello: &[u8; 16], fd: &OwnedFd) {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = rustix::net::SendAncillaryBuffer::new(&mut space);
    let fds = [fd.as_fd()];
    assert!(cmsg.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)));
    let n = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(hello)],
        &mut cmsg,
        rustix::net::SendFlags::empty(),
    )
    .unwrap();
    assert_eq!(n, 16);
}

/// Reads 16 bytes and reports whether a descriptor came with them.
fn recv_with(sock: &UnixStream) -> ([u8; 16], bool) {
    let mut got = [0u8; 16];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = rustix::net::RecvAncillaryBuffer::new(&mut space);
    let r = rustix::net::recvmsg(
        sock,
        &mut [std::io::IoSliceMut::new(&mut got)],
        &mut cmsg,
        rustix::net::RecvFlags::CMSG_CLOEXEC | rustix::net::RecvFlags::WAITALL,
    )
    .expect("recv");
    assert_eq!(r.bytes, 16);
    let passed = cmsg
        .drain()
        .any(|m| matches!(m, rustix::net::RecvAncillaryMessage::ScmRights(_)));
    (got, passed)
}

impl RawClient {
    fn connect(name: &str) -> RawClient {
        let addr = SocketAddr::from_abstract_name(format!("topspin-shm:{name}")).unwrap();
        let sock = UnixStream::connect_addr(&addr).expect("connect");
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let ring = 1 << 21;
        let (fd, map, len) = rings(ring);
        send_with(&sock, &hello(ring as u32), &fd);
        let (answer, passed) = recv_with(&sock);
        assert_eq!(answer, hello(ring as u32));
        assert!(!passed, "a server passes no descriptor");
        RawClient { sock, map, len }
    }

    /// Writes `v` at header offset `off` (as a hostile peer may).
    fn poke(&self, off: usize, v: u64) {
        assert!(off + 8 <= 4096);
        // SAFETY: inside the mapped header; the server reads it atomically, we write it once.
        unsafe {
            let p = self.map.add(off).cast::<std::sync::atomic::AtomicU64>();
            (*p).store(v, Ordering::SeqCst);
        }
    }

    /// Whether the server closed the socket (EOF) within the read timeout.
    fn closed_by_server(&self) -> bool {
        let mut b = [0u8; 64];
        loop {
            match rustix::net::recv(&self.sock, &mut b, rustix::net::RecvFlags::empty()) {
                Ok((0, _)) => return true,
                Ok(_) => continue, // wake bytes
                // Closed with our wake byte unread: a reset.
                Err(rustix::io::Errno::CONNRESET) => return true,
                Err(_) => return false, // the read timed out
            }
        }
    }
}

impl Drop for RawClient {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `connect`, once.
        let _ = unsafe { rustix::mm::munmap(self.map.cast(), self.len) };
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_writing_garbage_indices_gets_its_connection_closed() {
    let name = name("hostile-client");
    let server = serve_shm(&name).await;
    // The client → server direction's head (offset 0) claims 2^40 bytes; then the server →
    // client tail (offset 1024 + 128) runs ahead of what the server wrote.
    for off in [0usize, 1024 + 128] {
        let n = name.clone();
        let closed = tokio::task::spawn_blocking(move || {
            let c = RawClient::connect(&n);
            c.poke(off, 1 << 40);
            let _ = rustix::net::send(&c.sock, &[1], rustix::net::SendFlags::empty());
            c.closed_by_server()
        })
        .await
        .unwrap();
        assert!(
            closed,
            "the server did not close a connection with garbage at {off}"
        );
    }
    // It still serves well-behaved clients.
    let ch = server.channel().await;
    assert_eq!(unary(&ch, UNARY, "fine").await.unwrap(), bytes("fine"));
    drop(ch);
    within(10, server.stop()).await;
}

/// A client that floods wake bytes (and never writes into its ring) costs the server re-checks,
/// not its thread: on a current-thread runtime, another client is still served meanwhile.
#[tokio::test]
async fn a_client_flooding_wake_bytes_does_not_hold_the_server() {
    let name = name("flood");
    let server = serve_shm(&name).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = std::thread::spawn({
        let (name, stop) = (name.clone(), stop.clone());
        move || {
            let c = RawClient::connect(&name);
            let until = Instant::now() + Duration::from_secs(10);
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                let _ = rustix::net::send(&c.sock, &[1; 512], rustix::net::SendFlags::DONTWAIT);
            }
        }
    });
    let ch = within(10, server.channel()).await;
    for i in 0..200 {
        let body = i.to_string();
        assert_eq!(
            within(10, unary(&ch, UNARY, &body)).await.unwrap(),
            bytes(&body)
        );
    }
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    drop(ch);
    within(10, server.stop()).await;
}

/// A fake server on `shm://name`: takes one connection's hello and memfd, maps it, answers
/// `answer` (nothing when `None`), then does `then` with the socket and the mapping.
fn fake_server(
    name: &str,
    answer: Option<[u8; 16]>,
    then: impl FnOnce(UnixStream, *mut u8) + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let addr = SocketAddr::from_abstract_name(format!("topspin-shm:{name}")).unwrap();
    let l = UnixListener::bind_addr(&addr).expect("bind fake");
    std::thread::spawn(move || {
        let (s, _) = l.accept().expect("accept");
        let mut hello = [0u8; 16];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut cmsg = rustix::net::RecvAncillaryBuffer::new(&mut space);
        rustix::net::recvmsg(
            &s,
            &mut [std::io::IoSliceMut::new(&mut hello)],
            &mut cmsg,
            rustix::net::RecvFlags::CMSG_CLOEXEC | rustix::net::RecvFlags::WAITALL,
        )
        .expect("hello");
        let mut fd: Option<OwnedFd> = None;
        for m in cmsg.drain() {
            if let rustix::net::RecvAncillaryMessage::ScmRights(mut fds) = m {
                fd = fds.next();
            }
        }
        let fd = fd.expect("the client's memfd");
        let ring = u32::from_le_bytes(hello[8..12].try_into().unwrap()) as usize;
        let len = 4096 + 2 * ring;
        // SAFETY: a fresh shared mapping of the client's memfd, sealed and `len` long.
        let map = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .unwrap()
        .cast::<u8>();
        if let Some(answer) = answer {
            rustix::net::send(&s, &answer, rustix::net::SendFlags::empty()).unwrap();
        }
        then(s, map);
    })
}

fn hello(ring: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..8].copy_from_slice(b"TSSHM\0\0\x02");
    h[8..12].copy_from_slice(&ring.to_le_bytes());
    h
}

#[tokio::test]
async fn a_server_answering_another_version_or_ring_size_is_refused() {
    let mut old = hello(1 << 21);
    old[7] = 1;
    for (answer, want) in [
        (Some(old), "another version"),
        (Some(hello(1 << 16)), "ring size"),
        (
            None,
            "closed the connection during the shared-memory handshake",
        ),
    ] {
        let name = name("hostile-answer");
        let t = fake_server(&name, answer, |s, _| {
            std::thread::sleep(Duration::from_millis(300));
            drop(s);
        });
        let e = within(10, Channel::connect(format!("shm://{name}")))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unavailable);
        assert!(e.message().contains(want), "{want}: {e}");
        t.join().unwrap();
    }
}

/// A client that connects and sends no hello holds only its socket, until the handshake
/// timeout; clients that send theirs and never read the answer hold nothing of the server's
/// (it passes no descriptor: before version 2 each such client kept the server's memfd in
/// flight, charged to the server's user, until later clients failed with `ETOOMANYREFS`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_clients_are_cut_and_clients_that_never_read_hold_nothing() {
    let name = name("silent");
    let server = builder(Probe::default())
        .config(topspin::Config::default().with_handshake_timeout(Duration::from_millis(300)))
        .bind(format!("shm://{name}"))
        .await
        .expect("bind shm");
    let handle = server.shutdown_handle();
    tokio::spawn(server.serve());
    let n = name.clone();
    let (silent_cut, quiet) = tokio::task::spawn_blocking(move || {
        let addr = SocketAddr::from_abstract_name(format!("topspin-shm:{n}")).unwrap();
        let silent = UnixStream::connect_addr(&addr).expect("connect");
        silent
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        // 40 clients that send their hello and never read.
        let quiet: Vec<_> = (0..40)
            .map(|_| {
                let s = UnixStream::connect_addr(&addr).expect("connect");
                let (fd, map, len) = rings(1 << 16);
                send_with(&s, &hello(1 << 16), &fd);
                (s, fd, map as usize, len)
            })
            .collect();
        let start = Instant::now();
        let mut b = [0u8; 1];
        let r = rustix::net::recv(&silent, &mut b, rustix::net::RecvFlags::empty());
        (matches!(r, Ok((0, _))).then(|| start.elapsed()), quiet)
    })
    .await
    .unwrap();
    let took = silent_cut.expect("the silent client was closed, not timed out");
    assert!(took < Duration::from_millis(1300), "cut after {took:?}");
    // A later client connects and is served, the others still connected.
    let ch = within(10, Channel::connect(format!("shm://{name}")))
        .await
        .expect("a later client connects");
    assert_eq!(unary(&ch, UNARY, "later").await.unwrap(), "later");
    for (s, _, map, len) in &quiet {
        let (answer, passed) = recv_with(s);
        assert_eq!(answer, hello(1 << 16));
        assert!(!passed, "the server passed a descriptor");
        // SAFETY: the mapping made in `rings`, unmapped once.
        let _ = unsafe { rustix::mm::munmap(*map as *mut std::ffi::c_void, *len) };
    }
    drop(ch);
    handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_writing_a_garbage_head_fails_the_connection_not_the_process() {
    let name = name("hostile-server");
    let t = fake_server(&name, Some(hello(1 << 21)), |s, map| {
        // The server → client head (offset 1024) claims 2^40 bytes; wake the client.
        // SAFETY: inside the mapped header.
        unsafe {
            (*map.add(1024).cast::<std::sync::atomic::AtomicU64>()).store(1 << 40, Ordering::SeqCst)
        };
        let _ = rustix::net::send(&s, &[1], rustix::net::SendFlags::empty());
        std::thread::sleep(Duration::from_secs(2));
        drop(s);
    });
    let e = within(10, Channel::connect(format!("shm://{name}")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    t.join().unwrap();
}

/// Runs `script` in python3 as the user `nobody` (65534), or `None` when this process cannot
/// change user (not root): the local-user checks need a second user to be shown.
fn as_nobody(script: &str) -> Option<Child> {
    use std::os::unix::process::CommandExt;
    if topspin::LocalUsers::own_uid() != 0 {
        eprintln!("skipped: needs root to run a client as another user");
        return None;
    }
    let child = Command::new("python3")
        .args(["-c", script])
        .uid(65534)
        .gid(65534)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    Some(child)
}

/// A local user other than the server's own is refused on `shm://` (before the hello: it never
/// gets the memfd) and on `unix:@` (at once), unless the server allows it.
#[tokio::test]
async fn other_local_users_are_refused_unless_allowed() {
    for (scheme, allowed) in [
        ("shm", false),
        ("shm", true),
        ("unix", false),
        ("unix", true),
    ] {
        let n = name("users");
        let users = if allowed {
            topspin::LocalUsers::own_and([65534])
        } else {
            topspin::LocalUsers::Own
        };
        let (address, socket) = if scheme == "shm" {
            (format!("shm://{n}"), format!("topspin-shm:{n}"))
        } else {
            (format!("unix:@{n}"), n.clone())
        };
        let server = builder(Probe::default())
            .config(topspin::Config::default().with_local_users(users))
            .bind(address.as_str())
            .await
            .expect("bind");
        let handle = server.shutdown_handle();
        tokio::spawn(server.serve());
        // Connects to the abstract socket and prints how many bytes came before the server
        // closed or 2 s passed (a shm:// server waits for the client's hello, a native one
        // sends its preface).
        let script = format!(
            "import socket\n\
             s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n\
             s.connect('\\0{socket}')\n\
             s.settimeout(2)\n\
             try:\n    d = s.recv(64); print(len(d), 'eof' if not d else 'data')\n\
             except socket.timeout:\n    print(0, 'open')\n"
        );
        let Some(child) = as_nobody(&script) else {
            return;
        };
        let out = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .expect("python3 ran");
        let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        // Refused: closed before a byte. Allowed: kept open for the shm hello, or the native
        // server's preface and settings.
        let served = if scheme == "shm" {
            said == "0 open"
        } else {
            said.ends_with(" data")
        };
        assert_eq!(
            (said == "0 eof", served),
            (!allowed, allowed),
            "{address}, uid 65534 allowed: {allowed}: {said}"
        );
        // The server's own user is served all along.
        let ch = Channel::connect(address.as_str()).await.expect("own user");
        assert_eq!(unary(&ch, UNARY, "me").await.unwrap(), "me");
        handle.shutdown(Duration::from_secs(1)).await;
    }
}

/// A `shm://` client connects only to a server run by an allowed user: whoever binds the name
/// first would otherwise receive every client's calls.
#[tokio::test]
async fn a_shm_client_refuses_a_server_of_another_user() {
    let n = name("squatter");
    let script = format!(
        "import socket, time\n\
         s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n\
         s.bind('\\0topspin-shm:{n}'); s.listen(8); print('ready', flush=True)\n\
         c, _ = s.accept(); time.sleep(3)\n"
    );
    let Some(mut child) = as_nobody(&script) else {
        return;
    };
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let err = within(10, Channel::connect(format!("shm://{n}")))
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("uid 65534"), "{err}");
    let _ = child.kill();
    let _ = child.wait();
}
