//! Serves gRPC's interop `TestService` until Ctrl-C or SIGTERM.
//!
//! Usage: `topspin-interop-server [--port N | ADDRESS]` (default `tcp://127.0.0.1:0`; `--port`
//! as gRPC's interop servers take it, on 127.0.0.1). Prints `listening on ADDRESS` once it
//! accepts connections.

use std::io::Write;
use std::time::Duration;

fn address() -> Result<String, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => Ok("tcp://127.0.0.1:0".into()),
        [flag, port] if flag == "--port" => Ok(format!("tcp://127.0.0.1:{port}")),
        [a] if a.starts_with("--port=") => Ok(format!("tcp://127.0.0.1:{}", &a["--port=".len()..])),
        [a] if !a.starts_with('-') => Ok(a.clone()),
        _ => Err("usage: topspin-interop-server [--port N | ADDRESS]".into()),
    }
}

#[tokio::main]
async fn main() {
    let address = address().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2);
    });
    let server = match topspin_interop::server_builder()
        .bind(address.as_str())
        .await
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("topspin-interop-server: {e}");
            std::process::exit(1);
        }
    };
    println!("listening on {}", server.local_addr());
    let _ = std::io::stdout().flush();
    server
        .serve_with_shutdown(topspin::shutdown_signal(), Duration::from_secs(1))
        .await;
}
