//! A command-line client of the key-value store, using the generated `StoreClient`.
//!
//! ```text
//! kvstore-client ADDRESS get KEY
//! kvstore-client ADDRESS put KEY VALUE
//! kvstore-client ADDRESS delete KEY
//! kvstore-client ADDRESS watch [PREFIX]      prints changes until Ctrl-C
//! kvstore-client ADDRESS apply KEY=VALUE...  one client stream of puts
//! kvstore-client ADDRESS get-many KEY...     one bidirectional stream
//! ```

use clap::{Parser, Subcommand};
use futures_util::stream;
use kvstore::kv::{self, event::Kind, mutation::Op};
use topspin::{Request, Status};

/// A command-line client of the key-value store (the generated `StoreClient`).
#[derive(Parser, Debug)]
#[command(name = "kvstore-client")]
struct Args {
    /// The server: tcp://HOST:PORT, unix://PATH, ws://…
    address: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Prints KEY's value and version
    Get {
        #[arg(allow_hyphen_values = true)]
        key: String,
    },
    /// Sets KEY to VALUE; prints the new version
    Put {
        #[arg(allow_hyphen_values = true)]
        key: String,
        #[arg(allow_hyphen_values = true)]
        value: String,
    },
    /// Deletes KEY; prints `deleted` or `absent`
    Delete {
        #[arg(allow_hyphen_values = true)]
        key: String,
    },
    /// Prints the entries under PREFIX (default: all), then every change, until Ctrl-C
    Watch {
        #[arg(allow_hyphen_values = true)]
        prefix: Option<String>,
    },
    /// Puts every KEY=VALUE in one client stream
    Apply {
        #[arg(value_name = "KEY=VALUE", allow_hyphen_values = true)]
        pairs: Vec<String>,
    },
    /// Gets every KEY over one bidirectional stream
    GetMany {
        #[arg(value_name = "KEY", allow_hyphen_values = true)]
        keys: Vec<String>,
    },
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args.address, args.command).await {
        eprintln!("kvstore-client: {e}");
        std::process::exit(1);
    }
}

async fn run(address: &str, command: Command) -> Result<(), Status> {
    let client = kv::StoreClient::connect(address).await?;
    match command {
        Command::Get { key } => {
            let e = client
                .get(Request::new(kv::GetRequest { key }))
                .await?
                .into_inner();
            println!("{} = {} (version {})", e.key, e.value, e.version);
        }
        Command::Put { key, value } => {
            let put = kv::PutRequest {
                key,
                value,
                expected_version: None,
            };
            let r = client.put(Request::new(put)).await?.into_inner();
            println!("version {}", r.version);
        }
        Command::Delete { key } => {
            let r = client
                .delete(Request::new(kv::DeleteRequest { key }))
                .await?
                .into_inner();
            println!("{}", if r.existed { "deleted" } else { "absent" });
        }
        Command::Watch { prefix } => {
            let req = kv::WatchRequest {
                prefix: prefix.unwrap_or_default(),
                include_existing: true,
            };
            let mut events = client.watch(Request::new(req)).await?.into_inner();
            while let Some(event) = events.message().await? {
                match event.kind {
                    Some(Kind::Put(e)) => {
                        println!("put {} = {} (version {})", e.key, e.value, e.version)
                    }
                    Some(Kind::Deleted(k)) => println!("deleted {k}"),
                    None => {}
                }
            }
        }
        Command::Apply { pairs } => {
            let mut mutations = Vec::new();
            for kv in &pairs {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| Status::invalid_argument(format!("{kv:?} is not KEY=VALUE")))?;
                mutations.push(kv::Mutation {
                    op: Some(Op::Put(kv::PutRequest {
                        key: k.to_owned(),
                        value: v.to_owned(),
                        expected_version: None,
                    })),
                });
            }
            let r = client
                .apply(Request::new(stream::iter(mutations)))
                .await?
                .into_inner();
            println!("{} puts, {} deletes", r.puts, r.deletes);
        }
        Command::GetMany { keys } => {
            let keys: Vec<kv::GetRequest> =
                keys.into_iter().map(|key| kv::GetRequest { key }).collect();
            let mut entries = client
                .get_many(Request::new(stream::iter(keys)))
                .await?
                .into_inner();
            while let Some(e) = entries.message().await? {
                println!("{} = {} (version {})", e.key, e.value, e.version);
            }
        }
    }
    Ok(())
}
