//! One replica of the fault test: a topspin server (run with `ip netns exec`) that answers
//! `/netns.Replica/Call` with its name and appends each request's id to a log file before it
//! answers — the log survives SIGKILL, so the test can count every execution of every call.
//!
//! `netns-server --listen tcp://10.77.1.2:50051 --name s1 --log /tmp/x/s1.log`
//!
//! Health (`grpc.health.v1`, from `topspin-health`): SIGUSR1 turns the server `NOT_SERVING`,
//! SIGUSR2 `SERVING` again. SIGTERM or Ctrl-C: graceful shutdown (GOAWAY, 2 s grace).

use bytes::Bytes;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use topspin::codec::RawCodec;
use topspin::{Request, Response, Server, Status};

/// The replica's method.
const CALL: &str = "/netns.Replica/Call";

/// One replica of the netns fault test: answers `/netns.Replica/Call` with NAME after appending
/// the request's id to FILE. SIGUSR1: health NOT_SERVING, SIGUSR2: SERVING; SIGTERM or Ctrl-C:
/// graceful shutdown.
#[derive(clap::Parser, Debug)]
#[command(name = "netns-server")]
struct Args {
    /// Where to listen, e.g. tcp://10.77.1.2:50051
    #[arg(long, value_name = "ADDRESS")]
    listen: String,
    /// The name it answers with (s1, s2, …)
    #[arg(long)]
    name: String,
    /// The execution log: one `id.attempt` line per call run, written before the answer
    #[arg(long, value_name = "FILE")]
    log: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Args { listen, name, log } = clap::Parser::parse();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap_or_else(|e| {
            eprintln!("netns-server: cannot open {log}: {e}");
            std::process::exit(2)
        });
    let file = Arc::new(Mutex::new(file));
    let answer = Bytes::from(name.clone());
    let (health, reporter) = topspin_health::service();
    let server = Server::builder()
        .unary(CALL, RawCodec, move |req: Request<Bytes>| {
            let (file, answer) = (file.clone(), answer.clone());
            async move {
                // "id.attempt\n", written (O_APPEND, one write) before the answer leaves.
                let mut line = req.into_inner().to_vec();
                line.push(b'\n');
                let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
                f.write_all(&line)
                    .map_err(|e| Status::internal(format!("log: {e}")))?;
                Ok(Response::new(answer))
            }
        })
        .add_service(health)
        .bind(listen.as_str())
        .await
        .unwrap_or_else(|e| {
            eprintln!("netns-server {name}: bind {listen}: {e}");
            std::process::exit(1)
        });
    let (mut usr1, mut usr2) = match (
        signal(SignalKind::user_defined1()),
        signal(SignalKind::user_defined2()),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        _ => {
            eprintln!("netns-server: no signal handlers");
            std::process::exit(1)
        }
    };
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = usr1.recv() => reporter.set_not_serving(""),
                _ = usr2.recv() => reporter.set_serving(""),
            }
        }
    });
    server
        .serve_with_shutdown(topspin::shutdown_signal(), Duration::from_secs(2))
        .await;
}
