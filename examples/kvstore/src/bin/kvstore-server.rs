//! Serves the key-value store (with server reflection) until Ctrl-C or SIGTERM, then drains:
//! calls in flight get 5 s.
//!
//! Usage: `kvstore-server [ADDRESS] [--allow-origin ORIGIN]...` (default
//! `tcp://127.0.0.1:50051`; port 0 picks one). Prints `listening on ADDRESS` once it accepts
//! connections. `--allow-origin` lets web pages of that origin (`http://localhost:*` for any
//! port) call it over `ws://`, besides pages the server itself serves.

use std::io::Write;
use std::time::Duration;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (mut address, mut origins) = (None, Vec::new());
    while let Some(a) = args.next() {
        if a == "--allow-origin" {
            let Some(o) = args.next() else {
                eprintln!("kvstore-server: --allow-origin needs an origin");
                std::process::exit(2);
            };
            origins.push(o);
        } else if address.is_none() {
            address = Some(a);
        } else {
            eprintln!("kvstore-server: unexpected argument {a}");
            std::process::exit(2);
        }
    }
    let address = address.unwrap_or_else(|| "tcp://127.0.0.1:50051".to_owned());
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
