//! The Rust server of the cross-language matrix (`testdata/matrix/README.md`).
//!
//! Usage: `matrix-server [--tls-cert FILE --tls-key FILE] --listen ADDR [--listen ADDR]...`
//! with `tcp://127.0.0.1:0`, `unix:///path`, `ws://127.0.0.1:0/` (WebSocket upgrades from any
//! origin: the browser client comes from a page served elsewhere), and with the certificate
//! (PEM chain, PEM key) `tls://127.0.0.1:0` or `wss://127.0.0.1:0/`. Prints `listening ADDR` per listener, the port resolved,
//! and serves until SIGTERM or Ctrl-C, then exits 0 within 2 s.

use clap::Parser;
use std::io::Write;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(about = "The Rust server of the cross-language matrix (testdata/matrix)")]
struct Args {
    /// An address to serve on: tcp://HOST:PORT, unix:///PATH, ws://HOST:PORT/PATH, and with
    /// --tls-cert/--tls-key tls://HOST:PORT or wss://HOST:PORT/PATH (repeatable).
    #[arg(long = "listen", value_name = "ADDR", required = true)]
    listen: Vec<String>,
    /// The server's certificate chain (PEM, leaf first), for tls:// and wss:// listeners.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<String>,
    /// The certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<String>,
}

/// Calls in flight get this long after SIGTERM; the process is gone within 2 s whatever happens.
const GRACE: Duration = Duration::from_millis(1000);

#[tokio::main]
async fn main() {
    let args = Args::parse();
    matrix::install_tracing();
    let state = matrix::server::State::default();
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => match topspin::tls::ServerTls::from_pem_files(cert, key) {
            Ok(tls) => Some(tls),
            Err(e) => {
                eprintln!("matrix-server: --tls-cert {cert} --tls-key {key}: {e}");
                std::process::exit(1);
            }
        },
        _ => None,
    };
    let mut servers = Vec::new();
    for address in &args.listen {
        let ws = topspin::ws::WebSocketSettings::default().allow_any_origin();
        let mut builder = topspin::Server::builder().websocket(ws);
        // TLS settings only where the address is TLS: the runtime refuses them on a plain
        // tcp:// or ws:// address (they would be ignored there).
        let secure = address.starts_with("tls://") || address.starts_with("wss://");
        if let (Some(tls), true) = (&tls, secure) {
            builder = builder.tls(tls.clone());
        }
        let builder = builder.add_service(matrix::pb::MatrixServer::new(state.clone()));
        match builder.bind(address.as_str()).await {
            Ok(server) => servers.push(server),
            Err(e) => {
                eprintln!("matrix-server: cannot listen on {address}: {e}");
                std::process::exit(1);
            }
        }
    }
    let mut stdout = std::io::stdout().lock();
    for server in &servers {
        let _ = writeln!(stdout, "listening {}", server.local_addr());
    }
    let _ = stdout.flush();
    drop(stdout);

    let handles: Vec<_> = servers.iter().map(|s| s.shutdown_handle()).collect();
    let tasks: Vec<_> = servers
        .into_iter()
        .map(|s| tokio::spawn(s.serve()))
        .collect();
    topspin::shutdown_signal().await;
    // Whatever the drain does, the contract says: exit 0 within 2 s of SIGTERM.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(1800));
        std::process::exit(0);
    });
    let drains = handles.iter().map(|h| h.shutdown(GRACE));
    futures_util::future::join_all(drains).await;
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_millis(300), t).await;
    }
    std::process::exit(0);
}
