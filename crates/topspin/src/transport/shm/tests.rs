use super::*;

/// A transport pair over a socketpair, with a small ring.
fn pair(ring: usize) -> (ShmTransport, ShmTransport) {
    let (a, b) = UnixStream::pair().unwrap();
    let budget = topspin_proto::MemoryBudget::unlimited();
    let (server, b, map) = handshake_pair(a, b, ring, &budget).unwrap();
    let client = ShmTransport::new(map, ring, false, b).unwrap();
    (server, client)
}

#[tokio::test]
async fn bytes_wrap_around_the_ring() {
    let (mut s, mut c) = pair(4096);
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
    let mut got = BytesMut::with_capacity(20_000);
    let mut sent = 0;
    while got.len() < data.len() {
        if sent < data.len() {
            let end = (sent + 1500).min(data.len());
            let n = std::future::poll_fn(|cx| {
                c.poll_write_vectored(cx, &[IoSlice::new(&data[sent..end])])
            })
            .await
            .unwrap();
            sent += n;
        }
        std::future::poll_fn(|cx| s.poll_read(cx, &mut got))
            .await
            .unwrap();
    }
    assert_eq!(&got[..], &data[..]);
}

#[tokio::test]
async fn a_garbage_index_is_an_error() {
    let (mut s, c) = pair(4096);
    // The client's head claims more than a ring's worth.
    c.map.u64_at(C2S + HEAD).store(1 << 40, Ordering::Release);
    let mut buf = BytesMut::with_capacity(8192);
    let e = std::future::poll_fn(|cx| s.poll_read(cx, &mut buf))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    // And a tail ahead of what was written.
    c.map.u64_at(S2C + TAIL).store(1 << 40, Ordering::Release);
    let e = std::future::poll_fn(|cx| s.poll_write_vectored(cx, &[IoSlice::new(b"x")]))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
}

#[tokio::test]
async fn a_dropped_server_frees_the_pages_a_client_still_maps() {
    let (mut s, c) = pair(4096);
    let data = [0xabu8; 3000];
    std::future::poll_fn(|cx| s.poll_write_vectored(cx, &[IoSlice::new(&data)]))
        .await
        .unwrap();
    let mut seen = [MaybeUninit::new(0u8); 3000];
    c.map.read_ring(c.rx_base, c.ring, 0, &mut seen);
    // SAFETY: every element was initialised above.
    #[allow(unsafe_code)]
    let seen: [u8; 3000] = unsafe { std::mem::transmute(seen) };
    assert_eq!(seen, data);
    drop(s);
    let mut after = [MaybeUninit::new(1u8); 3000];
    c.map.read_ring(c.rx_base, c.ring, 0, &mut after);
    #[allow(unsafe_code)]
    let after: [u8; 3000] = unsafe { std::mem::transmute(after) };
    assert!(after.iter().all(|&b| b == 0), "the pages were freed");
}

#[test]
fn the_rings_are_charged_to_the_budget_and_given_back() {
    let one = HEADER + 2 * 4096;
    let budget = topspin_proto::MemoryBudget::new(3 * one);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _g = rt.enter();
    let mut kept = Vec::new();
    for _ in 0..3 {
        let (a, b) = UnixStream::pair().unwrap();
        kept.push(handshake_pair(a, b, 4096, &budget).unwrap());
    }
    assert_eq!(budget.used(), 3 * one);
    // Refused at accept, before anything is read.
    let (a, _b) = UnixStream::pair().unwrap();
    let e = PendingShm::with_max_ring(a, &budget, 4096).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::OutOfMemory);
    kept.pop();
    assert_eq!(budget.used(), 2 * one);
    drop(kept);
    assert_eq!(budget.used(), 0);
    // A pending connection holds the largest rings; smaller ones give the rest back.
    let budget = topspin_proto::MemoryBudget::new(HEADER + 2 * RING);
    let (a, b) = UnixStream::pair().unwrap();
    let (fd, _map) = create_rings("unit", 4096).unwrap();
    send_hello_with(&b, 4096, Some(&fd)).unwrap();
    let p = PendingShm::new(a, &budget).unwrap();
    assert_eq!(budget.used(), HEADER + 2 * RING);
    let t = rt.block_on(p.handshake()).unwrap();
    assert_eq!(budget.used(), one);
    drop(t);
    assert_eq!(budget.used(), 0);
}

/// What a hostile client can send as its hello: each is refused with a reason, and the
/// charge is given back.
#[test]
fn a_bad_client_hello_is_refused() {
    use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _g = rt.enter();
    let budget = topspin_proto::MemoryBudget::new(HEADER + 2 * RING);
    let memfd = |len: u64, seals: SealFlags| {
        let fd = memfd_create("unit", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        ftruncate(&fd, len).unwrap();
        if !seals.is_empty() {
            fcntl_add_seals(&fd, seals).unwrap();
        }
        fd
    };
    let sealed = SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL;
    let full = (HEADER + 2 * 4096) as u64;
    let mut wrong_magic = [0u8; HELLO_LEN];
    wrong_magic[..8].copy_from_slice(b"TSSHM\0\0\x01");
    let cases: Vec<(&str, Option<OwnedFd>, usize, bool)> = vec![
        ("another version", Some(memfd(full, sealed)), 4096, true),
        ("power of two", Some(memfd(full, sealed)), 5000, false),
        (
            "power of two",
            Some(memfd(HEADER as u64 + 4 * RING as u64, sealed)),
            2 * RING,
            false,
        ),
        ("power of two", Some(memfd(full, sealed)), 2048, false),
        ("without the shared-memory descriptor", None, 4096, false),
        (
            "not sealed",
            Some(memfd(full, SealFlags::empty())),
            4096,
            false,
        ),
        (
            "not sealed",
            Some(memfd(full, SealFlags::SHRINK)),
            4096,
            false,
        ),
        ("smaller", Some(memfd(full - 1, sealed)), 4096, false),
    ];
    for (want, fd, ring, old) in cases {
        let (a, b) = UnixStream::pair().unwrap();
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(if old { &wrong_magic[..8] } else { &MAGIC });
        hello[8..12].copy_from_slice(&(ring as u32).to_le_bytes());
        let p = PendingShm::new(a, &budget).unwrap();
        let e = PendingShm::finish(p.sock, p.charge, RING, &hello, fd).unwrap_err();
        assert!(e.to_string().contains(want), "{want}: {e}");
        assert_eq!(budget.used(), 0, "{want}: the charge is given back");
        // Nothing was answered: the connection just ends.
        let mut buf = [0u8; 16];
        let r = rustix::net::recv(&b, &mut buf, rustix::net::RecvFlags::DONTWAIT);
        assert!(matches!(r, Ok((0, _))), "{want}: {r:?}");
    }
}

#[test]
fn hostile_rounds_only_ever_produce_errors() {
    // Seeds of the fuzz target: garbage indices, ring bytes then reads, writes after a
    // bogus tail, a hang-up mid-way, and a pseudo-random walk.
    let mut seeds: Vec<Vec<u8>> = vec![
        vec![
            0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0,
        ],
        [
            vec![0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            vec![5; 12],
            vec![6; 12],
            vec![6; 12],
        ]
        .concat(),
        [
            vec![2, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0],
            vec![7; 12],
            vec![7; 12],
        ]
        .concat(),
        [vec![7; 12], vec![8; 12], vec![6; 12], vec![7; 12]].concat(),
    ];
    let mut x: u32 = 12345;
    for _ in 0..20 {
        let mut s = Vec::new();
        for _ in 0..240 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            s.push((x >> 16) as u8);
        }
        seeds.push(s);
    }
    for s in &seeds {
        fuzz_rounds(s);
    }
}
