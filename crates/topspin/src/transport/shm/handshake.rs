//! The shm handshake over the Unix socket: the client's hello (magic, ring size) and the
//! server's answer with the rings' memfd (`SCM_RIGHTS`), each side's checks of the other, and a
//! server's connection between accept and the hello ([`PendingShm`], its rings charged to the
//! memory budget before anything is read).

use super::*;

/// A server's connection between accept and the client's hello: the rings' largest charge is
/// already taken from the memory budget (a connection without room is refused at accept, before
/// anything is read).
#[derive(Debug)]
pub(crate) struct PendingShm {
    pub(super) sock: UnixStream,
    pub(super) charge: Charge,
    max_ring: usize,
}

impl PendingShm {
    /// Charges the largest rings a client may ask for ([`RING`]) to `budget`, or refuses.
    pub(crate) fn new(
        sock: UnixStream,
        budget: &std::sync::Arc<topspin_proto::MemoryBudget>,
    ) -> io::Result<PendingShm> {
        Self::with_max_ring(sock, budget, RING)
    }

    pub(super) fn with_max_ring(
        sock: UnixStream,
        budget: &std::sync::Arc<topspin_proto::MemoryBudget>,
        max_ring: usize,
    ) -> io::Result<PendingShm> {
        let len = HEADER + 2 * max_ring;
        if !budget.try_reserve(len) {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!(
                    "shm:// connection refused: the memory budget ({} bytes) has no room for its rings ({len} bytes)",
                    budget.limit()
                ),
            ));
        }
        let charge = Charge {
            budget: budget.clone(),
            bytes: len,
        };
        Ok(PendingShm {
            sock,
            charge,
            max_ring,
        })
    }

    /// The server side of the handshake: read the client's hello and memfd, check and map it,
    /// answer. The caller bounds the time (handshake timeout): a client that sends no hello
    /// holds nothing but its socket until then. The server never passes a descriptor, so
    /// nothing of its own is ever in flight to a client that does not read.
    pub(crate) async fn handshake(self) -> io::Result<ShmTransport> {
        let PendingShm {
            sock,
            charge,
            max_ring,
        } = self;
        sock.set_nonblocking(true)?;
        let sock = register(sock)?;
        let (hello, memfd) = read_hello(&sock, "the client").await?;
        Self::finish(sock.into_inner(), charge, max_ring, &hello, memfd)
    }

    pub(super) fn finish(
        sock: UnixStream,
        mut charge: Charge,
        max_ring: usize,
        hello: &[u8; HELLO_LEN],
        memfd: Option<OwnedFd>,
    ) -> io::Result<ShmTransport> {
        if hello[..8] != MAGIC {
            return Err(corrupt(
                "bad hello (not a topspin shm:// client, or another version)",
            ));
        }
        let ring = ring_of(hello);
        if !ring.is_power_of_two() || !(MIN_RING..=max_ring).contains(&ring) {
            return Err(corrupt(&format!(
                "ring size not a power of two in {MIN_RING}..={max_ring}"
            )));
        }
        let fd = memfd.ok_or_else(|| corrupt("hello without the shared-memory descriptor"))?;
        let len = HEADER + 2 * ring;
        let seals = rustix::fs::fcntl_get_seals(&fd)
            .map_err(|_| corrupt("the shared descriptor is not a sealable memfd"))?;
        use rustix::fs::SealFlags;
        if !seals.contains(SealFlags::SHRINK | SealFlags::SEAL) {
            return Err(corrupt(
                "the shared memfd is not sealed against shrinking and further seals",
            ));
        }
        if rustix::fs::fstat(&fd)?.st_size < len as i64 {
            return Err(corrupt("the shared memfd is smaller than its rings"));
        }
        let map = Mapping::new(&fd, len)?;
        // Give back what smaller rings do not use.
        charge.budget.release(charge.bytes - len);
        charge.bytes = len;
        send_hello_with(&sock, ring, None)?;
        let mut t = ShmTransport::new(map, ring, true, sock)?;
        t.owned = Some((fd, charge));
        Ok(t)
    }
}

/// The ring size field of a hello or answer.
pub(super) fn ring_of(hello: &[u8; HELLO_LEN]) -> usize {
    u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]) as usize
}

/// Creates, sizes, seals (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`: the server cannot
/// truncate it under the client, nor the client under the server) and maps the memfd of a
/// connection. Named `topspin-shm:<name>` (shown in `/proc/PID/maps` of both processes).
pub(super) fn create_rings(name: &str, ring: usize) -> io::Result<(OwnedFd, Mapping)> {
    use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};
    let len = HEADER + 2 * ring;
    // memfd names are at most 249 bytes; a longer endpoint name is cut (on a char edge).
    let mut label = format!("topspin-shm:{name}");
    if label.len() > 249 {
        let mut cut = 249;
        while !label.is_char_boundary(cut) {
            cut -= 1;
        }
        label.truncate(cut);
    }
    let fd = memfd_create(
        label.as_str(),
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    ftruncate(&fd, len as u64)?;
    fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    let map = Mapping::new(&fd, len)?;
    Ok((fd, map))
}

/// Sends a 16-byte hello (client, with `fd`) or answer (server, no descriptor). On a fresh
/// socket 16 bytes do not block.
pub(super) fn send_hello_with(
    sock: &UnixStream,
    ring: usize,
    fd: Option<&OwnedFd>,
) -> io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut hello = [0u8; HELLO_LEN];
    hello[..8].copy_from_slice(&MAGIC);
    hello[8..12].copy_from_slice(&(ring as u32).to_le_bytes());
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(fd) = fd {
        fds = [fd.as_fd()];
        if !cmsg.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::other("SCM_RIGHTS buffer too small"));
        }
    }
    let sent = sendmsg(
        sock,
        &[IoSlice::new(&hello)],
        &mut cmsg,
        SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
    )?;
    if sent != HELLO_LEN {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "shared-memory hello not sent whole",
        ));
    }
    Ok(())
}

/// Reads a 16-byte hello or answer, and the first descriptor that comes with it (any others
/// are closed). `who` names the peer in the error for an early close.
pub(super) async fn read_hello(
    sock: &AsyncFd<UnixStream>,
    who: &str,
) -> io::Result<([u8; HELLO_LEN], Option<OwnedFd>)> {
    let mut hello = [0u8; HELLO_LEN];
    let mut got = 0;
    let mut memfd: Option<OwnedFd> = None;
    while got < HELLO_LEN {
        let mut guard = sock.readable().await?;
        match guard.try_io(|s| recv_hello(s.get_ref(), &mut hello[got..], &mut memfd)) {
            Ok(Ok(0)) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{who} closed the connection during the shared-memory handshake"),
                ))
            }
            Ok(Ok(n)) => got += n,
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => {}
        }
    }
    Ok((hello, memfd))
}

/// Both sides' handshake over a socket pair, in place (the hello is already there when the
/// server reads): `a` serves, `b` is the client, with rings of `ring` bytes. Returns the
/// server, the client's socket (the answer read) and the client's mapping.
#[cfg(any(test, fuzzing))]
pub(super) fn handshake_pair(
    a: UnixStream,
    b: UnixStream,
    ring: usize,
    budget: &std::sync::Arc<topspin_proto::MemoryBudget>,
) -> io::Result<(ShmTransport, UnixStream, Mapping)> {
    let (fd, map) = create_rings("unit", ring)?;
    send_hello_with(&b, ring, Some(&fd))?;
    let pending = PendingShm::with_max_ring(a, budget, ring)?;
    pending.sock.set_nonblocking(true)?;
    let mut hello = [0u8; HELLO_LEN];
    let mut memfd = None;
    if recv_hello(&pending.sock, &mut hello, &mut memfd)? != HELLO_LEN {
        return Err(corrupt("short hello"));
    }
    let server = PendingShm::finish(pending.sock, pending.charge, ring, &hello, memfd)?;
    b.set_nonblocking(true)?;
    let mut answer = [0u8; HELLO_LEN];
    let mut passed = None;
    if recv_hello(&b, &mut answer, &mut passed)? != HELLO_LEN || passed.is_some() {
        return Err(corrupt("bad answer"));
    }
    Ok((server, b, map))
}

/// One `recvmsg` of the hello: bytes into `buf`, a descriptor (the first one only; any
/// others are closed) into `memfd`.
pub(super) fn recv_hello(
    s: &UnixStream,
    buf: &mut [u8],
    memfd: &mut Option<OwnedFd>,
) -> io::Result<usize> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let r = recvmsg(
        s,
        &mut [io::IoSliceMut::new(buf)],
        &mut cmsg,
        RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
    )?;
    for msg in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = msg {
            for fd in fds {
                if memfd.is_none() {
                    *memfd = Some(fd);
                } // else dropped: closed
            }
        }
    }
    Ok(r.bytes)
}

/// The shared-memory transport's dial (`shm://name`): its socket, the hello and the rings,
/// within the handshake timeout; then the native protocol over the rings.
pub(crate) async fn dial<S: crate::transport::Start>(
    d: &crate::transport::Dial<'_>,
    name: &str,
    start: S,
) -> Result<S::Conn, crate::Status> {
    let shm = ShmTransport::connect(name, d.config.local_users());
    let t = d.within("connect and shared-memory handshake", shm).await?;
    start.native(t).await
}

impl PendingShm {
    /// The shared-memory transport's accept: the client's hello within `timeout`, then
    /// `serve`. A hello that does not come, or is refused, ends the connection (logged).
    pub(crate) async fn accept<S: crate::transport::Serve>(self, timeout: Duration, serve: S) {
        match tokio::time::timeout(timeout, self.handshake()).await {
            Ok(Ok(t)) => serve.native(t).await,
            Ok(Err(e)) => tracing::debug!("a shm:// handshake failed: {e}"),
            Err(_) => tracing::debug!("a shm:// client sent no hello within the handshake timeout"),
        }
    }
}
