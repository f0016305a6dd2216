//! A real topspin `Server` (the runtime, not only the engine) fed arbitrary peer bytes over a
//! Unix socket, on a current-thread tokio runtime made for each input. The fuzzer's bytes
//! follow a valid preface and SETTINGS, so every input gets past the handshake. The server has
//! one method of each call kind, under the names the wire test vectors use, and small limits.
//!
//! Checks: nothing panics (a panic in any task aborts the process: libFuzzer's hook); what
//! the server sends is a preface and well-formed frames within the peer's MAX_FRAME_SIZE; the
//! server closes the connection once the peer has half-closed, and shuts down within 2 s; and
//! then its gauges are all back to zero (no connection, open call, unsent or reserved byte).
//!
//! Input layout, as `connection_input`'s (so its seeds serve here too): byte 0 = options
//! (bits 0..2: how many pieces the stream is written in, 1..8; bit 3: let the server run
//! its handlers before the peer half-closes), byte 1 = which peer SETTINGS to announce, then
//! the bytes that follow the peer's SETTINGS on the wire.
#![no_main]

use bytes::{Bytes, BytesMut};
use futures_util::stream;
use libfuzzer_sys::fuzz_target;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use topspin::codec::RawCodec;
use topspin::{
    Code, Config, GaugeSnapshot, MemoryBudget, Metadata, Request, Response, Server, Status,
    Streaming,
};
use topspin_proto::frame::{encode_settings, FrameDecoder};
use topspin_proto::preface::{PREFACE, PREFACE_LEN};
use topspin_proto::Settings;

/// How long the server has to close after the peer half-closed before it is shut down.
const CLOSE_WAIT: Duration = Duration::from_millis(100);

/// The server's limits: small, so that every limit is in reach of a short input.
fn config() -> Config {
    Config::default()
        .with_max_frame_size(16 * 1024)
        .with_max_concurrent_calls(8)
        .with_initial_call_window(64 * 1024)
        .with_max_message_size(256 * 1024)
        .with_max_metadata_size(4096)
        .with_max_send_buffer(256 * 1024)
        .with_handshake_timeout(Duration::from_millis(50))
        .with_frame_timeout(Duration::from_millis(50))
        .with_memory_budget(MemoryBudget::new(4 << 20))
}

fn peer_settings(choice: u8) -> Settings {
    match choice % 3 {
        0 => Settings::default(),
        1 => Settings::default()
            .with_max_frame_size(16 * 1024)
            .with_max_concurrent_calls(2)
            .with_initial_call_window(100)
            .with_max_message_size(40 * 1024)
            .with_max_metadata_size(64),
        _ => Settings::default()
            .with_max_concurrent_calls(0)
            .with_initial_call_window(0)
            .with_max_message_size(0)
            .with_max_metadata_size(0),
    }
}

/// One method of each kind, named as in `testdata/vectors` (whose sessions seed the corpus).
fn server() -> topspin::ServerBuilder {
    Server::builder()
        .config(config())
        .unary("/p.S/M", RawCodec, |req: Request<Bytes>| async move {
            Ok(Response::new(req.into_inner()))
        })
        .unary(
            "/helloworld.Greeter/SayHello",
            RawCodec,
            |req: Request<Bytes>| async move {
                let md = Metadata::builder().text("x", "y").map(|b| b.build());
                let md = md.unwrap_or_default();
                Ok(Response::new(req.into_inner())
                    .with_metadata(md.clone())
                    .with_trailers(md))
            },
        )
        .unary(
            "/kv.Store/Get",
            RawCodec,
            |req: Request<Bytes>| async move {
                Err::<Response<Bytes>, _>(
                    Status::new(
                        Code::NotFound,
                        String::from_utf8_lossy(req.get_ref()).into_owned(),
                    )
                    .with_details(Bytes::from_static(b"details")),
                )
            },
        )
        .unary("/p.S/Big", RawCodec, |_req: Request<Bytes>| async move {
            Ok(Response::new(Bytes::from(vec![7u8; 100 * 1024])))
        })
        // Server streaming: the request, (first byte % 8) times.
        .server_streaming("/p.S/A", RawCodec, |req: Request<Bytes>| async move {
            let m = req.into_inner();
            let n = m.first().map_or(1, |b| usize::from(*b % 8));
            Ok(Response::new(stream::iter(
                (0..n).map(move |_| Ok(m.clone())),
            )))
        })
        // Client streaming: how many bytes came.
        .client_streaming(
            "/p.S/B",
            RawCodec,
            |req: Request<Streaming<Bytes>>| async move {
                let mut s = req.into_inner();
                let mut total = 0usize;
                while let Some(m) = s.message().await? {
                    total += m.len();
                }
                Ok(Response::new(Bytes::from(total.to_string())))
            },
        )
        // Bidirectional: echo each message.
        .streaming(
            "/chat.Chat/Talk",
            RawCodec,
            |req: Request<Streaming<Bytes>>| async move { Ok(Response::new(req.into_inner())) },
        )
}

/// Checks what the server sent: its preface, then frames within the peer's limit (a partial
/// frame at the end is fine: the server may close mid-write).
fn check_output(out: &[u8], peer: &Settings) {
    if out.len() < PREFACE_LEN {
        return;
    }
    assert_eq!(&out[..PREFACE_LEN], &PREFACE[..], "the server's preface");
    let mut buf = BytesMut::from(&out[PREFACE_LEN..]);
    let mut dec = FrameDecoder::new(peer.max_frame_size());
    loop {
        match dec.decode(&mut buf) {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => panic!("the server sent an invalid frame: {e}"),
        }
    }
}

fn socket_path() -> std::path::PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("topspin-fuzz-{}-{n}.sock", std::process::id()))
}

async fn run(data: &[u8]) {
    let (opts, choice, rest) = match data {
        [o, c, rest @ ..] => (*o, *c, rest),
        _ => (0, 0, data),
    };
    let pieces = 1 + usize::from(opts & 7);
    let settle = opts & 8 != 0;
    let peer = peer_settings(choice);

    let path = socket_path();
    let server = server()
        .bind(format!("unix://{}", path.display()))
        .await
        .expect("bind a fresh Unix socket");
    let gauges = server.gauges();
    let handle = server.shutdown_handle();
    let serving = tokio::spawn(server.serve());

    let sock = UnixStream::connect(&path).await.expect("connect");
    let (mut rd, mut wr) = sock.into_split();
    let reader = tokio::spawn(async move {
        let mut out = Vec::new();
        let _ = rd.read_to_end(&mut out).await;
        out
    });

    let mut input = BytesMut::new();
    input.extend_from_slice(&PREFACE);
    encode_settings(&mut input, &peer);
    input.extend_from_slice(rest);
    let step = input.len().div_ceil(pieces).max(1);
    for piece in input.chunks(step) {
        if wr.write_all(piece).await.is_err() {
            break; // the server closed (a protocol error)
        }
        tokio::task::yield_now().await;
    }
    if settle {
        // Let the server's handlers run (each yield also polls the sockets).
        for _ in 0..32 {
            tokio::task::yield_now().await;
        }
    }
    let _ = wr.shutdown().await;

    // The peer has half-closed: the server ends its calls and closes.
    let out = match tokio::time::timeout(CLOSE_WAIT, reader).await {
        Ok(Ok(out)) => Some(out),
        Ok(Err(e)) => panic!("reader task: {e}"),
        Err(_) => None, // slow machine, or a server that keeps a closed peer: shut it down
    };
    drop(wr);
    tokio::time::timeout(Duration::from_secs(2), handle.shutdown(Duration::ZERO))
        .await
        .expect("the server shuts down within 2 s");
    tokio::time::timeout(Duration::from_secs(2), serving)
        .await
        .expect("the serve task ends")
        .expect("the serve task does not panic");
    let g: GaugeSnapshot = gauges.snapshot();
    assert_eq!(
        (
            g.connections,
            g.open_calls,
            g.unsent_bytes,
            g.reserved_bytes
        ),
        (0, 0, 0, 0),
        "gauges after the server stopped: {g:?}"
    );
    if let Some(out) = out {
        check_output(&out, &peer);
    }
    let _ = std::fs::remove_file(&path);
}

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(run(data));
});
