//! Entry points for the fuzz targets in `fuzz/`, built only under `cargo fuzz` (which sets
//! `--cfg fuzzing`): parsers a peer reaches that are not public API — the gRPC face's wire
//! details (`grpc-timeout`, metadata from headers, the one message deframer, as both sides use it), the
//! WebSocket carriage and the shared-memory rings. Each panics on a broken invariant; a peer's bytes may only ever
//! produce errors.

use crate::grpc::wire;
use crate::{Encoding, MemoryBudget};
use bytes::Bytes;

/// Cuts `data` into pieces whose lengths come from `cuts` (never empty, at most 8).
fn pieces(data: &[u8], cuts: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut at = 0;
    for &c in cuts.iter().take(8) {
        let n = usize::from(c) * 7 + 1;
        if at + n >= data.len() {
            break;
        }
        out.push(Bytes::copy_from_slice(&data[at..at + n]));
        at += n;
    }
    out.push(Bytes::copy_from_slice(&data[at..]));
    out
}

/// gRPC wire parsing. Layout: byte 0 options (bits 0-1: the call's encoding: none, gzip,
/// zstd; bits 2-3: the message limit, 16 B to 16 KiB), bytes 1..9 where the body is cut, byte 9
/// the length of a `grpc-timeout` value, then that value, then the bodies' bytes; the same
/// bytes read as header lines (`name: value`) for the metadata.
pub fn grpc_wire(data: &[u8]) {
    if data.len() < 10 {
        return;
    }
    let opts = data[0];
    let encoding = [None, Some(Encoding::Gzip), Some(Encoding::Zstd), None][usize::from(opts & 3)];
    let limit = 16u32 << (3 * u32::from((opts >> 2) & 3));
    let cuts = &data[1..9];
    let tlen = usize::from(data[9]).min(data.len() - 10);
    let timeout = &data[10..10 + tlen];
    let body = &data[10 + tlen..];

    if let Ok(d) = wire::parse_timeout(timeout) {
        // What parses is within gRPC's 8 digits of hours.
        assert!(d.as_secs() <= 99_999_999 * 3600, "{d:?}");
    }

    let mut headers = http::HeaderMap::new();
    for line in body.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(&line[..colon]),
            http::HeaderValue::from_bytes(&line[colon + 1..]),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    let _ = wire::metadata_from_headers(&headers);
    let _ = wire::request_encoding(&headers);

    // The one deframer as the server's face uses it, charging a small budget: every message
    // within the limit, and nothing left charged once the deframer and its messages are gone.
    let budget = MemoryBudget::new(64 * 1024);
    {
        let mut d = wire::Deframer::new(4096, Some(budget.clone()));
        let mut held = Vec::new();
        'chunks: for chunk in pieces(body, cuts) {
            d.push(chunk);
            loop {
                match d.next(limit as usize, encoding) {
                    Ok(Some(r)) => {
                        assert!(r.message.len() <= limit as usize, "{}", r.message.len());
                        held.push(r.message);
                    }
                    Ok(None) => break,
                    Err(_) => break 'chunks,
                }
            }
            let _ = d.must_wait();
        }
    }
    assert_eq!(
        budget.used(),
        0,
        "the budget kept charges after everything was dropped"
    );
    grpc_client_deframer(body, cuts, limit as usize, encoding);
}

/// The one deframer as the client's gRPC mode uses it (a budget smaller than a message may
/// be, a 64 KiB window): every message within the limit; of each chunk, the credit of the
/// messages it completes is no more than its bytes, and what is left (released at once as an
/// incomplete message's) is nonzero exactly when a message is under way; the budget given back.
fn grpc_client_deframer(body: &[u8], cuts: &[u8], limit: usize, encoding: Option<Encoding>) {
    let budget = MemoryBudget::new(8 * 1024);
    {
        let mut d = wire::Deframer::new(65_535, Some(budget.clone()));
        let mut held = Vec::new();
        'chunks: for chunk in pieces(body, cuts) {
            let n = chunk.len();
            let mut credited = 0usize;
            d.push(chunk);
            loop {
                match d.next(limit, encoding) {
                    Ok(Some(r)) => {
                        assert!(r.message.len() <= limit, "{}", r.message.len());
                        assert!(r.credit <= r.wire_len, "{} > {}", r.credit, r.wire_len);
                        credited += r.credit;
                        held.push(r.message);
                    }
                    Ok(None) => break,
                    Err(_) => break 'chunks,
                }
            }
            assert!(
                credited <= n,
                "{credited} credited for a chunk of {n} bytes"
            );
            if n > 0 {
                assert_eq!(credited < n, !d.is_empty(), "{credited} of {n}");
            }
            let _ = d.must_wait();
        }
    }
    assert_eq!(budget.used(), 0, "the client's budget kept charges");
}

/// Client frames from the fuzzer's bytes: each is a head byte (FIN, RSV bits and opcode as on
/// the wire), a length byte (0..=253 as is; 254: the next byte × 1024; 255: a raw 2-byte
/// extended length) and that many payload bytes, masked as a client must (bit 0x40 of the
/// length byte set: left unmasked, a protocol error the server must survive).
fn client_frames(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let [head, len, rest @ ..] = data {
        let (n, rest) = match *len {
            254 => (
                usize::from(rest.first().copied().unwrap_or(0)) * 1024,
                rest.get(1..).unwrap_or(&[]),
            ),
            255 => match rest {
                [a, b, r @ ..] => (usize::from(u16::from_be_bytes([*a, *b])), r),
                _ => (0, rest),
            },
            l => (usize::from(l & 0x3f), rest),
        };
        let unmasked = *len < 254 && len & 0x40 != 0;
        let take = n.min(rest.len());
        let payload = &rest[..take];
        out.push(*head);
        let mask_bit = if unmasked { 0 } else { 0x80 };
        if take < 126 {
            out.push(mask_bit | take as u8);
        } else {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(take as u16).to_be_bytes());
        }
        if unmasked {
            out.extend_from_slice(payload);
        } else {
            let key = [0x37, 0xfa, 0x21, 0x3d];
            out.extend_from_slice(&key);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        }
        data = &rest[take..];
    }
    out
}

/// The WebSocket carriage of a server: an upgrade request (with or without a same-origin
/// `Origin`, chosen by byte 0; bit 1 of byte 0: the rest as raw bytes rather than built frames)
/// followed by the client's frames, read to their end on a current-thread runtime. Nothing may
/// panic; the read ends.
pub fn websocket(data: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some((&opts, rest)) = data.split_first() else {
        return;
    };
    let built;
    let frames: &[u8] = if opts & 2 == 0 {
        built = client_frames(rest);
        &built
    } else {
        rest
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(_) => return,
    };
    rt.block_on(async {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let origin = if opts & 1 == 1 {
            "Origin: http://h\r\n"
        } else {
            ""
        };
        let head = format!(
            "GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Protocol: topspin.v1\r\n{origin}\r\n"
        );
        let settings = crate::ws::WebSocketSettings::default().max_message_size(256 * 1024);
        let serve = async move {
            let Ok(mut ws) = settings.accept(server, "/").await else {
                return;
            };
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(Ok(n)) =
                tokio::time::timeout(std::time::Duration::from_millis(200), ws.read(&mut buf)).await
            {
                if n == 0 {
                    break;
                }
                assert!(n <= buf.len());
            }
        };
        let feed = async move {
            let _ = client.write_all(head.as_bytes()).await;
            let _ = client.write_all(frames).await;
            let _ = client.shutdown().await;
            let mut sink = Vec::new();
            let _ = tokio::time::timeout(
                std::time::Duration::from_millis(300),
                client.read_to_end(&mut sink),
            )
            .await;
        };
        tokio::join!(serve, feed);
    });
}

/// The shared-memory rings of a server against a hostile peer (its header words and ring
/// bytes, the server reading and writing between them): rounds as in
/// `transport::shm::fuzz_rounds`. Nothing may panic; bad indices are `InvalidData`.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn shm_ring(data: &[u8]) {
    crate::transport::shm::fuzz_rounds(data);
}
