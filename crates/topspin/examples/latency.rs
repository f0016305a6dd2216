//! Latency of a 20-byte unary echo over TCP and a Unix socket, beside a raw blocking-socket echo
//! measured in the same run (the kernel's floor): `cargo run --release -p topspin --example latency`
//! (`-- --help` for the options).
//!
//! The server and client share the process, on loopback, as in the published RPC comparisons.
//! Rounds alternate raw and topspin so drift on a noisy machine hits both.

use bytes::Bytes;
use std::io::{Read, Write};
use std::time::{Duration, Instant};
use topspin::codec::RawCodec;
use topspin::{Channel, Request, Response, Server};

const PAYLOAD: &[u8; 20] = b"twenty-byte-payload!";

/// Latency of a 20-byte unary echo over TCP and a Unix socket, topspin against a raw
/// blocking-socket echo measured in the same run.
#[derive(clap::Parser, Debug)]
#[command(name = "latency")]
struct Args {
    /// Calls per system, after 2000 of warm-up (run in four alternating rounds)
    #[arg(default_value_t = 20_000)]
    rounds: usize,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A raw echo: blocking sockets, 4-byte length prefix, server on its own thread.
fn raw_echo<S: Read + Write + Send + 'static>(
    mut client: S,
    mut server: S,
    rounds: usize,
) -> Vec<Duration> {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1024];
        loop {
            let mut len = [0u8; 4];
            if server.read_exact(&mut len).is_err() {
                return;
            }
            let n = u32::from_le_bytes(len) as usize;
            if server.read_exact(&mut buf[..n]).is_err() {
                return;
            }
            let mut out = len.to_vec();
            out.extend_from_slice(&buf[..n]);
            if server.write_all(&out).is_err() {
                return;
            }
        }
    });
    let mut msg = (PAYLOAD.len() as u32).to_le_bytes().to_vec();
    msg.extend_from_slice(PAYLOAD);
    let mut back = vec![0u8; msg.len()];
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        client.write_all(&msg).unwrap();
        client.read_exact(&mut back).unwrap();
        times.push(t.elapsed());
    }
    assert_eq!(back, msg);
    times
}

fn raw_tcp(rounds: usize) -> Vec<Duration> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    c.set_nodelay(true).unwrap();
    s.set_nodelay(true).unwrap();
    raw_echo(c, s, rounds)
}

fn raw_uds(rounds: usize) -> Vec<Duration> {
    let (c, s) = std::os::unix::net::UnixStream::pair().unwrap();
    raw_echo(c, s, rounds)
}

async fn topspin_calls(ch: &Channel, rounds: usize) -> Vec<Duration> {
    let msg = Bytes::from_static(PAYLOAD);
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let r = ch
            .unary(RawCodec, "/echo.Echo/Echo", Request::new(msg.clone()))
            .await
            .unwrap();
        times.push(t.elapsed());
        assert_eq!(r.get_ref(), &msg);
    }
    times
}

fn report(name: &str, mut t: Vec<Duration>, floor: Option<Duration>) -> Duration {
    t.sort();
    let p50 = percentile(&t, 0.5);
    let ratio = floor.map_or("1.00 (floor)".to_string(), |f| {
        format!("{:.2}", p50.as_secs_f64() / f.as_secs_f64())
    });
    println!(
        "{name:<14} {:>8} calls  p50 {:>7.1} µs  p90 {:>7.1} µs  p99 {:>7.1} µs  ratio to raw {ratio}",
        t.len(),
        p50.as_secs_f64() * 1e6,
        percentile(&t, 0.9).as_secs_f64() * 1e6,
        percentile(&t, 0.99).as_secs_f64() * 1e6,
    );
    p50
}

fn main() {
    let Args { rounds } = clap::Parser::parse();
    // The server runs on its own runtime thread, the client on this one.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sock = std::env::temp_dir().join(format!("topspin-latency-{}.sock", std::process::id()));
    let mut addrs = Vec::new();
    for a in [
        "tcp://127.0.0.1:0".to_string(),
        format!("unix://{}", sock.display()),
    ] {
        let server = server_rt.block_on(async {
            Server::builder()
                .unary(
                    "/echo.Echo/Echo",
                    RawCodec,
                    |req: Request<Bytes>| async move { Ok(Response::new(req.into_inner())) },
                )
                .bind(a.as_str())
                .await
                .unwrap()
        });
        addrs.push(server.local_addr().clone());
        server_rt.spawn(server.serve());
    }
    let tcp = client_rt
        .block_on(Channel::connect(addrs[0].clone()))
        .unwrap();
    let uds = client_rt
        .block_on(Channel::connect(addrs[1].clone()))
        .unwrap();
    // Warm up.
    raw_tcp(2_000);
    raw_uds(2_000);
    client_rt.block_on(topspin_calls(&tcp, 2_000));
    client_rt.block_on(topspin_calls(&uds, 2_000));

    let (mut rt, mut ru, mut tt, mut tu) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let chunk = (rounds / 4).max(1);
    for _ in 0..4 {
        rt.extend(raw_tcp(chunk));
        tt.extend(client_rt.block_on(topspin_calls(&tcp, chunk)));
        ru.extend(raw_uds(chunk));
        tu.extend(client_rt.block_on(topspin_calls(&uds, chunk)));
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "20-byte unary echo, client and server in one process (load average: {})",
        load.split_whitespace().next().unwrap_or("?")
    );
    let floor_tcp = report("raw tcp", rt, None);
    report("topspin tcp", tt, Some(floor_tcp));
    let floor_uds = report("raw unix", ru, None);
    report("topspin unix", tu, Some(floor_uds));
    let _ = std::fs::remove_file(sock);
}
