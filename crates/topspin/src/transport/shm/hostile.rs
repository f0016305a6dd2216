//! A hostile peer against a server's rings, for the `shm_ring` fuzz target and a unit test
//! (built under `cfg(test)` or `cfg(fuzzing)` only).

use super::*;

/// One write of a hostile peer into the mapping: a word of its own in the header (`op` 0-4:
/// its head, its closed flag, its tail, the waiting flags) or bytes into its ring (5).
fn peer_writes(map: &Mapping, op: u8, w: u64, bytes: &[u8]) {
    match op {
        0 => map.u64_at(C2S + HEAD).store(w, Ordering::Release),
        1 => map.u32_at(C2S + CLOSED).store(w as u32, Ordering::Release),
        2 => map.u64_at(S2C + TAIL).store(w, Ordering::Release),
        3 => map
            .u32_at(S2C + READER_WAITING)
            .store(w as u32, Ordering::Release),
        4 => map
            .u32_at(C2S + WRITER_WAITING)
            .store(w as u32, Ordering::Release),
        _ => map.write_ring(HEADER, MIN_RING, w, bytes),
    }
}

/// A hostile peer against a server's rings, in rounds read from `data` (the fuzz target
/// `shm_ring`, and a unit test): each 12-byte round either writes a word of the peer's in the
/// header (its head, its closed flag, its tail, the waiting flags) or bytes into the ring it
/// produces, or has the server read or write once, or hangs up. Nothing may panic or touch
/// memory outside the mapping; what a peer's words can cause is an `InvalidData` error.
pub(crate) fn fuzz_rounds(data: &[u8]) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let _enter = rt.enter();
    let Ok((a, b)) = UnixStream::pair() else {
        return;
    };
    let budget = topspin_proto::MemoryBudget::unlimited();
    let Ok((mut server, b, _client_map)) = handshake_pair(a, b, MIN_RING, &budget) else {
        return;
    };
    let mut peer = Some(b);
    let waker = futures_util::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    // Fixed: two of the fuzzed ring's size, whatever the input (a read takes at most a ring).
    let mut buf = BytesMut::with_capacity(2 * MIN_RING);
    for round in data.chunks(12) {
        let (op, arg) = (round[0], &round[1..]);
        let mut word = [0u8; 8];
        word[..arg.len().min(8)].copy_from_slice(&arg[..arg.len().min(8)]);
        let w = u64::from_le_bytes(word);
        let result = match op % 9 {
            0..=5 => {
                peer_writes(&server.map, op % 9, w, arg);
                Ok(())
            }
            6 => {
                buf.clear();
                match server.poll_read(&mut cx, &mut buf) {
                    Poll::Ready(Ok(n)) => {
                        assert!(n <= buf.len());
                        Ok(())
                    }
                    Poll::Ready(Err(e)) => Err(e),
                    Poll::Pending => Ok(()),
                }
            }
            7 => match server.poll_write_vectored(&mut cx, &[IoSlice::new(arg)]) {
                Poll::Ready(Ok(n)) => {
                    assert!(n <= arg.len());
                    Ok(())
                }
                Poll::Ready(Err(e)) => Err(e),
                Poll::Pending => Ok(()),
            },
            _ => {
                peer = None; // the peer's process is gone
                Ok(())
            }
        };
        if let Err(e) = result {
            assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::InvalidData
                        | io::ErrorKind::BrokenPipe
                        | io::ErrorKind::UnexpectedEof
                ),
                "unexpected error kind: {e}"
            );
            break;
        }
    }
    drop(peer);
}
