//! Serves the key-value store (with server reflection) until Ctrl-C or SIGTERM, then drains:
//! calls in flight get 5 s.
//!
//! Usage: `kvstore-server [ADDRESS] [--allow-origin ORIGIN]...` (default
//! `tcp://127.0.0.1:50051`; port 0 picks one). Prints `listening on ADDRESS` once it accepts
//! connections. `--allow-origin` lets web pages of that origin (`http://localhost:*` for any
//! port) call it over `ws://`, besides pages the server itself serves.

use clap::Parser;
use std::io::Write;
use std::time::Duration;

/// Serves the key-value store (with server reflection and health) until Ctrl-C or SIGTERM,
/// then drains: calls in flight get 5 s. Prints `listening on ADDRESS` once it accepts
/// connections.
#[derive(Parser, Debug)]
#[command(name = "kvstore-server")]
struct Args {
    /// Where to listen: tcp://HOST:PORT (port 0 picks one), unix://PATH, ws://HOST:PORT/PATH…
    #[arg(default_value = "tcp://127.0.0.1:50051")]
    address: String,
    /// Lets web pages of ORIGIN call it over ws:// (`http://localhost:*` for any port), besides
    /// pages the server itself serves; repeatable
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    origins: Vec<String>,
}

#[tokio::main]
async fn main() {
    let Args { address, origins } = Args::parse();
    let ws = topspin::ws::WebSocketSettings::default().allow_origins(origins);
    let server = match kvstore::server_builder(kvstore::KvStore::default())
        .websocket(ws)
        .bind(address.as_str())
        .await
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kvstore-server: {e}");
            std::process::exit(1);
        }
    };
    println!("listening on {}", server.local_addr());
    let _ = std::io::stdout().flush();
    server
        .serve_with_shutdown(topspin::shutdown_signal(), Duration::from_secs(5))
        .await;
}
