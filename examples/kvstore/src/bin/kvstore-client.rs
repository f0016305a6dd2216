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

use futures_util::stream;
use kvstore::kv::{self, event::Kind, mutation::Op};
use topspin::{Request, Status};

const USAGE: &str = "usage: kvstore-client ADDRESS (get KEY | put KEY VALUE | delete KEY | watch [PREFIX] | apply KEY=VALUE... | get-many KEY...)";

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        eprintln!("{USAGE}");
        std::process::exit(2);
    }
    if let Err(e) = run(&args[0], &args[1], &args[2..]).await {
        eprintln!("kvstore-client: {e}");
        std::process::exit(1);
    }
}

async fn run(address: &str, command: &str, rest: &[String]) -> Result<(), Status> {
    let client = kv::StoreClient::connect(address).await?;
    let key = |i: usize| -> Result<String, Status> {
        rest.get(i)
            .cloned()
            .ok_or_else(|| Status::invalid_argument(USAGE))
    };
    match command {
        "get" => {
            let e = client
                .get(Request::new(kv::GetRequest { key: key(0)? }))
                .await?
                .into_inner();
            println!("{} = {} (version {})", e.key, e.value, e.version);
        }
        "put" => {
            let put = kv::PutRequest {
                key: key(0)?,
                value: key(1)?,
                expected_version: None,
            };
            let r = client.put(Request::new(put)).await?.into_inner();
            println!("version {}", r.version);
        }
        "delete" => {
            let r = client
                .delete(Request::new(kv::DeleteRequest { key: key(0)? }))
                .await?
                .into_inner();
            println!("{}", if r.existed { "deleted" } else { "absent" });
        }
        "watch" => {
            let req = kv::WatchRequest {
                prefix: rest.first().cloned().unwrap_or_default(),
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
        "apply" => {
            let mut mutations = Vec::new();
            for kv in rest {
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
        "get-many" => {
            let keys: Vec<kv::GetRequest> = rest
                .iter()
                .map(|k| kv::GetRequest { key: k.clone() })
                .collect();
            let mut entries = client
                .get_many(Request::new(stream::iter(keys)))
                .await?
                .into_inner();
            while let Some(e) = entries.message().await? {
                println!("{} = {} (version {})", e.key, e.value, e.version);
            }
        }
        _ => return Err(Status::invalid_argument(USAGE)),
    }
    Ok(())
}
