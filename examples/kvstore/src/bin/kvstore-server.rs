//! Serves the key-value store (with server reflection) until Ctrl-C or SIGTERM, then drains:
//! calls in flight get 5 s.
//!
//! Usage: `kvstore-server [ADDRESS]` (default `tcp://127.0.0.1:50051`; port 0 picks one). Prints
//! `listening on ADDRESS` once it accepts connections.

use std::io::Write;
use std::time::Duration;

#[tokio::main]
async fn main() {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "tcp://127.0.0.1:50051".to_owned());
    let server = match kvstore::server_builder(kvstore::KvStore::default())
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
